("`distrib_ctx(tune=True)` under real DDP: exact (a tuned run ends with an untuned run's "
 "weights), picks the measured fastest, the ranks agree, decisions are reused")
import json, math
import pytest
from fastddp.testing import run_ranks

COMMON = '''
import sys, time, json
from pathlib import Path
from fastai.vision.all import *
from fastai.tabular.all import *
from fastai.distributed import *
import fastddp
from torchvision.models import resnet18
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
from fastddp.core import *; from fastddp.testing import report
from fastddp.tune import Tune
from fastddp.checkpoint import Checkpoint
from fastddp.timecost import TimeCost
Tune.steps,Tune.reps = 1,1 # small: one measured step per candidate (after Tune.settle=2 left out)
tmp = Path(sys.argv[1])
out = {}
def weights(l): return [p.detach().clone() for p in l.model.parameters()]
class Peek(Callback): # what the tuner did in this fit
    order = 72
    def after_fit(self):
        t = getattr(self.learn, 'tune', None)
        self.res = None if t is None else dict(measured=t.measured, wraps=t.n_wraps)
set_seed(0)
df = pd.DataFrame({'a': np.random.randn(800), 'c': np.random.randn(800), 'b': np.random.choice(['u','v','w'], 800)})
df['y'] = ((df.a+df.c)>0).astype(int)
def tab(fit=lambda l: l.fit(2, 1e-2), cbs=(), **kw):
    "A tabular learner (embeddings, BatchNorm, dropout) trained inside distrib_ctx(**kw)"
    set_seed(0)
    tdl = TabularDataLoaders.from_df(df, procs=[Categorify, Normalize], cat_names=['b'], cont_names=['a','c'], y_names='y',
                                     y_block=CategoryBlock(), bs=16, device='cpu', num_workers=0)
    l = tabular_learner(tdl, layers=[32,16], config=tabular_config(ps=[0.1,0.1]), metrics=accuracy)
    pk = Peek()
    with l.distrib_ctx(**kw): l.add_cbs([pk, *cbs]); fit(l)
    l.peek = pk.res
    return l
'''

TUNE2 = COMMON+'''
# 1. exact: the fixed candidate set (12, static_graph included) on the tabular model, 2 epochs, tuned vs untuned
lt,l0 = tab(tune=True),tab()
d = lt.ddp_tuning
out['tab_same'] = all(torch.equal(a,b) for a,b in zip(weights(lt), weights(l0)))
out['tab_rows'],out['tab_chosen'],out['tab_peek'] = [r['name'] for r in d['table']],d['chosen'],lt.peek
out['tab_stats_left'] = hasattr(lt, 'comm_stats') # the tuner's own counting is not left behind
# 2. exact: a vision learner with BatchNorm and random transforms, fine_tune (frozen, then unfrozen: tuned again)
x,y = torch.rand(160,3,32,32),torch.randint(0,2,(160,))
def vis(**kw):
    set_seed(0)
    ds = Datasets(list(range(160)), [[lambda i: TensorImage(x[i])], [lambda i: TensorCategory(y[i])]],
                  splits=[list(range(128)), list(range(128,160))])
    dls = ds.dataloaders(bs=4, after_batch=aug_transforms(size=32, min_scale=0.75), device='cpu', num_workers=0)
    l = vision_learner(dls, resnet18, n_out=2, pretrained=False, loss_func=CrossEntropyLossFlat(), metrics=accuracy)
    with l.distrib_ctx(**kw): l.fine_tune(1, 1e-3)
    return l
vc = [dict(name='one bucket', bucket_cap_mb=1024), dict(name='5MiB+view', bucket_cap_mb=5, gradient_as_bucket_view=True),
      dict(name='25MiB+static', bucket_cap_mb=25, static_graph=True),
      dict(name='5MiB+view+static', bucket_cap_mb=5, gradient_as_bucket_view=True, static_graph=True)]
vt,v0 = vis(tune=True, tune_candidates=vc),vis()
out['vis_same'] = all(torch.equal(a,b) for a,b in zip(weights(vt), weights(v0)))
out['vis_chosen'] = vt.ddp_tuning['chosen']
# 3. never the candidate whose hook sleeps; the decision saved to tune_file, then applied from it measuring nothing
def slow(state, bucket): time.sleep(0.05); return dh.allreduce_hook(state, bucket)
sc = [dict(name='one bucket', bucket_cap_mb=1024), dict(name='slow', bucket_cap_mb=1024, comm_hook=slow),
      dict(name='5MiB', bucket_cap_mb=5)]
fn = tmp/'decision.json'
ls = tab(fit=lambda l: l.fit(1, 1e-2), tune=True, tune_candidates=sc, tune_file=str(fn))
out['slow_chosen'],out['slow_table'] = ls.ddp_tuning['chosen'],{r['name']:r['step_ms'] for r in ls.ddp_tuning['table']}
torch.distributed.barrier()
out['file'] = json.loads(fn.read_text()) if fn.exists() else None
lf = tab(fit=lambda l: l.fit(1, 1e-2), tune=True, tune_candidates=sc, tune_file=str(fn))
out['file_peek'],out['file_chosen'] = lf.peek,lf.ddp_tuning['chosen']
# 4. the ranks' own measurements disagree (each rank finds its own candidate slow): the slowest rank's figures decide, the same everywhere
_decide = Tune.decide
def skewed(self, *a, **k): # fault injection: rank 0 finds B fastest, rank 1 A; the slowest rank's figures favour C
    for i,o in enumerate([[10.,0.,5.],[0.,10.,5.]][rank()]): self.times[i] = [t+o for t in self.times[i]]
    return _decide(self, *a, **k)
Tune.decide = skewed
la = tab(fit=lambda l: l.fit(1, 1e-2), tune=True,
         tune_candidates=[dict(name='A', bucket_cap_mb=1024), dict(name='B', bucket_cap_mb=25), dict(name='C', bucket_cap_mb=5)])
Tune.decide = _decide
out['agree_chosen'],out['agree_mine'] = la.ddp_tuning['chosen'],la.ddp_tuning['mine']
# 5. saved in checkpoints and applied on resume, measuring nothing; the time-cost report says what was chosen and which knob mattered
ck = tmp/'ckpt'
lc = tab(fit=lambda l: l.fit(1, 1e-2), cbs=[Checkpoint(ck), TimeCost(skip=1, show=False)], tune=True, tune_candidates=sc[::2])
out['tc_report'] = lc.time_cost.report() if is_rank0() else None
out['ckpt_tuning'] = (torch.load(sorted(ck.glob('ckpt_*.pth'))[-1], weights_only=False).get('ddp_tuning', {}).get('chosen')
                      if is_rank0() else None)
lr = tab(fit=lambda l: l.fit(1, 1e-2), cbs=[Checkpoint(ck)], tune=True, tune_candidates=sc[::2])
out['resume_peek'] = lr.peek
# 6. 'lossy' adds fp16, PowerSGD and accumulation, each marked with what it changes
ll = tab(fit=lambda l: l.fit(3, 1e-2), tune='lossy', tune_accum=2) # 15 candidates: 3 epochs
out['lossy_rows'] = {r['name']:r['lossy'] for r in ll.ddp_tuning['table']}
out['lossy_left'] = [type(o).__name__ for o in ll.cbs]
# 7. shard=True: nothing tuned, one line
class Shard(Callback):
    order = 50
    def before_fit(self): self.learn.distributed_trainer.shard = True
lsh = tab(fit=lambda l: l.fit(1, 1e-2), cbs=[Shard()], tune=True)
out['shard_peek'],out['shard_tuning'] = lsh.peek,getattr(lsh, 'ddp_tuning', None)
# 8. the run's own PowerSGD hook: its state follows DDP's buckets, nothing is tuned; the run's own fp16 hook: tuned under it, exact
f1 = lambda l: l.fit(1, 1e-2)
lp = tab(fit=f1, tune=True, comm_hook='powersgd', powersgd_start=3)
out['psgd_peek'] = lp.peek
lh,lh0 = tab(fit=f1, tune=True, comm_hook='fp16', tune_candidates=sc[::2]),tab(fit=f1, comm_hook='fp16')
out['fp16_same'] = all(torch.equal(a,b) for a,b in zip(weights(lh), weights(lh0)))
report(**out)
'''

def test_tune_2ranks(tmp_path):
    ("At 2 ranks: tuned runs end bit-identical to untuned ones (tabular, a resnet with BatchNorm and random "
     "transforms through fine_tune, and under the run's own fp16 hook; PowerSGD's is left alone); a sleeping hook is "
     "never chosen; tune_file, checkpoints and earlier fits are reused without measuring; ranks agree when their "
     "measurements disagree; lossy candidates say what they change; shard skips")
    rs = run_ranks(TUNE2, n=2, args=[tmp_path], timeout=600)
    r0,r1 = rs
    for r in rs:
        assert r['tab_same'] and r['vis_same'], "a tuned run must train to the untuned run's weights"
        assert r['tab_peek']['measured']==12 and not r['tab_stats_left']
    assert len(r0['tab_rows'])==12 and 'one bucket+view+static' in r0['tab_rows']
    assert r0['tab_chosen']==r1['tab_chosen'] and r0['vis_chosen']==r1['vis_chosen']
    # fine_tune: frozen, then unfrozen: two decisions, each printed once
    # tab, vis x2, slow, skewed, checkpointed, lossy, fp16
    assert rs.out.count('fastddp: DDP settings tuned on 2 ranks')==1+2+1+1+1+1+1, rs.out[-3000:]
    # the sleeping hook is measured, and never chosen
    for r in rs:
        assert r['slow_chosen']!='slow' and r['slow_table']['slow']>max(v for k,v in r['slow_table'].items() if k!='slow'), r['slow_table']
    assert r0['file'] and list(r0['file'].values())[0]['chosen']==r0['slow_chosen']
    for r in rs: assert r['file_peek']==dict(measured=0, wraps=1) and r['file_chosen']==r0['slow_chosen']
    assert 'DDP settings from '+str(tmp_path/'decision.json') in rs.out
    # each rank's own figures point elsewhere (B on rank 0, A on rank 1); the slowest rank's say C, on both
    m0,m1 = r0['agree_mine'],r1['agree_mine']
    assert min(range(3), key=lambda i: m0[i])!=min(range(3), key=lambda i: m1[i])
    assert r0['agree_chosen']==r1['agree_chosen']=='C'
    # checkpoint and resume, the time-cost report
    assert r0['ckpt_tuning'] in ('one bucket','5MiB')
    assert 'DDP tuning: chose' in r0['tc_report'] and 'the knob that mattered: bucket size' in r0['tc_report'], r0['tc_report']
    for r in rs: assert r['resume_peek']==dict(measured=0, wraps=1)
    # lossy candidates
    lr = r0['lossy_rows']
    assert set(lr)>={'fp16','powersgd','accum2','one bucket'} and len(lr)==15
    assert all(lr[k] for k in ('fp16','powersgd','accum2')) and not lr['one bucket']
    assert 'lossy: gradients all-reduced in float16' in rs.out
    assert r0['lossy_left'].count('Accumulate')==0 # the tuner's own accumulation leaves with the fit
    for r in rs: assert r['shard_peek']==dict(measured=0, wraps=0) and r['shard_tuning'] is None
    assert rs.out.count('tune=True does nothing with shard=True')==1
    for r in rs: assert r['psgd_peek']==dict(measured=0, wraps=0) and r['fp16_same']
    assert rs.out.count("tune=True does nothing with comm_hook='powersgd'")==1

TUNE3 = COMMON+'''
f3 = lambda l: l.fit(3, 1e-2) # 14 steps per epoch at 3 ranks; the 12 candidates take 36
lt,l0 = tab(fit=f3, tune=True),tab(fit=f3)
report(w=weights(lt), w0=weights(l0), chosen=lt.ddp_tuning['chosen'])
'''

def test_tune_3ranks(tmp_path):
    ("At 3 ranks the bucket layout can change the order of the additions: a tuned run "
     "ends within 1e-6 relative of an untuned one; the ranks agree")
    rs = run_ranks(TUNE3, n=3, args=[tmp_path], timeout=600)
    assert len({r['chosen'] for r in rs})==1
    for r in rs:
        for a,b in zip(r['w'], r['w0']):
            assert ((a-b).norm()/b.norm().clamp_min(1e-12)).item()<=1e-6
