"Throughput (nbs/05a_throughput.ipynb): FLOPs per sample against an analytic count, and MFU of a matmul-bound run against the measured peak"
import time, pytest, torch
from torch import nn
from fastai.basics import DataLoaders, DataLoader, Learner, MSELossFlat, SGD, find_bs
from fastai.tabular.model import TabularModel
from fastddp.throughput import Throughput, train_flops
from fastddp.probe import cpu_peak, matmul_flops

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

def test_mfu(tmp_path, monkeypatch, request):
    monkeypatch.setenv('FASTDDP_CACHE', str(tmp_path))
    # one thread, probe and fit alike: on a machine whose cores other processes share, one core is more often free than all
    nt = torch.get_num_threads(); torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(nt))
    torch.manual_seed(0)
    d,bs = 1024,512
    x = torch.randn(bs*4, d); ds = list(zip(x, x[:,:1]))
    dls = DataLoaders(DataLoader(ds, bs=bs, shuffle=True), DataLoader(ds[:bs], bs=bs), device='cpu')
    model = nn.Sequential(*[o for _ in range(4) for o in (nn.Linear(d,d), nn.ReLU())], nn.Linear(d,1))
    learn = Learner(dls, model, loss_func=MSELossFlat(), opt_func=SGD, cbs=Throughput())
    peak = cpu_peak()
    fl = analytic(model, (x[:bs],))
    def by_hand():
        "FLOP/s of a hand-written loop over the same batches: the rate Throughput must report"
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        t = time.perf_counter()
        for xb,yb in dls.train:
            nn.functional.mse_loss(model(xb), yb).backward(); opt.step(); opt.zero_grad()
        return fl*len(x)/(time.perf_counter()-t)
    hand = []
    for _ in range(3): # interleaved, the best of each: the runs least disturbed by other processes
        learn.fit(1, 1e-4); hand.append(by_hand())
    s = max((o['total'] for o in learn.throughput.stats), key=lambda o: o['mfu'])
    assert s['mfu']==pytest.approx(s['flops_s']/peak) # against the cached probe
    assert 0.7<=s['flops_s']/max(hand)<=1.4, ([o['total']['flops_s'] for o in learn.throughput.stats], hand)
    # the peak bounds what training reaches; how close it comes depends on the CPU and the load (0.47 in a loaded CI run, 0.88 alone)
    pk = max(peak, matmul_flops())
    assert 0.2<=s['flops_s']/pk<=1.05, ([o['total']['flops_s'] for o in learn.throughput.stats], peak, pk)
