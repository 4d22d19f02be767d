"IMDB (text): an AWD-LSTM classifier (ULMFiT style) trained data-parallel; the same script under every launcher and as one process"
import time
import fastddp
from fastai.text.all import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.script import get_data, train_cbs, run_ctx, finish, run_main, ScriptError, offline_errors

@call_parse
def main(data:str=None, # `imdb_sample` (with --sample) or `imdb` folder in fastai's layout (default: download)
         sample:bool=False, # the 1,000-review `texts.csv` instead of the full `imdb/` folder
         synthetic:int=0, # train on this many generated reviews in the real layout instead (offline)
         pretrained:bool=True, # with --no-pretrained, start from random weights instead of WT103
         epochs:int=1, # epochs after the frozen one (fine_tune)
         bs:int=32, # batch size per process
         lr:float=2e-2, # the single-process learning rate
         scale_lr:str=None, # scale lr with the number of processes: 'linear' or 'sqrt'
         accum:int=1, # micro-batches per optimizer step
         fp16:bool=False, # mixed precision (bfloat16 on CPU)
         comm_hook:str=None, # compress DDP's gradients: 'fp16' or 'powersgd' (faster all-reduce, changes the numbers)
         dp:bool=False, # DataParallel over the visible GPUs instead of DDP (without a launcher)
         shard:bool=False, # shard parameters, gradients and optimizer state across the processes (FSDP2, ZeRO-3): for a model that does not fit one device
         shard_grads:bool=False, # shard gradients and optimizer state only (ZeRO-2): more memory than --shard, less communication
         seed:int=42, # random seed
         out:str=None, # folder for metrics.json and export.pkl
         checkpoint:str=None, # folder for a checkpoint every epoch (resumed automatically)
         resume:bool=True, # with --no-resume, start over even if --checkpoint holds one
         time_cost:bool=False): # time every step's phases; rank 0 prints the report (and saves time_cost.png in --out)
    "Fine-tune an AWD-LSTM classifier on movie reviews; tokenisation runs on rank 0 first"
    def _run():
        set_seed(seed)
        kind = 'imdb_sample' if sample else 'imdb'
        path = get_data(kind, data, synthetic)
        def _dls(): # tokenised once by rank 0 (fastai caches it next to the data), then read by the others
            if sample: return TextDataLoaders.from_csv(path, 'texts.csv', text_col='text', label_col='label', valid_col='is_valid', bs=bs, seed=seed, num_workers=n_workers())
            return TextDataLoaders.from_folder(path, valid='test', bs=bs, seed=seed, num_workers=n_workers())
        dls = rank0_first(_dls)
        # pretrained: fastai downloads WT103's weights (`untar_data`) unless ~/.fastai/models has them; only that download failing
        # means "no weights" (any other error is the learner's own, and shows as it is)
        try: learn = text_classifier_learner(dls, AWD_LSTM, pretrained=pretrained, drop_mult=0.5, metrics=accuracy, cbs=train_cbs(scale_lr, accum, checkpoint, resume, time_cost, out))
        except offline_errors as e: raise ScriptError(f"no pretrained WT103 weights (could not download them: {type(e).__name__}: {e}): they download into ~/.fastai/models once online; or pass --no-pretrained") from e
        t0 = time.time()
        # AWD-LSTM's fine_tune leaves parameters without gradients while frozen: DDP must look for them
        with run_ctx(learn, dp, fp16, shard, shard_grads, comm_hook=comm_hook, find_unused_parameters=True): learn.fine_tune(epochs, lr)
        finish(learn, 'imdb', epochs, time.time()-t0, len(dls.train_ds), out)
    run_main(_run)
