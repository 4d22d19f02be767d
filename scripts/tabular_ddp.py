"Adult (tabular): a tabular learner trained data-parallel; the same script under every launcher and as one process"
import time
import fastddp
from fastai.tabular.all import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.script import script_flags, positive, get_data, train_cbs, run_ctx, finish, run_main

@call_parse
@delegates(script_flags)
def main(data:str=None, # `adult_sample` folder in fastai's layout (default: download URLs.ADULT_SAMPLE)
         synthetic:int=0, # train on this many generated rows in the real layout instead (offline)
         epochs:int=1, # epochs
         bs:int=64, # batch size per process
         lr:float=1e-2, # the single-process learning rate
         **kwargs): # the common flags (`fastddp.script.script_flags`)
    "Train fastai's standard Adult model: `Categorify, FillMissing, Normalize`, target `salary`"
    def _run():
        o = script_flags(**kwargs) # checked here: bad input is one line
        positive(epochs=epochs, bs=bs)
        set_seed(o.seed)
        path = get_data('adult', data, synthetic)
        df = pd.read_csv(path/'adult.csv')
        dls = TabularDataLoaders.from_df(df, path=path, y_names='salary', bs=bs, procs=[Categorify, FillMissing, Normalize],
                                         cat_names=['workclass','education','marital-status','occupation','relationship','race'],
                                         cont_names=['age','fnlwgt','education-num'])
        learn = tabular_learner(dls, metrics=accuracy,
                                cbs=train_cbs(o.scale_lr, o.accum, o.checkpoint, o.resume, o.time_cost, o.out, o.forecast))
        t0 = time.time()
        with run_ctx(learn, o.dp, o.fp16, o.shard, o.shard_grads, comm_hook=o.comm_hook): learn.fit_one_cycle(epochs, lr)
        finish(learn, 'tabular', epochs, time.time()-t0, len(dls.train_ds), o.out)
    run_main(_run)
