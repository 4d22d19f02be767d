("The lean default path of `distrib_ctx`: no host sync per training step, DataLoader workers shared by the ranks, and "
 "the same weights and recorded losses as a plain DDP loop over the same batches, bit for bit")
import pytest
from fastddp.core import cpus
from fastddp.testing import run_ranks

SCRIPT = r'''
import sys, torch, torch.nn.functional as F
import fastddp
from torch import nn
from torch.utils.data import TensorDataset
from torch.overrides import TorchFunctionMode
from fastai.basics import *
from fastprogress.fastprogress import ProgressBar
from fastddp.core import all_gather_list
from fastddp.testing import report
torch.set_num_threads(1)
steps,epochs,nw = int(sys.argv[1]),int(sys.argv[2]),sys.argv[3] # training steps per epoch; epochs; 'default' or a worker count
ws = num_distrib()
g = torch.Generator().manual_seed(0)
x,y = torch.randn(8*ws*steps, 16, generator=g),torch.randint(0, 4, (8*ws*steps,), generator=g)
def model(): torch.manual_seed(0); return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
kw = {} if nw=='default' else dict(num_workers=int(nw))
dls = DataLoaders.from_dsets(TensorDataset(x, y), TensorDataset(x[:20], y[:20]), bs=8, device='cpu', **kw)
# after the loaders: fastddp's patches load only now, as when a script calls distrib_ctx without importing it
from fastai.distributed import *

# the calls that copy a tensor to the host (on a GPU: wait for it), counted everywhere in the training steps: from the first
# before_batch of an epoch to its after_train (each step's callbacks, the loader's next batch, the bar's redraws), all but the
# epoch's start (the ranks' shared sample order) and end (`EpochLoss`'s one exchange)
_syncs = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__bool__, torch.Tensor.__float__,
          torch.Tensor.__int__, torch.Tensor.__format__}
def _in_redraw():
    f = sys._getframe()
    while f is not None:
        if f.f_code.co_name=='update_bar': return True
        f = f.f_back
    return False
class Syncs(TorchFunctionMode):
    n,bar,on = 0,0,False
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _syncs:
            if _in_redraw(): Syncs.bar += 1
            else: Syncs.n += 1
        return func(*args, **(kwargs or {}))
import fastprogress, fastprogress.fastprogress as fp
fp.printing = lambda: True # print as on a terminal (fastprogress 1.0.x prints nothing to a pipe, and would format nothing)
redraws,shown = [0],[] # the bar's redraws during training steps; (step, comment) of each
_ub,_ou = ProgressBar.update_bar,fp.ConsoleProgressBar.on_update
def update_bar(self, val): redraws[0] += learn.training and Syncs.on; return _ub(self, val)
def on_update(self, val, text):
    if learn.training and Syncs.on: shown.append((learn.train_iter-1, type(self.comment).__name__, text))
    return _ou(self, val, text)
ProgressBar.update_bar,fp.ConsoleProgressBar.on_update = update_bar,on_update # this test's own counters of the bar's redraws
class First(Callback):
    order = -1e9
    def before_fit(self): self.batches,self.steps,self.workers,self.loss_types = [],0,set(),set()
    def before_train(self): self.workers.add(self.learn.dl.fake_l.num_workers)
    def before_batch(self):
        if not self.training: return
        self.foreach = self.learn.opt.step.__func__.__name__=='foreach_step' # fastai's SGD on CPU: `fastddp.foreach`
        self.batches.append((self.learn.xb[0].as_subclass(torch.Tensor).clone(), self.learn.yb[0].as_subclass(torch.Tensor).clone()))
        if not Syncs.on: self.mode = Syncs(); self.mode.__enter__(); Syncs.on = True
    def after_train(self):
        if Syncs.on: self.mode.__exit__(None, None, None); Syncs.on = False
class Last(Callback):
    order = 1e9
    def after_batch(self):
        if not self.training: return
        self.learn.first.steps += 1
        self.learn.first.loss_types.add(type(self.learn.loss).__name__)

learn = Learner(dls, model(), loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=0.05, cbs=[First(), Last()])
with learn.distrib_ctx(): learn.fit(epochs)
fst = learn.first

# the reference: a plain DDP loop (fastddp's one bucket on gloo) over the batches each rank trained on, torch's SGD with momentum
ref = nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=1024)
opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
ls = []
for xb,yb in fst.batches:
    opt.zero_grad()
    loss = F.cross_entropy(ref(xb), yb)
    loss.backward(); opt.step(); ls.append(loss.detach())
# what the bar shows on rank 0 during an epoch: this rank's own losses smoothed from the global smoother's state (`RankSmoothLoss`)
def bar_values(ls, mean):
    res,gv = [],torch.tensor(0.)
    for e in range(epochs):
        v = gv
        for i in range(e*steps, (e+1)*steps): v = torch.lerp(ls[i], v, 0.98); res.append(f'{float(v/(1-0.98**(i+1))):.4f}')
        for i in range(e*steps, (e+1)*steps): gv = torch.lerp(mean[i], gv, 0.98)
    return res
# fastai's smoothed loss of the global batch (`AvgSmoothLoss`, beta 0.98) over the ranks' mean loss at each step
mean = torch.stack(all_gather_list(torch.stack(ls))).mean(0)
val,sm = torch.tensor(0.),[]
for i,v in enumerate(mean):
    val = torch.lerp(v, val, 0.98); sm.append(val/(1-0.98**(i+1)))
bv = bar_values(ls, mean)
shown_ok = [t.endswith(f' {bv[i]}]') for i,c,t in shown if c=='LazyLoss']
report(steps=fst.steps, n_shown=len(shown_ok), shown_ok=all(shown_ok), fastprogress=fastprogress.__version__,
       syncs=Syncs.n, bar_syncs=Syncs.bar, redraws=redraws[0], workers=sorted(fst.workers),
       workers_after=[o.fake_l.num_workers for o in dls.loaders], default=min(16, defaults.cpus),
       same_weights=all(torch.equal(a, b) for a,b in zip(learn.model.parameters(), ref.module.parameters())),
       same_losses=torch.equal(torch.stack([torch.as_tensor(o) for o in learn.recorder.losses]), torch.stack(sm)),
       same_values=[o[0] for o in learn.recorder.values]==[float(sm[(e+1)*steps-1]) for e in range(epochs)],
       n_losses=len(learn.recorder.losses), dispatch='_call_one' in learn.__dict__, foreach=fst.foreach,
       foreach_after='step' in learn.opt.__dict__, loss_types=sorted(fst.loss_types),
       loss_after=type(learn.loss_func(torch.randn(2, 4), torch.tensor([0, 1]))).__name__)
'''

def _check_exact(rs, steps, epochs):
    for o in rs:
        assert o['steps']==steps*epochs and o['n_losses']==steps*epochs
        assert o['foreach'] and not o['foreach_after'] # the foreach step during the fit only
        assert o['loss_types']==['Tensor'] and o['loss_after']=='TensorBase' # the flattened loss on plain tensors during the fit only
        assert o['same_weights'], "the weights differ from a plain DDP loop's over the same batches"
        assert o['same_losses'], "the recorded smoothed losses differ from fastai's smoothing of the ranks' mean loss"
        assert o['same_values'], "the epochs' train_loss differs"
        assert not o['dispatch'] # the learner dispatches through fastai's own `_call_one` again after the context

@pytest.mark.smoke # `make test-floor` runs it at the floor's fastprogress (1.0.0), which formats a comment twice a redraw
def test_no_sync_two_ranks(tmp_path):
    ("2 ranks, 400 training steps under the default `distrib_ctx()` with the bar printing: no host sync anywhere in a training step, "
     "the bar's redraws included, the bar showing each redraw's loss, workers at the per-rank share, exact results")
    rs = run_ranks(SCRIPT, n=2, args=['200', '2', 'default'])
    _check_exact(rs, 200, 2)
    n,_ = cpus()
    share = max(0, n//2-1)
    for o in rs:
        assert o['syncs']==0, f"{o['syncs']} host syncs in {o['steps']} steps"
        assert o['bar_syncs']==0, f"{o['bar_syncs']} host syncs in the bar's {o['redraws']} redraws" # `LazyLoss` reads a host copy
        assert o['workers']==[min(16, share)] and o['workers_after']==[o['default']]*2
    assert 5<rs[0]['redraws']<rs[0]['steps']/2
    # on the CPU a copy has finished when it returns: each redraw shows this step's loss (on a GPU, the newest finished copy's)
    assert rs[0]['n_shown']==rs[0]['redraws'] and rs[0]['shown_ok'], rs[0]
    said = "DataLoader workers:" in rs.out
    assert said==(min(16, share)!=rs[0]['default']) and rs.out.count("DataLoader workers:")<=1

def test_exact_three_ranks():
    "3 ranks with a chosen worker count: exact results, the count kept, one warning when the ranks and workers are more processes than CPUs"
    rs = run_ranks(SCRIPT, n=3, args=['20', '2', '1'])
    _check_exact(rs, 20, 2)
    for o in rs: assert o['workers']==[1] and o['workers_after']==[1, 1]
    over = 3*(1+1)>cpus()[0]
    assert ("num_workers=1: 3 ranks" in rs.out)==over and rs.out.count("num_workers=1: 3 ranks")<=1
