"Throughput (nbs/05a_throughput.ipynb): FLOPs per sample against an analytic count, and MFU of a matmul-bound run against the measured peak"
import pytest, torch
from torch import nn
from fastai.basics import DataLoaders, DataLoader, Learner, MSELossFlat, SGD, find_bs
from fastai.tabular.model import TabularModel
from fastddp.throughput import Throughput, train_flops
from fastddp.probe import cpu_peak

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

def test_flops():
    from torchvision.models import resnet18
    bs = 4
    for m,xb in [(resnet18(num_classes=10), (torch.randn(bs,3,64,64),)),
                 (TabularModel([(10,4),(7,3)], 5, 2, layers=[200,100]), (torch.randint(0,7,(bs,2)), torch.randn(bs,5)))]:
        m.eval()
        a,f = analytic(m, xb),train_flops(m, xb)/bs
        assert abs(f/a-1)<0.01, (type(m).__name__, f, a)

def test_mfu(tmp_path, monkeypatch):
    monkeypatch.setenv('FASTDDP_CACHE', str(tmp_path))
    torch.manual_seed(0)
    d,bs = 2048,512
    x = torch.randn(bs*6, d); ds = list(zip(x, x[:,:1]))
    dls = DataLoaders(DataLoader(ds, bs=bs, shuffle=True), DataLoader(ds[:bs], bs=bs), device='cpu')
    model = nn.Sequential(*[o for _ in range(4) for o in (nn.Linear(d,d), nn.ReLU())], nn.Linear(d,1))
    learn = Learner(dls, model, loss_func=MSELossFlat(), opt_func=SGD, cbs=Throughput())
    peak = cpu_peak()
    learn.fit(1, 1e-4)
    s = learn.throughput.stats[-1]['total']
    assert s['mfu']==pytest.approx(s['flops_s']/peak)
    assert 0.5<=s['mfu']<=1.05, (s, peak)
