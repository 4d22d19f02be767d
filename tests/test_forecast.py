("The forecast on real runs: a 2-rank gloo run forecasts one rank from its own TimeCost; the tabular script at one process prints "
 "the forecast section for --forecast (the link measured here: the doctor's sweep and probe_rank). Plumbing, not accuracy: on a "
 "shared machine accuracy belongs to tools/bench_forecast.py")
import math
from fastddp.testing import run_ranks
from conftest import ROOT

TWO = '''
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
import fastddp
x = torch.randn(480, 64); ds = list(zip(x, x.sum(1, keepdim=True)))
dls = DataLoaders(DataLoader(ds, bs=16, shuffle=True, num_workers=0), DataLoader(ds[:32], bs=16, num_workers=0), device='cpu')
learn = Learner(dls, nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)), loss_func=MSELossFlat(), lr=1e-3)
learn.add_time_cost(show=False, targets='1,2,2x1@100Mbit')
with learn.distrib_ctx(): learn.fit(1)
tc = learn.time_cost
report(one=tc.forecast(1), two=tc.forecast(2), slow=tc.forecast(1, hosts=2, link='100Mbit'),
       fp16=tc.forecast(1, hosts=2, link='100Mbit', comm_hook='fp16'), ws=tc.what_ifs(1, hosts=2, link='100Mbit'),
       rep=str(tc.report()), st=tc.stats(), n=sum(p.numel() for p in learn.model.parameters()),
       lat=max(50e-6, fastddp.forecast.bench_link(tc.bench)['lat']), share=fastddp.forecast.tcp_share, ddp=tc.probe)
'''

def test_two_ranks(tmp_path):
    r = run_ranks(TWO, n=2, timeout=600)[0]
    st = r['st']
    for k in ('one','two','slow','fp16'):
        assert {'samples_s','step_ms','speedup','efficiency','limit','assumptions'} <= set(r[k]), (k, r[k])
    one,two = r['one'],r['two']
    assert one['world']==1 and one['ms']['comm']==0 and 'not measured' in one['assumptions']['one process']
    # at the ranks it ran, the model gives back the run: its mean phases and the link its own all-reduce had. Not exactly: the run's
    # time is its slowest rank's sum over steps, the model's the mean step of a typical rank plus the straggler's extra time. Within
    # 15% alone; 26% off once in a whole `make test`, the other worker's processes taking the cores from one rank then the other for
    # whole time slices against steps of about a millisecond (what contention does to a forecast: issue 38, tools/bench_forecast.py)
    assert abs(two['samples_s']/st['samples_per_s']-1)<0.4, (two['samples_s'], st['samples_per_s'])
    assert 'measured in this run (2 ranks' in two['assumptions']['link']
    assert math.isclose(two['speedup'], two['samples_s']/(one['samples_s']), rel_tol=1e-9)
    # 100 Mbit/s between hosts: the gradient's 2(2-1)/2 × 4 bytes × parameters at TCP's share of 12.5 MB/s, plus two hops of the
    # link's 50 us (or of gloo's latency on this host where the doctor's benchmark measured more) and DDP's own cost per step
    want = 1e3*(4*r['n']/(12.5e6*r['share'])+2*r['lat'])+r['ddp']['plain']
    assert math.isclose(r['slow']['ms']['comm'], want, rel_tol=1e-6), (r['slow']['ms'], want)
    assert r['fp16']['samples_s']>r['slow']['samples_s'] and r['slow']['limit']=='comm'
    assert [o['gain'] for o in r['ws']]==sorted([o['gain'] for o in r['ws']], reverse=True)
    rows = [l.split()[:2] for l in r['rep'].splitlines()[1:]]
    assert 'forecast (weak scaling' in r['rep'] and ['1','1'] in rows and ['2','1'] in rows and ['1','2'] in rows, r['rep']
    assert 'what-ifs at 2 ranks × 1 host' in r['rep'] and 'link: ' in r['rep'] # the largest target's what-ifs and assumptions

def test_script_forecast(tmp_path):
    "One process of the tabular script with --forecast 2: the report forecasts two ranks over the link measured here on two ranks"
    rs = run_ranks(str(ROOT/'scripts'/'tabular_ddp.py'), n=1, launcher='python', timeout=600,
                   args=['--synthetic', '400', '--bs', '32', '--forecast', '1,2,64'],
                   env={'FASTDDP_DATA': str(tmp_path/'data'), 'CUDA_VISIBLE_DEVICES': ''}) # a CPU run, on any machine
    o = rs.out
    assert 'forecast (weak scaling' in o and 'on 2 gloo ranks' in o, o[-3000:] # the doctor's sweep, and probe_rank's rate in training
    assert '64 ranks on' in o and 'more than the cores' in o # no machine here has 64 cores
    assert o.count('forecast (weak scaling')==1 and 'tabular: 1 process(es)' in o
