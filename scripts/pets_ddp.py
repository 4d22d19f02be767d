"Oxford-IIIT Pets (vision): fine-tune a torchvision model data-parallel; the same script under every launcher and as one process"
import time
import fastddp
from fastai.vision.all import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.distrib import rank0_first # fastddp's: the others wait for rank 0 up to FASTDDP_FIRST_TIMEOUT, and share its error
from fastddp.data import PETS_RE
from fastddp.script import script_flags, positive, get_data, train_cbs, run_ctx, finish, run_main, ScriptError, offline_errors

def get_arch(name, pretrained, weights='DEFAULT'):
    "A torchvision classifier by name (its cut/split registered for fastai when `model_meta` lacks it) and its weights enum member"
    import torchvision.models as tvm
    if name not in tvm.list_models(module=tvm): raise ScriptError(f"--arch {name}: not a torchvision classification model")
    arch = getattr(tvm, name)
    # vision_learner knows the body cut and parameter groups only for archs in `model_meta`; others fail with a bare StopIteration
    if arch not in model_meta: model_meta[arch] = {'cut': -1, 'split': default_split, 'stats': imagenet_stats, 'weights': 'DEFAULT'}
    if not pretrained: return arch, None
    ws = tvm.get_model_weights(name)
    if weights not in ws.__members__: raise ScriptError(f"--weights {weights}: {name} has {', '.join(ws.__members__)}")
    w = ws[weights]
    # torchvision loads cached weights with no network; offline and not cached, name every file that would do
    fn = Path(torch.hub.get_dir())/'checkpoints'/Path(w.url).name
    if not fn.exists():
        try: torch.hub.load_state_dict_from_url(w.url, progress=False)
        except offline_errors as e:
            files = {Path(o.url).name: [k for k,v in ws.__members__.items() if v==o] for o in ws}
            choices = '; '.join(f"{f} (--weights {' or '.join(ks)})" for f,ks in files.items())
            raise ScriptError(f"no pretrained weights {weights} for {name} (could not download {fn.name}: {type(e).__name__}): "
                              f"put one of {choices} in {fn.parent}, or pass --no-pretrained") from e
    return arch, w

@call_parse
@delegates(script_flags)
def main(data:str=None, # `oxford-iiit-pet` folder in fastai's layout (default: download URLs.PETS)
         synthetic:int=0, # train on this many generated images in the real layout instead (offline)
         arch:str='resnet34', # torchvision model: resnet18/34/50, mobilenet_v2, ...
         size:int=224, # image size
         pretrained:bool=True, # with --no-pretrained, start from random weights
         weights:str='DEFAULT', # torchvision's weights for --arch, by name: DEFAULT, IMAGENET1K_V1, ... (as `vision_learner(weights=)`)
         epochs:int=1, # epochs after the frozen one (fine_tune)
         bs:int=64, # batch size per process
         lr:float=2e-3, # the single-process learning rate
         # DataLoader workers per rank; default: this rank's share of the CPUs (`n_workers()`);
         # -1: leave num_workers out (fastai's default, which distrib_ctx shares)
         workers:int=None,
         **kwargs): # the common flags (`fastddp.script.script_flags`)
    "Fine-tune `arch` on the pet breeds; labels from the file names, images converted to RGB"
    def _run():
        o = script_flags(**kwargs) # checked here: bad input is one line
        positive(epochs=epochs, bs=bs)
        set_seed(o.seed)
        path = get_data('pets', data, synthetic)
        a,w = rank0_first(get_arch, arch, pretrained, weights) # rank 0 fetches the weights, the others find them cached
        dls = ImageDataLoaders.from_name_re(path, get_image_files(path/'images'), pat=PETS_RE, item_tfms=Resize(size), bs=bs, seed=o.seed,
                                           **({} if workers==-1 else dict(num_workers=n_workers() if workers is None else workers)))
        learn = vision_learner(dls, a, pretrained=pretrained, weights=w, metrics=error_rate,
                               cbs=train_cbs(o.scale_lr, o.accum, o.checkpoint, o.resume, o.time_cost, o.out, o.forecast))
        t0 = time.time()
        with run_ctx(learn, o.dp, o.fp16, o.shard, o.shard_grads, comm_hook=o.comm_hook): learn.fine_tune(epochs, lr)
        finish(learn, 'pets', epochs, time.time()-t0, len(dls.train_ds), o.out)
    run_main(_run)
