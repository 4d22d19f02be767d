"Training helpers and communication hooks under real 2-rank DDP: lr scaling, no_sync accumulation, DDP options, what each hook sends"
import math
import pytest
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
    return Learner(DataLoaders(DataLoader(ds, bs=bs), DataLoader(ds[:8], bs=bs), device='cpu'),
                   model or nn.Sequential(nn.Linear(8,16), nn.ReLU(), nn.Linear(16,1)),
                   loss_func=MSELossFlat(), opt_func=SGD, lr=0.02, cbs=list(cbs))
out = {}
# Observe the collectives from outside, as fastddp did before its counting hook: wrap torch's functions in this test process only
_ag,n_ag = torch.distributed.all_gather,[0] # fastai's per-step loss gather goes through this name
def _counted(*a, **k): n_ag[0] += 1; return _ag(*a, **k)
torch.distributed.all_gather = _counted
_ar,seen = torch.distributed.all_reduce,dict(on=False, calls=0, bytes=0) # torch's hooks call all_reduce through this name
def _seen(t, *a, **k):
    if seen['on']: seen['calls'] += 1; seen['bytes'] += t.numel()*t.element_size()
    return _ar(t, *a, **k)
torch.distributed.all_reduce = _seen
class Obs(Callback): # the all-reduces issued during each backward pass, and the backward passes that issued any
    order = 12 # after `DistributedTrainer` (11) wrapped the model
    def before_fit(self): self.bwd,self.syncs,self.c0,self.b0 = 0,0,seen['calls'],seen['bytes']
    def before_backward(self): seen['on'],self.n = True,seen['calls']
    def after_backward(self): seen['on'] = False; self.bwd += 1; self.syncs += seen['calls']>self.n
    def after_fit(self): self.calls,self.bytes = seen['calls']-self.c0,seen['bytes']-self.b0
class Cap(Callback): # DDP's bucket size, as the trainer wrapped the model
    order,v = 20,None # after `DistributedTrainer` (11) wrapped the model
    def before_fit(self): self.v = getattr(self.model, 'bucket_bytes_cap', None)
def run(nm, l=None, fit=lambda l: l.fit(2), **kw):
    l = l or mk()
    cap,obs,ag0 = Cap(),Obs(),n_ag[0]
    with l.distrib_ctx(comm_stats=True, **kw): l.add_cbs([cap, obs]); fit(l)
    cs = l.comm_stats
    out[nm] = dict(w=[p.detach().clone() for p in l.model.parameters()], st=(cs.syncs, cs.calls, cs.bytes_per_sync), bytes=cs.bytes,
                   cap=cap.v, ag=n_ag[0]-ag0,
                   rl=[float(o) for o in l.recorder.losses], loss=[v[0] for v in l.recorder.values], lrs=list(l.recorder.lrs),
                   seen=(obs.syncs, obs.calls, obs.bytes), bwd=obs.bwd, shapes=[tuple(p.shape) for p in l.model.parameters()])
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

def sent(shapes, hook=None, compress=False, rank=1, rate=2):
    "Bytes one synchronised backward pass sends for float32 parameters of `shapes` in one bucket, derived from the hooks' definitions"
    n = sum(math.prod(s) for s in shapes)
    if hook=='fp16': return 2*n         # the bucket cast to float16
    if not compress: return 4*n         # the bucket as it is
    # PowerSGD: each gradient as a rows x cols matrix, P (rows x r) and Q (cols x r) when that saves `rate` times
    tot = 0
    for s in shapes:
        rows = s[0]; cols = math.prod(s)//rows; r = min(rows, cols, rank)
        tot += (rows+cols)*r if (rows+cols)*r*rate < rows*cols else rows*cols
    return 4*tot

def test_comm_counts():
    "`learn.comm_stats` counts, per rank, what the hook sends: equal to an analytic count and to the all-reduces seen from outside"
    rs = run_ranks(TRAIN, n=2, timeout=600)
    for r in rs:
        shapes = r['plain']['shapes']
        assert shapes==[(16,8),(16,),(1,16),(1,)] # the MLP the analytic counts below assume: one bucket on gloo
        # 64 items, 2 ranks, batch 4: 8 steps per epoch, 2 epochs, every backward synchronised
        for k in ('plain','fp16','psgd','big'):
            assert r[k]['bwd']==16 and r[k]['st'][0]==16 and r[k]['seen'][0]==16, (k, r[k]['st'], r[k]['seen'])
        # Accumulate(2) at batch 2: 32 backward passes, half of them under no_sync
        assert r['acc']['bwd']==32 and r['acc']['st'][0]==16 and r['acc']['seen'][0]==16
        # bytes: analytic, and what all_reduce received
        assert r['plain']['bytes']==16*sent(shapes)==16*644 and r['plain']['st'][2]==644
        assert r['big']['bytes']==r['acc']['bytes']==16*sent(shapes)
        assert r['fp16']['bytes']==16*sent(shapes, 'fp16')==16*322
        # 2 plain steps (powersgd_start=2), then P, Q and the rest
        assert r['psgd']['bytes']==2*sent(shapes)+14*sent(shapes, compress=True)==2*644+14*228
        for k in ('plain','acc','big','fp16','psgd'):
            assert (r[k]['st'][1], r[k]['bytes'])==r[k]['seen'][1:], (k, r[k]['st'], r[k]['bytes'], r[k]['seen'])
        assert r['plain']['st'][1]==16 and r['psgd']['st'][1]==2+14*3 # one all-reduce per plain bucket; PowerSGD: uncompressed, Ps, Qs
    o = rs[0]
    for r in rs[1:]: assert all(_close(r[k]['w'], o[k]['w'], 1e-6) for k in ('plain','acc','fp16','psgd'))
    # DDP options pass straight through and keep the numbers
    assert _close(o['opts']['w'], o['plain']['w'], 1e-6)
    assert _close(o['torch']['w'], o['plain']['w'], 1e-6) and o['plain']['cap']==1024*2**20 and o['torch']['cap']==25*2**20
    # the smoothed training loss: exchanged once per epoch by default, at every step with step_loss; the same values
    assert o['plain']['ag']==0 and o['steploss']['ag']==16 and len(o['plain']['rl'])==16
    assert max(abs(a-b) for a,b in zip(o['plain']['rl'], o['steploss']['rl'])) < 1e-6 and _close(o['plain']['w'], o['steploss']['w'], 0)
    assert all(abs(a-b) < 1e-6 for a,b in zip(o['plain']['loss'], o['steploss']['loss']))
    for r in rs[1:]: assert max(abs(a-b) for a,b in zip(r['plain']['rl'], o['plain']['rl'])) < 1e-6 # every rank records the global values
    # accumulation: 2 micro-batches of 2 = a batch of 4
    assert _close(o['acc']['w'], o['big']['w'], 1e-5)
    # compression still learns
    for k in ('plain','fp16','psgd'): assert o[k]['loss'][-1] < o[k]['loss'][0], (k, o[k]['loss'])
    # lr scaling: x2 for 2 ranks (linear), x sqrt(2) for the peak of one cycle
    assert max(o['lin']['lrs'])==0.04 and min(o['lin']['lrs'])==0.04
    assert abs(max(o['sqrt']['lrs'])-0.02*2**0.5)<1e-9
    assert "needs nccl" in o['bf16_hook']
    # a parameter without gradient: one message that names the option, and the option works
    assert "pass find_unused_parameters=True to distrib_ctx" in o['unused_err']
    assert o['unused_ok']['loss'][-1] < o['unused_ok']['loss'][0]

BF16 = '''
import torch, torch.distributed as dist
from types import SimpleNamespace
from fastddp.comm import register_hook
from fastddp.testing import report
dist.init_process_group('nccl')
torch.cuda.set_device(0)
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8,16), torch.nn.ReLU(), torch.nn.Linear(16,1)).cuda(),
                                              device_ids=[0])
tr = SimpleNamespace(learn=SimpleNamespace(model=m), comm_hook='bf16', powersgd_start=2)
register_hook(tr)
for _ in range(3): m(torch.randn(4, 8, device='cuda')).sum().backward()
cs = tr.learn.comm_stats
report(be=dist.get_backend(), syncs=cs.syncs, bytes=cs.bytes, n=sum(p.numel() for p in m.parameters()))
dist.destroy_process_group()
'''

@pytest.mark.cuda
def test_bf16_hook_on_nccl():
    "On a GPU (nccl, one rank: DDP still runs its hook): the bf16 hook registers and sends 2 bytes per gradient element"
    r = run_ranks(BF16, n=1)[0]
    assert r['be']=='nccl' and r['syncs']==3 and r['bytes']==3*2*r['n']
