("fastai's loggers under DDP (nbs/02g_loggers.ipynb): TensorBoard and wandb (offline) read back with their "
 "own readers, CSVLogger, ShowGraphCallback, SaveModelCallback + EarlyStoppingCallback")
import json, struct, pytest, torch
from pathlib import Path
from fastddp.testing import run_ranks
from fastddp.epoch_loss import smoothed

pytest.importorskip('tensorboard'); pytest.importorskip('wandb')
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

def read_wandb(fn):
    "History rows {step: {key: value}} of a wandb run file (LevelDB log format of `wandb_internal_pb2.Record`s)"
    from wandb.proto import wandb_internal_pb2 as pb
    b = Path(fn).read_bytes()
    ident,magic,ver = struct.unpack('<4sHB', b[:7])
    assert ident==b':W&B' and magic==0xBEE1, (ident, magic)
    recs,buf,pos,BS = [],b'',7,32768
    while pos+7<=len(b):
        left = BS - pos%BS
        if left<7: pos += left; continue
        crc,n,typ = struct.unpack('<IHB', b[pos:pos+7]); data = b[pos+7:pos+7+n]; pos += 7+n
        if typ==0 and n==0: continue
        buf += data
        if typ in (1,4): recs.append(buf); buf = b''
    hist = {}
    for r in recs:
        rec = pb.Record(); rec.ParseFromString(r)
        if rec.WhichOneof('record_type')!='history': continue
        row = {o.key or '/'.join(o.nested_key): json.loads(o.value_json) for o in rec.history.item}
        hist.setdefault(rec.history.step.num, {}).update(row)
    return hist

LG = '''
import sys, os, numpy as np
from pathlib import Path
out, n_ep = Path(sys.argv[1]), int(sys.argv[2])
os.environ['WANDB_MODE'] = 'offline'; os.environ['WANDB_SILENT'] = 'true'
import wandb
from fastai.vision.all import *
from fastai.distributed import *
from fastai.callback.tensorboard import TensorBoardCallback
from fastai.callback.wandb import WandbCallback
from fastddp.core import *
from fastddp.testing import report
from fastddp.throughput import Throughput
rng = np.random.default_rng(0)
arrs = rng.integers(0, 256, (40,8,8,3), dtype=np.uint8); ys = (arrs.mean((1,2,3))>127.5).astype(int)
dls = DataBlock(blocks=(ImageBlock, CategoryBlock), get_x=lambda i: PILImage.create(arrs[i]), get_y=lambda i: ys[i],
                splitter=IndexSplitter(range(30,40))).dataloaders(range(40), bs=4, num_workers=0, device='cpu')
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3,4,3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4,2))
class Steps(Callback): # each rank's own loss at each step, and the weights after each epoch
    order = 55 # before SaveModel/EarlyStopping (60+), which end the fit in their after_epoch
    def before_fit(self): self.raw,self.ws = [],[]
    def after_batch(self):
        if self.training: self.raw.append(float(self.loss))
    def after_epoch(self): self.ws.append([p.detach().clone() for p in self.learn.model.parameters()])
if is_rank0(): wandb.init(dir=out, project='fastddp-test')
st = Steps()
cbs = [TensorBoardCallback(out/'tb'), WandbCallback(), Throughput(peak=1e12), CSVLogger(), ShowGraphCallback(), st,
       SaveModelCallback(monitor='valid_loss'), EarlyStoppingCallback(monitor='valid_loss', min_delta=10, patience=1)]
learn = Learner(dls, model, metrics=accuracy, cbs=cbs, path=out)
with learn.distrib_ctx(): learn.fit(n_ep, 1e-2)
if is_rank0(): wandb.finish()
report(values=[list(map(float,o)) for o in learn.recorder.values], names=list(learn.recorder.metric_names),
       losses=[float(o) for o in learn.recorder.losses], raw=st.raw, ws=st.ws,
       final=[p.detach().clone() for p in learn.model.parameters()], tp=learn.throughput.stats)
'''

def _expected(rs):
    "The smoothed per-step training loss of the mean of the ranks' losses, as one process would record it (fit from scratch)"
    raw = torch.tensor([r['raw'] for r in rs]).mean(0) # float32, as `EpochLoss` averages them
    vals,_,_ = smoothed(raw, torch.tensor(0.), 0)
    return [float(o) for o in vals],raw.tolist()

# 3 ranks only: an uneven split, and everything 2 would check (a launch of 2 more was 33 s of the suite)
@pytest.mark.parametrize('n', [3])
def test_loggers(tmp_path, n):
    rs = run_ranks(LG, n=n, args=[tmp_path, 3], env={'WANDB_MODE': 'offline', 'OMP_NUM_THREADS': '1'}, timeout=300)
    r0 = rs[0]
    # every rank recorded the same epochs and losses, and stopped at the same epoch (EarlyStopping: min_delta=10, patience=1)
    for r in rs[1:]:

        assert r['values']==r0['values'] and len(r['values'])==2, (r['values'], r0['values'])
        assert torch.allclose(torch.tensor(r['losses']), torch.tensor(r0['losses']))
    tl,raw = _expected(rs)
    assert torch.allclose(torch.tensor(r0['losses']), torch.tensor(tl), atol=1e-6), (r0['losses'], tl)
    # Throughput: every rank has the same totals, made of every rank's counts; they are recorder columns, logged like metrics
    assert r0['names'][-3:]==['samples_s','mfu','time']
    for r in rs: assert [o['total'] for o in r['tp']]==[o['total'] for o in r0['tp']]
    for e,st in enumerate(r0['tp']):
        rk,tot = st['ranks'],st['total']
        assert len(rk)==n and tot['samples']==sum(o['samples'] for o in rk) and tot['seconds']==max(o['seconds'] for o in rk)
        assert tot['samples_s']==pytest.approx(tot['samples']/tot['seconds']) and tot['mfu']==pytest.approx(tot['flops_s']/1e12)
        assert r0['values'][e][-2:]==pytest.approx([st['total']['samples_s'], st['total']['mfu']])
    # TensorBoard: one run (one event file, from rank 0), read with TensorBoard's own reader
    evs = list((tmp_path/'tb').glob('events.out.tfevents.*'))
    assert len(evs)==1, evs
    ea = EventAccumulator(str(evs[0])); ea.Reload()
    steps = {e.step: e.value for e in ea.Scalars('train_loss')}
    assert sorted(steps)==list(range(1, len(tl)+1)), sorted(steps)
    assert torch.allclose(torch.tensor([steps[i+1] for i in range(len(tl))]), torch.tensor(tl), atol=1e-6)
    n_steps = len(r0['raw'])//2 # steps per epoch
    for e,v in enumerate(r0['values']):
        for name,x in zip(r0['names'][2:-1], v[1:]):
            got = [o.value for o in ea.Scalars(name) if o.step==(e+1)*n_steps]
            assert got and abs(got[-1]-x)<=1e-6*max(1,abs(x)), (name, e, got, x) # TensorBoard keeps float32
    assert ea.Tags()['graph'] # `trace_model=True` traced the plain model
    # wandb offline: one run, its history read from the run file
    runs = list((tmp_path/'wandb').glob('offline-run-*'))
    assert len(runs)==1, runs
    h = read_wandb(next(runs[0].glob('run-*.wandb')))
    tr = [h[s] for s in sorted(h) if 'train_loss' in h[s]]
    assert torch.allclose(torch.tensor([o['train_loss'] for o in tr]), torch.tensor(tl), atol=1e-6)
    assert torch.allclose(torch.tensor([o['raw_loss'] for o in tr]), torch.tensor(raw), atol=1e-6)
    ev = [h[s] for s in sorted(h) if 'valid_loss' in h[s]]
    assert [[o[k] for k in r0['names'][2:-1]] for o in ev]==[v[1:] for v in r0['values']]
    assert any(k.startswith('Prediction_Samples') for o in h.values() for k in o) # log_preds: a table logged at the end
    # CSVLogger: one file, a header and one line per epoch
    csv = (tmp_path/'history.csv').read_text().splitlines()
    assert len(csv)==1+len(r0['values']) and csv[0].startswith('epoch,train_loss')
    # SaveModelCallback: one file, and every rank ends with the best epoch's weights
    assert [o.name for o in (tmp_path/'models').iterdir()]==['model.pth']
    best = min(range(len(r0['values'])), key=lambda e: r0['values'][e][1])
    saved = torch.load(tmp_path/'models'/'model.pth', weights_only=False)
    saved = list((saved['model'] if 'model' in saved else saved).values())
    for r in rs:
        for a,b,c in zip(r['final'], r0['ws'][best], saved): assert torch.equal(a,b) and torch.equal(a,c)
