"Adult (tabular): a tabular learner trained data-parallel; the same script under every launcher and as one process"
import time
import fastddp
from fastai.tabular.all import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.script import get_data, train_cbs, run_ctx, finish, run_main

@call_parse
def main(data:str=None, # `adult_sample` folder in fastai's layout (default: download URLs.ADULT_SAMPLE)
         synthetic:int=0, # train on this many generated rows in the real layout instead (offline)
         epochs:int=1, # epochs
         bs:int=64, # batch size per process
         lr:float=1e-2, # the single-process learning rate
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
    "Train fastai's standard Adult model: `Categorify, FillMissing, Normalize`, target `salary`"
    def _run():
        set_seed(seed)
        path = get_data('adult', data, synthetic)
        df = pd.read_csv(path/'adult.csv')
        dls = TabularDataLoaders.from_df(df, path=path, y_names='salary', bs=bs, procs=[Categorify, FillMissing, Normalize],
            cat_names=['workclass','education','marital-status','occupation','relationship','race'], cont_names=['age','fnlwgt','education-num'])
        learn = tabular_learner(dls, metrics=accuracy, cbs=train_cbs(scale_lr, accum, checkpoint, resume, time_cost, out))
        t0 = time.time()
        with run_ctx(learn, dp, fp16, shard, shard_grads, comm_hook=comm_hook): learn.fit_one_cycle(epochs, lr)
        finish(learn, 'tabular', epochs, time.time()-t0, len(dls.train_ds), out)
    run_main(_run)
