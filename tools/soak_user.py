"A user's fastai script as a new user writes it: fastai's default DataLoaders (with their worker processes), `distrib_ctx`, `fit`"
import fastddp
from fastai.vision.all import *
from fastai.distributed import *

@call_parse
def main(epochs:int=2, # epochs: each starts DataLoader workers twice (training, validation)
         n:int=256, # in-memory images
         size:int=64): # image side in pixels
    "Train resnet18 on random in-memory images, data-parallel on whatever launched this script"
    set_seed(0)
    x,y = torch.randn(n, 3, size, size),torch.randint(0, 10, (n,))
    cut = n*3//4
    dls = DataLoaders.from_dsets(list(zip(x[:cut],y[:cut])), list(zip(x[cut:],y[cut:])), bs=32) # fastai's default num_workers
    learn = Learner(dls, resnet18(num_classes=10), loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    with learn.distrib_ctx(): learn.fit(epochs)
    if rank_distrib()==0: print(f"done: {learn.recorder.values[-1]}")
