"The demo of `make demo`: data-parallel training of a tabular model on an Adult-layout dataset generated offline"
import fastddp
from fastai.tabular.all import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.distrib import rank0_first # fastddp's: the others wait for rank 0 up to FASTDDP_FIRST_TIMEOUT, and share its error
from fastddp.data import make_adult

@call_parse
def main(path:str='~/.fastddp/demo', # where the generated dataset goes
         n:int=4000, # rows of the generated dataset
         epochs:int=2, # epochs to train
         bs:int=64): # batch size per process
    "Train a tabular learner with `distrib_ctx` on every process this script was started on"
    set_seed(42)
    src = rank0_first(make_adult, Path(path).expanduser(), n=n) # rank 0 writes it, the others wait and reuse it
    df = pd.read_csv(src/'adult.csv')
    dls = TabularDataLoaders.from_df(df, path=src, y_names='salary', bs=bs,
        cat_names=['workclass','education','marital-status','occupation','relationship','race'],
        cont_names=['age','fnlwgt','education-num'], procs=[Categorify, FillMissing, Normalize])
    learn = tabular_learner(dls, metrics=accuracy)
    rank0_print(f"training on {world_size()} process(es), {distrib_device().type}, per-process batch {bs}")
    with learn.distrib_ctx(): learn.fit_one_cycle(epochs, 1e-2)
    loss,acc = learn.recorder.values[-1][1:3] # exact: the numbers one process would compute on these weights
    rank0_print(f"done: valid loss {loss:.4f}, accuracy {acc:.4f}")
