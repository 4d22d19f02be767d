"`Prefetch` under `distrib_ctx`: a no-op on CPU (the same batches and weights, bit for bit); on a GPU the same numbers, and no host sync"
import pytest
from fastddp.testing import run_ranks

SCRIPT = r'''
import sys, warnings, torch
import fastddp
from torch import nn
from fastai.basics import *
from fastai.callback.fp16 import *
from fastai.distributed import *
import fastprogress.fastprogress as fp
from fastddp.prefetch import Prefetch
from fastddp.testing import report
fp.printing = lambda: True # the bar prints, as on a terminal: its loss is read at every redraw
gpu = torch.cuda.is_available()
n,size,bs = (2048,64,128) if gpu else (96,8,8)

class Flip(Transform):
    "A batch transform on the device, drawing from its random generator"
    order = 99
    def encodes(self, x:TensorImage): return torch.where(torch.rand(x.shape[0], 1, 1, 1, device=x.device)<0.5, x.flip(-1), x)

class Seen(Callback):
    "Each training batch; whether `Prefetch` had the loader; the host syncs CUDA counted in the training steps"
    order = -1e9
    def before_fit(self): self.xs,self.on,self.syncs,self.in_steps = [],set(),[],False
    def before_batch(self):
        if not self.training: return
        self.xs.append(self.xb[0].clone()); self.on.add('prefetch' in self.dl.__dict__)
        self.cbs_in = sorted(type(o).__name__ for o in self.learn.cbs)
        if gpu and not self.in_steps: torch.cuda.set_sync_debug_mode('warn'); self.in_steps = True
    def after_train(self):
        if self.in_steps: torch.cuda.set_sync_debug_mode(0); self.in_steps = False

def fit(prefetch, half=None): # prefetch None: distrib_ctx's default; half: 'bf16' or 'fp16'
    set_seed(0)
    x,y = torch.randn(n, 3, size, size),torch.randint(0, 10, (n,))
    ds = [(TensorImage(x[i]), TensorCategory(y[i])) for i in range(n)]
    dls = DataLoaders.from_dsets(ds, ds[:4*bs], bs=bs, num_workers=1, after_batch=[Flip()], device='cuda' if gpu else 'cpu')
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(32, 10))
    learn = Learner(dls, m, loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), cbs=Seen())
    if half=='bf16': learn.to_bf16()
    if half=='fp16': learn.to_fp16()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        with learn.distrib_ctx(**({} if prefetch is None else dict(prefetch=prefetch))): learn.fit(2, 0.01)
    s = learn.seen
    syncs = [str(w.message) for w in ws if 'called a synchronizing CUDA operation' in str(w.message)] # not the prototype notice
    return dict(xs=[o.cpu() for o in s.xs], ps=[p.detach().cpu() for p in learn.model.parameters()], on=sorted(s.on),
                syncs=len(syncs), first_syncs=syncs[:3], steps=len(s.xs), cbs_in=s.cbs_in,
                cbs_after=[type(o).__name__ for o in learn.cbs if isinstance(o, Prefetch)])

a,b = fit(None),fit(False) # the default prefetches
res = dict(gpu=gpu, same_batches=len(a['xs'])==len(b['xs'])>0 and all(torch.equal(x, y) for x,y in zip(a['xs'], b['xs'])),
           # two identical fits on a GPU differ in the last bits (6e-8 on an H200: atomic adds in some backward kernels)
           same_weights=all(torch.allclose(p, q, atol=1e-5) if gpu else torch.equal(p, q) for p,q in zip(a['ps'], b['ps'])),
           on=(a['on'], b['on']), prefetch_cb=('Prefetch' in a['cbs_in'], 'Prefetch' in b['cbs_in']), after=a['cbs_after'],
           steps=a['steps'], syncs=(a['syncs'], b['syncs']), first_syncs=(a['first_syncs'], b['first_syncs']))
if gpu:
    c,d = fit(None, 'bf16'),fit(None, 'fp16')
    res.update(bf16_syncs=c['syncs'], bf16_first=c['first_syncs'], fp16_syncs=d['syncs'], fp16_steps=d['steps'])
report(**res)
'''

def test_cpu_noop():
    "On CPU (gloo, 2 ranks) `Prefetch` is in the context by default and does nothing: the batches and weights of `prefetch=False`"
    rs = run_ranks(SCRIPT, n=2)
    for o in rs:
        assert not o['gpu'] and o['steps']==12
        assert o['same_batches'] and o['same_weights'], o
        assert o['on']==([False], [False]) and o['prefetch_cb']==(True, False) and o['after']==[]
    assert 'side stream' not in rs.out # said only where it acts

@pytest.mark.cuda
def test_gpu():
    ("One GPU under the launcher: with `Prefetch` the same batches and weights as without, and no host sync in a training step "
     "(counted by CUDA, the bar printing) in fp32 and bf16, one in fp16 (torch's GradScaler); fastai's blocking copy syncs at every step")
    rs = run_ranks(SCRIPT, n=1, timeout=600)
    o = rs[0]
    assert o['gpu'] and o['on']==([True], [False]) and o['prefetch_cb']==(True, False) and o['after']==[]
    assert o['same_batches'] and o['same_weights'], o
    assert o['syncs'][0]==0 and o['bf16_syncs']==0, (o['syncs'], o['first_syncs'], o['bf16_first'])
    # fp16: GradScaler reads its found-inf flag on the host, to skip a step; fastai's `get_scale()` at each step was a second read
    assert o['fp16_syncs']==o['fp16_steps'], (o['fp16_syncs'], o['fp16_steps'])
    assert o['syncs'][1]>=o['steps'], o['syncs'] # the counter sees fastai's `to_device(non_blocking=False)`
    assert rs.out.count('side stream')==1 # said once

ON_GPU = r'''
import warnings, torch
import fastddp
from torch import nn
from fastai.basics import *
from fastai.distributed import *
from fastddp.testing import report

class Seen(Callback):
    "Each training batch, and the host syncs CUDA counted in the training steps"
    order = -1e9
    def before_fit(self): self.xs,self.on = [],False
    def before_batch(self):
        if not self.training: return
        self.xs.append(self.xb[0].clone())
        if not self.on: torch.cuda.set_sync_debug_mode('warn'); self.on = True
    def after_train(self):
        if self.on: torch.cuda.set_sync_debug_mode(0); self.on = False

def fit(prefetch, where): # where: which of the inputs (x) and targets (y) the dataset keeps on the GPU
    set_seed(0)
    x,y = torch.randn(512, 8),torch.randn(512, 1)
    ds = list(zip(x.cuda() if 'x' in where else x, y.cuda() if 'y' in where else y))
    dls = DataLoaders.from_dsets(ds, ds[:64], bs=64, device='cuda', num_workers=0)
    learn = Learner(dls, nn.Linear(8, 1), loss_func=MSELossFlat(), lr=0.01, cbs=Seen())
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        with learn.distrib_ctx(prefetch=prefetch): learn.fit(2)
    return dict(xs=[o.cpu() for o in learn.seen.xs], ps=[p.detach().cpu() for p in learn.model.parameters()],
                syncs=sum('called a synchronizing CUDA operation' in str(w.message) for w in ws), pin=dls.train.fake_l.pin_memory)

res = {}
for where in ('x', 'xy'):
    a,b = fit(True, where),fit(False, where)
    res[where] = dict(steps=len(a['xs']), same_batches=all(torch.equal(x, y) for x,y in zip(a['xs'], b['xs'])),
                      diff=max((p-q).abs().max().item() for p,q in zip(a['ps'], b['ps'])), syncs=a['syncs'], pin=a['pin'])
report(**res)
'''

@pytest.mark.cuda
def test_gpu_resident_data():
    ("One GPU under the launcher, a dataset kept on the GPU and no workers (the inputs there, or inputs and targets): `Prefetch` pins "
     "only the batch's CPU tensors (torch's pinning refuses a GPU tensor), trains as without it, and syncs the host in no step")
    o = run_ranks(ON_GPU, n=1, timeout=300)[0]
    for where,r in o.items():
        assert r['steps']==16 and r['same_batches'] and r['diff']<=1e-6, (where, r)
        assert r['syncs']==0 and r['pin'] is False, (where, r)
