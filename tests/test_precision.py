("Mixed precision on the CPU: float32 with one line where the probe finds half precision "
 "slow, half where forced or fast, the probe cached")
import os, json, pytest, torch
from fastddp.testing import run_ranks
from fastddp.probe import half_ratio, max_ratio, cpu_key

FIT = '''
import os, torch
from fastai.basics import *
from fastai.distributed import *
import fastddp.precision as P
from fastddp.testing import report
class Seen(Callback):
    order = 5 # before MixedPrecision (10) turns the predictions back into float32
    def __init__(self): self.dts = set()
    def after_pred(self): self.dts.add((str(self.pred.dtype).split('.')[-1], torch.is_autocast_enabled('cpu')))
x = torch.randn(32,2); ds = list(zip(x, x@torch.ones(2,1)))
out = {}
for d in ('float16', 'bfloat16'):
    l = Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:8], bs=8), device='cpu'), nn.Linear(2,1), loss_func=MSELossFlat(),
                cbs=Seen())
    l = l.to_fp16() if d=='float16' else l.to_bf16()
    for _ in range(2): # two fits: the line comes once
        with l.distrib_ctx(): l.fit(1, 0.01)
    out[d] = dict(seen=sorted(l.seen.dts), used=P.amp_dtype(l))
report(**out)
'''

def _env(tmp, **kw):
    e = {k:v for k,v in os.environ.items() if k!='FASTDDP_CPU_HALF'}
    return {**e, 'FASTDDP_CACHE': str(tmp), **kw}

def _line(d): return f"fastddp: this CPU has no fast {d} (autocast measured"

@pytest.fixture
def slow_cpu(tmp_path, monkeypatch):
    "A cache directory holding this CPU's real probe, where a dtype this CPU computes fast is replaced by a slow one's figure"
    monkeypatch.setenv('FASTDDP_CACHE', str(tmp_path))
    if torch.cuda.is_available(): pytest.skip("a GPU computes half precision fast: the CPU fallback is not used")
    rs = {d: half_ratio(getattr(torch, d)) for d in ('float16', 'bfloat16')}
    # CPUs differ (an AMD EPYC with AVX512-BF16 computes bfloat16 at 0.8x float32's time, one without at 10x): where this one
    # is fast, the cache says what a slow one measured, so the fallback is tested on every machine
    (tmp_path/'precision.json').write_text(json.dumps({cpu_key(): {d: max(r, 10.) for d,r in rs.items()}}))
    return tmp_path

@pytest.mark.parametrize('n', [1, 2])
def test_slow_cpu_trains_float32(slow_cpu, n):
    ("Where the probe finds half precision slow, to_fp16() and to_bf16() compute in float32 "
     "with autocast off, on every rank, and rank 0 says so once per dtype")
    rs = run_ranks(FIT, n=n, env=_env(slow_cpu))
    for r in rs:
        for d in ('float16', 'bfloat16'): assert r[d]=={'seen': [('float32', False)], 'used': 'float32'}, (d, r[d])
    for d in ('float16', 'bfloat16'): assert rs.out.count(_line(d))==1, rs.out[-2000:]

def test_forced_half(tmp_path):
    "FASTDDP_CPU_HALF=1: the forward runs in float16 / bfloat16 under a CPU autocast, with no line"
    r = run_ranks(FIT, n=1, launcher='python', env=_env(tmp_path, FASTDDP_CPU_HALF='1'))
    for d in ('float16', 'bfloat16'): assert r[0][d]=={'seen': [(d, True)], 'used': d}, (d, r[0][d])
    assert "has no fast" not in r.out
    assert not (tmp_path/'precision.json').exists() # forcing measures nothing

def test_cache_decides(tmp_path):
    "The probe's result is read back from the cache: a cached 'fast' trains in half precision; a corrupt cache is measured again, not fatal"
    f = tmp_path/'precision.json'
    f.write_text(json.dumps({cpu_key(): {'float16': 0.5, 'bfloat16': 0.7}}))
    r = run_ranks(FIT, n=1, launcher='python', env=_env(tmp_path))
    for d in ('float16', 'bfloat16'): assert r[0][d]['used']==d, r[0][d]
    assert json.loads(f.read_text())=={cpu_key(): {'float16': 0.5, 'bfloat16': 0.7}} # read, not measured again
    f.write_text('{"truncated": ')
    r = run_ranks(FIT, n=1, launcher='python', env=_env(tmp_path))
    rs = json.loads(f.read_text())[cpu_key()]
    assert set(rs)=={'float16', 'bfloat16'} and all(v>0 for v in rs.values())
    for d in ('float16', 'bfloat16'): assert r[0][d]['used']==(d if rs[d]<=max_ratio else 'float32')

SCRIPT = '''
import sys, runpy
import fastddp
sys.argv[0] = {p!r}
runpy.run_path({p!r}, run_name='__main__')
'''

@pytest.mark.parametrize('force', [None, '1'])
def test_script_fp16(slow_cpu, tmp_path, force):
    ("The scripts' --fp16 (bfloat16 on CPU) shows in metrics.json what it computed in: "
     "float32 where the probe finds it slow, bfloat16 when forced")
    from conftest import ROOT
    p = str(ROOT/'scripts'/'tabular_ddp.py')
    env = _env(slow_cpu, FASTDDP_DATA=str(tmp_path/'data'), **({'FASTDDP_CPU_HALF': force} if force else {}))
    rs = run_ranks(SCRIPT.format(p=p), n=1, launcher='python', args=['--synthetic', '200', '--fp16', '--out', tmp_path/'o'], env=env)
    assert json.loads((tmp_path/'o'/'metrics.json').read_text())['precision']==('bfloat16' if force else 'float32')
    assert rs.out.count(_line('bfloat16'))==(0 if force else 1), rs.out[-2000:]
