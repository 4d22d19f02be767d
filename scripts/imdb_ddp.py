"IMDB (text): an AWD-LSTM classifier (ULMFiT style) trained data-parallel; the same script under every launcher and as one process"
import time
import fastddp
from fastai.text.all import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.distrib import rank0_first # fastddp's: the others wait for rank 0 up to FASTDDP_FIRST_TIMEOUT, and share its error
from fastddp.script import script_flags, positive, get_data, train_cbs, run_ctx, finish, run_main, ScriptError, offline_errors

@call_parse
@delegates(script_flags)
def main(data:str=None, # `imdb_sample` (with --sample) or `imdb` folder in fastai's layout (default: download)
         sample:bool=False, # the 1,000-review `texts.csv` instead of the full `imdb/` folder
         synthetic:int=0, # train on this many generated reviews in the real layout instead (offline)
         pretrained:bool=True, # with --no-pretrained, start from random weights instead of WT103
         epochs:int=1, # epochs after the frozen one (fine_tune)
         bs:int=32, # batch size per process
         lr:float=2e-2, # the single-process learning rate
         **kwargs): # the common flags (`fastddp.script.script_flags`)
    "Fine-tune an AWD-LSTM classifier on movie reviews; tokenisation runs on rank 0 first"
    def _run():
        o = script_flags(**kwargs) # checked here: bad input is one line
        positive(epochs=epochs, bs=bs)
        set_seed(o.seed)
        kind = 'imdb_sample' if sample else 'imdb'
        path = get_data(kind, data, synthetic)
        def _dls(): # tokenised once by rank 0 (fastai caches it next to the data), then read by the others
            if sample: return TextDataLoaders.from_csv(path, 'texts.csv', text_col='text', label_col='label', valid_col='is_valid',
                                                       bs=bs, seed=o.seed, num_workers=n_workers())
            return TextDataLoaders.from_folder(path, valid='test', bs=bs, seed=o.seed, num_workers=n_workers())
        dls = rank0_first(_dls)
        # pretrained: fastai downloads WT103's weights (`untar_data`) unless ~/.fastai/models has them; only that download failing
        # means "no weights" (any other error is the learner's own, and shows as it is)
        try: learn = text_classifier_learner(dls, AWD_LSTM, pretrained=pretrained, drop_mult=0.5, metrics=accuracy,
                                             cbs=train_cbs(o.scale_lr, o.accum, o.checkpoint, o.resume, o.time_cost, o.out, o.forecast))
        except offline_errors as e: raise ScriptError(f"no pretrained WT103 weights (could not download them: {type(e).__name__}: {e}): "
                                                      "they download into ~/.fastai/models once online; or pass --no-pretrained") from e
        t0 = time.time()
        # Every trainable parameter gets a gradient in each step, frozen or not (a frozen one is left out of DDP's buckets, as DDP
        # wraps the model again for each fit): no `find_unused_parameters`, whose graph walk each step would only cost time
        with run_ctx(learn, o.dp, o.fp16, o.shard, o.shard_grads, comm_hook=o.comm_hook):
            learn.fine_tune(epochs, lr)
        finish(learn, 'imdb', epochs, time.time()-t0, len(dls.train_ds), o.out)
    run_main(_run)
