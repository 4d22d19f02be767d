"Throughput (nbs/05a_throughput.ipynb): FLOPs per sample against an analytic count, and MFU of a matmul-bound run against the measured peak"
import time, pytest, torch
from torch import nn
from fastai.basics import DataLoaders, DataLoader, Learner, MSELossFlat, SGD, Callback, find_bs
from fastai.tabular.model import TabularModel
from fastddp.throughput import Throughput, train_flops
from fastddp.probe import cpu_peak, matmul_flops
from fastddp.testing import run_ranks

def analytic(model, xb):
    "3 x 2 x the multiply-accumulates of `model`'s convolutions and linear layers on `xb`, per sample"
    macs = []
    def hook(m, i, o):
        if isinstance(m, nn.Conv2d): macs.append(o.numel()*m.in_channels//m.groups*m.kernel_size[0]*m.kernel_size[1])
        else: macs.append(o.numel()*m.in_features)
    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad(): model(*xb)
    for h in hs: h.remove()
    return 3*2*sum(macs)/find_bs(xb)

@pytest.mark.smoke
def test_flops():
    from torchvision.models import resnet18
    bs = 4
    for m,xb in [(resnet18(num_classes=10), (torch.randn(bs,3,64,64),)),
                 (TabularModel([(10,4),(7,3)], 5, 2, layers=[200,100]), (torch.randint(0,7,(bs,2)), torch.randn(bs,5)))]:
        m.eval()
        a,f = analytic(m, xb),train_flops(m, xb)/bs
        assert abs(f/a-1)<0.01, (type(m).__name__, f, a)

class Window(Callback):
    "Each epoch's training samples and seconds, timed from its first batch on as `Throughput` times them"
    order = Throughput.order+1 # after `Throughput.before_batch`, which counts the fit's first batch's FLOPs untimed
    def before_fit(self): self.eps = []
    def before_train(self): self.n,self.t0 = 0,None
    def before_batch(self):
        if self.training and self.t0 is None: self.t0 = time.perf_counter()
    def after_batch(self):
        if self.training: self.n += find_bs(self.xb)
    def after_train(self): self.eps.append((self.n, time.perf_counter()-self.t0))

def test_mfu(tmp_path, monkeypatch, request):
    monkeypatch.setenv('FASTDDP_CACHE', str(tmp_path))
    # one thread: on a machine whose cores other processes share, one core is more often free than all
    nt = torch.get_num_threads(); torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(nt))
    torch.manual_seed(0)
    d,bs = 1024,512
    x = torch.randn(bs*4, d); ds = list(zip(x, x[:,:1]))
    dls = DataLoaders(DataLoader(ds, bs=bs, shuffle=True), DataLoader(ds[:bs], bs=bs), device='cpu')
    model = nn.Sequential(*[o for _ in range(4) for o in (nn.Linear(d,d), nn.ReLU())], nn.Linear(d,1))
    win = Window()
    learn = Learner(dls, model, loss_func=MSELossFlat(), opt_func=SGD, cbs=[Throughput(), win])
    peak = cpu_peak()
    learn.fit(2, 1e-4)
    fl = analytic(model, (x[:bs],))
    for o,(n,t) in zip(learn.throughput.stats, win.eps, strict=True):
        s = o['total']
        assert abs(s['flops_sample']/fl-1)<0.01, (s['flops_sample'], fl) # the count: forward, backward, as the layers' shapes say
        # the rate: the count over the epoch's samples and seconds, timed alongside (the same load, whatever it is)
        assert abs(s['flops_s']/(fl*n/t)-1)<0.05, (s['flops_s'], fl*n/t)
        assert s['mfu']==pytest.approx(s['flops_s']/peak) # against the cached probe
    # one core's peak bounds what the one-thread fit reaches (the cached peak is the host's: all its cores). How close it comes
    # depends on the CPU and on the load: the fit may share its core (0.47 in a loaded CI run, 0.88 alone)
    s = max((o['total'] for o in learn.throughput.stats), key=lambda o: o['mfu'])
    pk = matmul_flops(threads=1)
    assert 0.2<=s['flops_s']/pk<=1.05, ([o['total']['flops_s'] for o in learn.throughput.stats], peak, pk)

COLD = '''
import os, sys
from fastai.basics import *
from fastai.distributed import *
from fastddp.testing import report
from fastddp.probe import cache_file, cpu_key
from fastddp.throughput import Throughput
os.environ['FASTDDP_CACHE'] = sys.argv[1] # empty: the first fit's `Throughput` measures this CPU's peak
def fit(tp):
    set_seed(0)
    x = torch.randn(96, 16); ds = list(zip(x, x[:,:1]))
    dls = DataLoaders(DataLoader(ds, bs=8, shuffle=True), DataLoader(ds[:16], bs=8), device='cpu')
    m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 1)) # dropout: a fit draws from torch's generator
    learn = Learner(dls, m, loss_func=MSELossFlat(), lr=1e-2, cbs=Throughput() if tp else None)
    with learn.no_bar(), learn.distrib_ctx(): learn.fit(2)
    return dict(w=[p.detach().clone() for p in learn.model.parameters()], losses=[v[:2] for v in learn.recorder.values])
cold = fit(True)
report(cold=cold, warm=fit(True), plain=fit(False), peak=json.loads(cache_file().read_text())[cpu_key()].get('host_peak_float32'))
'''

def test_first_run_trains_as_the_next(tmp_path):
    ("2 ranks, a model with dropout: the fit that measures the CPU's peak (an empty cache: the first run on a machine) ends bit-equal "
     "to the next one, which reads it, and to a fit without `Throughput`; the peak kept in the cache")
    rs = run_ranks(COLD, n=2, args=[tmp_path/'cache'])
    for r in rs:
        assert r['peak'] and r['peak']>0, r['peak']
        for k in ('warm', 'plain'):
            assert r['cold']['losses']==r[k]['losses'], (k, r['cold']['losses'], r[k]['losses'])
            assert all(torch.equal(a, b) for a,b in zip(r['cold']['w'], r[k]['w'])), k
    assert all(torch.equal(a, b) for a,b in zip(rs[0]['cold']['w'], rs[1]['cold']['w']))

ON_GPU = r'''
import time, torch
import fastddp
from torch import nn
from fastai.basics import *
from fastai.distributed import *
from fastddp.throughput import Throughput
from fastddp.testing import report

class Drained(Callback):
    "Each epoch's training seconds from its first batch on, as `Throughput` times them, the GPU drained at both ends"
    order = Throughput.order+1
    def before_fit(self): self.eps = []
    def before_train(self): self.t0 = None
    def before_batch(self):
        if self.training and self.t0 is None: torch.cuda.synchronize(); self.t0 = time.perf_counter()
    def after_train(self): torch.cuda.synchronize(); self.eps.append(time.perf_counter()-self.t0)

# long steps of GPU work and little for the host: it queues many steps ahead of the GPU (no step of `distrib_ctx` waits for it)
d,bs = 4096,1024
x = torch.randn(bs*12, d, device='cuda'); ds = list(zip(x, x[:,:1]))
dls = DataLoaders.from_dsets(ds, ds[:bs], bs=bs, device='cuda', num_workers=0)
model = nn.Sequential(*[o for _ in range(6) for o in (nn.Linear(d, d), nn.ReLU())], nn.Linear(d, 1))
learn = Learner(dls, model, loss_func=MSELossFlat(), opt_func=SGD, lr=1e-4, cbs=[Throughput(), Drained()])
with learn.no_bar(), learn.distrib_ctx(): learn.fit(3)
report(tp=[o['total']['seconds'] for o in learn.throughput.stats], drained=learn.drained.eps)
'''

@pytest.mark.cuda
def test_gpu_seconds():
    ("One GPU under the launcher: the host queues each step's kernels and goes on, yet `Throughput` times each epoch until its last "
     "kernel is done, within 3% of a clock that drains the GPU at both ends (a host clock alone ends it many steps early)")
    o = run_ranks(ON_GPU, n=1, timeout=300)[0]
    assert len(o['tp'])==len(o['drained'])==3, o
    for a,b in zip(o['tp'], o['drained']): assert abs(a/b-1)<0.03, (o['tp'], o['drained'])
