"""On a GPU: one process under every launcher gives one process's numbers on cuda; several ranks share one GPU over gloo
(`FASTDDP_SHARE_GPU=1`) with CUDA tensors and give one process's numbers; two ranks on one GPU under nccl stop with one line.
Every test here needs CUDA (`make test-gpu` runs them; a CPU machine skips them)."""
import pytest
from fastddp.testing import run_ranks

pytestmark = pytest.mark.cuda

# One process on one GPU: what it trains on, what Accelerate wrapped, and one process's weights and metrics without any launcher
WS1 = '''
import sys, torch
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
torch.manual_seed(1)
x = torch.randn(64,3); ds = list(zip(x, x@tensor([1.,-2.,3.])[:,None]))
def mk():
    torch.manual_seed(0)
    return Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:16], bs=8), device='cuda'),
                   nn.Sequential(nn.Linear(3,16), nn.ReLU(), nn.Linear(16,1)), loss_func=MSELossFlat(), opt_func=Adam, metrics=mae)
class Dev(Callback):
    def after_batch(self):
        if self.training: report(dev=str(next(self.learn.model.parameters()).device), typ=type(self.learn.model).__name__,
                                 loss_dev=str(self.learn.loss.device))
learn = mk()
with learn.distrib_ctx(): learn.fit(2, 1e-2, cbs=Dev())
report(w=[p.detach().cpu() for p in learn.model.parameters()], vals=learn.recorder.values, after=type(learn.model).__name__,
       pg=torch.distributed.is_initialized(), be=torch.distributed.get_backend() if torch.distributed.is_initialized() else None)
if rank()==0:
    ref = mk(); ref.fit(2, 1e-2)
    report(ref=[p.detach().cpu() for p in ref.model.parameters()], ref_vals=ref.recorder.values)
'''

@pytest.mark.parametrize('launcher', ['fastddp', 'fastai', 'torchrun', 'accelerate', 'python'])
def test_one_gpu_every_launcher(launcher):
    "World size 1 on one GPU under each launcher: the fit runs on cuda (the smoother and `after_fit` crashed here) to one process's numbers"
    import torch
    rs = run_ranks(WS1, n=1, launcher=launcher)
    r = rs[0]
    assert (r['dev'], r['loss_dev'], r['after']) == ('cuda:0', 'cuda:0', 'Sequential'), r
    assert all(torch.equal(a, b) for a,b in zip(r['w'], r['ref'])) and r['vals']==r['ref_vals']
    assert r['be'] in (None, 'nccl') # Accelerate may make a one-rank group under a launcher; never gloo on a GPU
    assert 'destroy_process_group() was not called' not in rs.out # fastddp leaves the group Accelerate made

# Several ranks on one GPU over gloo: DDP's weights equal one process's with the global batch (to rounding: other kernels), the
# validation metrics and predictions equal one process's, the epoch loss exchange, SyncBatchNorm, and a resume with Adam's
# state on the GPU
SHARED = '''
import sys, torch
from pathlib import Path
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.checkpoint import Checkpoint
ck,ws = Path(sys.argv[1]),world_size()
torch.manual_seed(1) # the same data on every rank
x = torch.randn(48,3); ds = list(zip(x, x@tensor([1.,-2.,3.])[:,None]))
def mk(items, bs, bn=False, path='.'):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3,16), *([nn.BatchNorm1d(16)] if bn else []), nn.ReLU(), nn.Linear(16,1))
    return Learner(DataLoaders(DataLoader(items, bs=bs), DataLoader(ds[:13], bs=4), device='cuda'), m, loss_func=MSELossFlat(),
                   opt_func=Adam, metrics=mae, path=path)
class Dev(Callback):
    def after_batch(self):
        if self.training: report(dev=str(next(self.learn.model.parameters()).device), typ=type(self.learn.model).__name__,
                                 be=torch.distributed.get_backend())
learn = mk(ds, 4)
with learn.distrib_ctx():
    learn.fit(2, 1e-2, cbs=Dev())
    preds,targs = learn.get_preds() # every rank's block, in the dataset's order
report(w=[p.detach().cpu() for p in learn.model.parameters()], vals=learn.recorder.values, preds=preds.cpu(), targs=targs.cpu())
bn = mk(ds, 4, bn=True)
with bn.distrib_ctx(sync_bn=True): bn.fit(1, 1e-2)
report(bn=[o.cpu() for o in bn.model[1].running_mean], bn_type=type(bn.model[1]).__name__)
a = mk(ds, 4, path=ck)
with a.distrib_ctx(): a.fit(1, 1e-2, cbs=Checkpoint('ck'))
b = mk(ds, 4, path=ck)
with b.distrib_ctx(): b.fit(2, 1e-2, cbs=Checkpoint('ck')) # resumes after epoch 0: Adam's state must come back on the GPU
report(resumed=[p.detach().cpu() for p in b.model.parameters()])
class Seen(Metric): # keeps its count on the GPU and reuses the tensor, as a confusion matrix may: ranks but 0 take rank 0's count
    def __init__(self): self.n = None
    def reset(self): self.n = torch.zeros(1, device='cuda') if self.n is None else self.n.zero_()
    def accumulate(self, learn): self.n += learn.yb[0].new_ones(1)
    @property
    def value(self): return self.n.item()
s = mk(ds, 4); s.metrics = [Seen()]
with s.distrib_ctx(): s.fit(2, 1e-2) # the second validation adds to the tensor the first one gave each rank
report(seen=[v[-1] for v in s.recorder.values], seen_dev=str(s.metrics[0].n.device))
if rank()==0:
    ref = mk(ds, 4*ws); ref.fit(2, 1e-2) # rank r takes every ws-th item: a step's batches are one process's batch of 4*ws items
    p,t = ref.get_preds()
    report(ref=[o.detach().cpu() for o in ref.model.parameters()], ref_vals=ref.recorder.values, ref_preds=p.cpu(), ref_targs=t.cpu())
'''

@pytest.mark.parametrize('n', [2, 3])
def test_shared_gpu(n, tmp_path):
    "2 and 3 ranks on one GPU over gloo with CUDA tensors: one process's weights, metrics and predictions; SyncBatchNorm; resume"
    import torch
    rs = run_ranks(SHARED, n=n, args=[tmp_path], env={'FASTDDP_SHARE_GPU': '1'}, timeout=240)
    assert all((o['dev'], o['typ'], o['be']) == ('cuda:0', 'DistributedDataParallel', 'gloo') for o in rs), rs[0]
    r0 = rs[0]
    close = lambda a,b: all(torch.allclose(x, y, atol=1e-5) for x,y in zip(a, b))
    assert close(r0['w'], r0['ref']) and all(close(o['w'], r0['w']) for o in rs)
    assert torch.allclose(torch.tensor(r0['vals']), torch.tensor(r0['ref_vals']), atol=1e-5)
    assert torch.allclose(r0['preds'], r0['ref_preds'], atol=1e-5) and torch.equal(r0['targs'], r0['ref_targs'])
    assert r0['bn_type']=='SyncBatchNorm' and all(torch.equal(o['bn'][0], r0['bn'][0]) for o in rs)
    assert close(r0['resumed'], r0['w']) # resumed from epoch 1's checkpoint: the uninterrupted run's weights
    assert all((o['seen'], o['seen_dev'])==(r0['seen'], 'cuda:0') for o in rs), [(o['seen'], o['seen_dev']) for o in rs]

NCCL_TWO = '''
import fastddp
from fastai.basics import *
from fastai.distributed import *
learn = Learner(DataLoaders(DataLoader([(torch.randn(3), torch.randn(1))]*8, bs=4), DataLoader([], bs=4)), nn.Linear(3,1),
                loss_func=MSELossFlat())
with learn.distrib_ctx(): learn.fit(1)
'''

def test_two_ranks_one_gpu_nccl():
    "torchrun with 2 ranks on a one-GPU machine under nccl: one line naming both ranks, not NCCL's error at the first collective"
    import torch
    if torch.cuda.device_count()>1: pytest.skip("needs a machine with one GPU")
    rs = run_ranks(NCCL_TWO, n=2, launcher='torchrun', check=False, timeout=120)
    assert rs.rc!=0 and "ranks 0 and 1 both use GPU" in rs.out, rs.out[-2000:]

# FSDP2 over gloo with CUDA tensors: torch's gloo has no CUDA reduce-scatter; tried on an H200 (2026-11-26), rank 0 died with SIGSEGV
SHARD = '''
import torch
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastddp.testing import report
torch.manual_seed(1)
x = torch.randn(32,3); ds = list(zip(x, x@tensor([1.,-2.,3.])[:,None]))
def fit(**kw):
    torch.manual_seed(0)
    learn = Learner(DataLoaders(DataLoader(ds, bs=4), DataLoader(ds[:8], bs=4), device='cuda'),
                    nn.Sequential(nn.Linear(3,64), nn.ReLU(), nn.Linear(64,1)), loss_func=MSELossFlat(), opt_func=Adam)
    try:
        with learn.distrib_ctx(shard_min=1, **kw): learn.fit(1, 1e-2)
    except Exception as e: return f"{type(e).__name__}: {e}"
    return [p.detach().cpu() for p in learn.model.parameters()]
report(ddp=fit(), shard=fit(shard=True))
'''

def test_shared_gpu_shard():
    "2 ranks sharing one GPU: DDP trains; shard=True stops with one clear line instead of gloo's crash"
    r = run_ranks(SHARD, n=2, env={'FASTDDP_SHARE_GPU': '1'}, timeout=180)[0]
    assert not isinstance(r['ddp'], str), r['ddp']
    assert r['shard'].startswith("DistribError: shard with FASTDDP_SHARE_GPU=1: torch's gloo has no reduce-scatter"), r['shard']

# DataParallel (`learn.parallel_ctx()`, the scripts' --dp) on the GPUs it finds, without a launcher
DP = '''
import torch
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastddp.testing import report
torch.manual_seed(1)
x = torch.randn(32,3); ds = list(zip(x, x@tensor([1.,-2.,3.])[:,None]))
def mk():
    torch.manual_seed(0)
    return Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:8], bs=8), device='cuda'), nn.Linear(3,1), loss_func=MSELossFlat())
class Typ(Callback):
    def after_batch(self): report(typ=type(self.learn.model).__name__)
learn = mk()
with learn.parallel_ctx(): learn.fit(2, 1e-2, cbs=Typ())
ref = mk(); ref.fit(2, 1e-2)
report(w=learn.model.weight.detach().cpu(), ref=ref.model.weight.detach().cpu(), after=type(learn.model).__name__)
'''

def test_data_parallel():
    "DataParallel on the visible GPUs: wrapped during the fit, given back after, one process's weights on one GPU"
    import torch
    r = run_ranks(DP, n=1, launcher='python')[0]
    assert (r['typ'], r['after']) == ('DataParallel', 'Linear')
    assert torch.allclose(r['w'], r['ref'], atol=1e-6 if torch.cuda.device_count()>1 else 0)
