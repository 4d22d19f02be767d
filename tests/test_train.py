"Training helpers under real 2-rank DDP: lr scaling, no_sync accumulation, DDP options, comm hooks, bf16 on CPU"
from fastddp.testing import run_ranks

TRAIN = '''
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.train import *
set_seed(0)
x = torch.randn(64,8); y = x@torch.randn(8,1)
ds = list(zip(x, y))
def mk(bs=4, model=None, cbs=()):
    torch.manual_seed(1)
    return Learner(DataLoaders(DataLoader(ds, bs=bs), DataLoader(ds[:8], bs=bs), device='cpu'), model or nn.Sequential(nn.Linear(8,16), nn.ReLU(), nn.Linear(16,1)),
                   loss_func=MSELossFlat(), opt_func=SGD, lr=0.02, cbs=list(cbs))
out = {}
_ag,n_ag = torch.distributed.all_gather,[0] # fastai's per-step loss gather goes through this name
def _counted(*a, **k): n_ag[0] += 1; return _ag(*a, **k)
torch.distributed.all_gather = _counted
def run(nm, l=None, fit=lambda l: l.fit(2), **kw):
    l = l or mk()
    cap,ag0 = Cap(),n_ag[0]
    with l.distrib_ctx(comm_stats=True, **kw): l.add_cb(cap); fit(l)
    out[nm] = dict(w=[p.detach().clone() for p in l.model.parameters()], st=(l.comm_stats.syncs, l.comm_stats.calls, l.comm_stats.bytes_per_sync), cap=cap.v, ag=n_ag[0]-ag0, rl=[float(o) for o in l.recorder.losses],
                   loss=[v[0] for v in l.recorder.values], lrs=list(l.recorder.lrs))
class Cap(Callback): # DDP's bucket size, as the trainer wrapped the model
    order,v = 20,None # after `DistributedTrainer` (11) wrapped the model
    def before_fit(self): self.v = getattr(self.model, 'bucket_bytes_cap', None)
run('plain')
run('torch', bucket_cap_mb=25) # PyTorch's default bucket size: same numbers as fastddp's one bucket on gloo
run('steploss', step_loss=True) # fastai's per-step loss gather
run('opts', static_graph=True, gradient_as_bucket_view=True, bucket_cap_mb=1, broadcast_buffers=False) # same numbers, other DDP options
run('acc', mk(bs=2, cbs=[Accumulate(2)]))
run('big', mk(bs=4))
run('fp16', comm_hook='fp16')
run('psgd', comm_hook='powersgd', powersgd_start=2)
run('lin', mk(cbs=[ScaleLR('linear')]))
run('sqrt', mk(cbs=[ScaleLR('sqrt')]), fit=lambda l: l.fit_one_cycle(1, 0.02))
run('bf16', mk().to_bf16())
try:
    with mk().distrib_ctx(comm_hook='bf16'): pass
except DistribError as e: out['bf16_hook'] = str(e)
class Branch(nn.Module): # a parameter that never gets a gradient
    def __init__(self): super().__init__(); self.a,self.b = nn.Linear(8,1),nn.Linear(8,1)
    def forward(self, x): return self.a(x)
try: run('unused', mk(model=Branch()))
except DistribError as e: out['unused_err'] = str(e)
run('unused_ok', mk(model=Branch()), find_unused_parameters=True)
report(**out)
'''

def _close(a, b, tol):
    return all((x-y).abs().max().item()<=tol for x,y in zip(a,b))

def test_training_helpers():
    rs = run_ranks(TRAIN, n=2, timeout=600)
    o = rs[0]
    for r in rs[1:]: assert all(_close(r[k]['w'], o[k]['w'], 1e-6) for k in ('plain','acc','fp16','psgd','bf16'))
    # DDP options pass straight through and keep the numbers
    assert _close(o['opts']['w'], o['plain']['w'], 1e-6)
    assert _close(o['torch']['w'], o['plain']['w'], 1e-6) and o['plain']['cap']==1024*2**20 and o['torch']['cap']==25*2**20
    # the smoothed training loss: exchanged once per epoch by default, at every step with step_loss; the same values
    assert o['plain']['ag']==0 and o['steploss']['ag']==16 and len(o['plain']['rl'])==16
    assert max(abs(a-b) for a,b in zip(o['plain']['rl'], o['steploss']['rl'])) < 1e-6 and _close(o['plain']['w'], o['steploss']['w'], 0)
    assert all(abs(a-b) < 1e-6 for a,b in zip(o['plain']['loss'], o['steploss']['loss']))
    for r in rs[1:]: assert max(abs(a-b) for a,b in zip(r['plain']['rl'], o['plain']['rl'])) < 1e-6 # every rank records the global values
    # accumulation: 2 micro-batches of 2 = a batch of 4; 32 micro-batches per rank over 2 epochs -> 16 all-reduce steps, not 32
    assert _close(o['acc']['w'], o['big']['w'], 1e-5)
    assert o['acc']['st'][0]==32//2 and o['big']['st'][0]==16 and o['plain']['st'][0]==16
    # compression: fp16 sends half the bytes, PowerSGD fewer still once it starts; both still learn
    assert o['fp16']['st'][2]==o['plain']['st'][2]/2
    assert o['psgd']['st'][2] < o['plain']['st'][2]
    for k in ('plain','fp16','psgd','bf16'): assert o[k]['loss'][-1] < o[k]['loss'][0], (k, o[k]['loss'])
    # lr scaling: x2 for 2 ranks (linear), x sqrt(2) for the peak of one cycle
    assert max(o['lin']['lrs'])==0.04 and min(o['lin']['lrs'])==0.04
    assert abs(max(o['sqrt']['lrs'])-0.02*2**0.5)<1e-9
    assert "needs nccl" in o['bf16_hook']
    # a parameter without gradient: one message that names the option, and the option works
    assert "pass find_unused_parameters=True to distrib_ctx" in o['unused_err']
    assert o['unused_ok']['loss'][-1] < o['unused_ok']['loss'][0]

import pytest

@pytest.mark.cuda
def test_gpu_precision_and_hooks():
    "On a GPU (world size 1 with one GPU): to_fp16 and to_bf16 train inside distrib_ctx on nccl, the bf16 hook registers"
    code = TRAIN.split("out = {}")[0].replace("device='cpu'", "device='cuda'")+'''
out = {}
for nm,l,kw in [('fp16', mk().to_fp16(), {}), ('bf16', mk().to_bf16(), {}), ('bf16_hook', mk(), dict(comm_hook='bf16'))]:
    with l.distrib_ctx(**kw): l.fit(1)
    out[nm] = [v[0] for v in l.recorder.values]
report(**out, be=torch.distributed.get_backend() if torch.distributed.is_initialized() else None)
'''
    rs = run_ranks(code, n=1)
    assert all(rs[0][k][-1]==rs[0][k][-1] for k in ('fp16','bf16','bf16_hook')) # trained, no NaN
