("Streams under DDP: each rank and worker reads its own part, equal steps, exact validation, "
 "resume; WebDataset shards and Hugging Face streaming from local files")
import os, pytest
from fastddp.testing import run_ranks

pytest.importorskip('webdataset'); pytest.importorskip('datasets')

# Every rank: writes (rank 0 first) 7 tar shards of uneven sizes with wds.TarWriter and the same rows as CSV files, then trains
# and validates on several sources, reporting the ids it trained per epoch, its steps, what it left, and its validation.
STREAM = '''
import sys, json, tarfile
from pathlib import Path
import webdataset as wds
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.stream import *
from fastddp.checkpoint import Checkpoint
from fastddp.timecost import TimeCost
path,full = Path(sys.argv[1]),sys.argv[2]=='full'
defaults.callbacks = [TrainEvalCallback, Recorder] # no progress bars
sizes = [12,9,11,10,8,10,10] # 70 items in 7 uneven shards
def write():
    path.mkdir(parents=True, exist_ok=True)
    i = 0
    for s,n in enumerate(sizes):
        with wds.TarWriter(str(path/f'shard-{s:02d}.tar')) as w:
            for _ in range(n): w.write({'__key__': f'{i:05d}', 'cls': i, 'x.pyd': [i/70, (i%7)/7, (i%3)/3]}); i += 1
        rows = range(i-n, i)
        (path/f'part-{s:02d}.csv').write_text('id,a,b,c\\n'+''.join(f'{j},{j/70},{(j%7)/7},{(j%3)/3}\\n' for j in rows))
rank0_first(write)
files = sorted(map(str, path.glob('shard-*.tar')))
def item(d): return tensor(d['x.pyd']).float(), tensor(d['cls'])
def read(f): return map(item, wds.WebDataset(f, shardshuffle=False, nodesplitter=None, workersplitter=None).decode())
class Rows(torch.utils.data.IterableDataset): # no shards: fastddp strides by item
    def __iter__(self):
        for i in range(70): yield tensor([i/70, (i%7)/7, (i%3)/3]), tensor(i)
def hf():
    from datasets import load_dataset
    ds = load_dataset('csv', data_files=sorted(map(str, path.glob('part-*.csv'))), split='train', streaming=True)
    return ds
def hf_item(d): return tensor([d['a'], d['b'], d['c']]).float(), tensor(d['id'])
def sources():
    yield 'shards', Shards(files, read, shuffle=True, buffer=8, seed=1), Shards(files, read), {} # validation: in the stream's order
    yield 'rows', Rows(), None, {}
    yield 'wds', wds.WebDataset(files, shardshuffle=False, nodesplitter=wds.split_by_node).decode().map(item), None, {}
    # its reference reads all shards (split_by_node reads RANK, set in this process even outside distrib_ctx)
    yield 'wdsref', wds.WebDataset(files, shardshuffle=False, nodesplitter=None).decode().map(item), None, {}
    yield 'hf', hf(), None, dict(after_item=hf_item)

class Ids(Callback):
    "The ids of each batch this rank trained (skipped batches of a resume are not trained: no step), and what it left, per epoch"
    order = 100
    def before_fit(self): self.b,self.left = {0:[],1:[]},{}
    def after_step(self): self.b[self.epoch].append(self.yb[0].tolist())
    def after_train(self): self.left[self.epoch] = getattr(self.dl, 'n_left', 0)
    @property
    def ids(self): return [sum(self.b[e], []) for e in (0,1)]
    @property
    def steps(self): return [len(self.b[e]) for e in (0,1)]

def loss(p, y): return F.cross_entropy(p, y%2)
def acc(p, y): return (p.argmax(-1)==y%2).float().mean()
class Mse(AccumMetric):
    def __init__(self): super().__init__(lambda p,y: ((p[:,1]-p[:,0])-(y%2).float()).pow(2).mean(), flatten=False)
def learner(src, nw, kw, vsrc=None, **lk):
    torch.manual_seed(0)
    dls = DataLoaders(DataLoader(src, bs=4, n=70, num_workers=nw, **kw), DataLoader(vsrc or src, bs=4, n=70, num_workers=nw, **kw),
                      device='cpu')
    return Learner(dls, nn.Linear(3,2), loss_func=loss, metrics=[acc, Mse()], **lk)

out = {}
ss = list(sources())
for name,src,vsrc,kw in ss:
    if name=='wdsref': continue
    # workers 0 and 2 on fastddp's own split, 2 on the others; and 4 on WebDataset's split (3 ranks: 2 shards on rank 1 feed 2 of them)
    for nw in ((0,2) if name=='shards' else (2,4) if name=='wds' and not full else (2,)):
        # the single-process reference: the same weights, the whole validation stream in one process
        l = learner(ss[3][1] if name=='wds' else src, 0, kw, vsrc)
        one = dict(val=list(l.validate()), preds=l.get_preds()[0].tolist())
        l = learner(src, nw, kw, vsrc)
        with l.distrib_ctx():
            ddp = dict(val=list(l.validate()), preds=l.get_preds()[0].tolist())
            l.fit(2, 1e-2, cbs=(c:=Ids()))
        out[f'{name}{nw}'] = dict(ids=c.ids, steps=c.steps, left=[c.left[0],c.left[1]], one=one, ddp=ddp)

# a stream of unknown length: one message that names n=
l = Learner(DataLoaders(DataLoader(Rows(), bs=4), DataLoader(Rows(), bs=4, n=70), device='cpu'), nn.Linear(3,2), loss_func=loss)
try:
    with l.distrib_ctx(): l.fit(1)
    out['nolen'] = 'no error'
except DistribError as e: out['nolen'] = str(e)

if full:
    # resume mid-epoch: a run killed after the checkpoint at step 3 of epoch 1 continues where each rank was
    src = Shards(files, read, shuffle=True, buffer=8, seed=3)
    def run(cbs, ck=None):
        l = learner(src, 2, {}, path=path, cbs=ck)
        with l.distrib_ctx(): l.fit(2, 1e-2, cbs=cbs)
        return l
    ref = run([c:=Ids()])
    class Die(Callback):
        def after_batch(self):
            if self.training and self.epoch==1 and self.iter==4: raise RuntimeError('killed')
    try: run([Ids(), Die()], ck=Checkpoint('ck', every=3))
    except RuntimeError as e: assert 'killed' in str(e)
    res = run([r:=Ids()], ck=Checkpoint('ck', every=3))
    out['resume'] = dict(ref=c.b, b=r.b, ck=sorted(o.name for o in (path/'ck').iterdir()),
                         w_ref=[p.tolist() for p in ref.model.parameters()], w=[p.tolist() for p in res.model.parameters()])
    # TimeCost sees the streaming ranks' data wait
    l = learner(Shards(files, read), 2, {})
    with l.distrib_ctx(): l.fit(1, 1e-2, cbs=(tc:=TimeCost(skip=1, show=False)))
    if rank()==0: out['tc'] = {k:float(v) for k,v in tc.stats()['share'].items()}
report(**out)
'''

def _check(rs, ws, full):
    ids = set(range(70))
    for k in rs[0]:
        if k in ('nolen','resume','tc'): continue
        rep = [r[k] for r in rs]
        for e in range(2):
            trained = [i for r in rep for i in r['ids'][e]]
            steps = [r['steps'][e] for r in rep]
            assert len(set(steps))==1, f"{k} epoch {e}: unequal steps {steps}"
            assert len(trained)==len(set(trained)), f"{k} epoch {e}: an item trained twice"
            left = sum(r['left'][e] for r in rep)
            assert len(trained)+left==70, f"{k} epoch {e}: {len(trained)} trained + {left} left" # every item read, trained or counted
            # fastddp's own split (shards, striding): what is left is less than a global batch (4 per rank)
            if k.startswith(('shards','rows')): assert left<4*ws, f"{k} epoch {e}: {left} items left"
        one,ddp = rep[0]['one'],rep[0]['ddp']
        assert all(abs(a-b)<=1e-6 for a,b in zip(one['val'], ddp['val'])), f"{k}: validation {ddp['val']} vs one process {one['val']}"
        if k.startswith(('shards','rows')): # keys known: the stream's order
            assert len(one['preds'])==70 and all(abs(a-b)<=1e-6 for p,q in zip(one['preds'], ddp['preds'])
                                                 for a,b in zip(p,q)), f"{k}: get_preds order"
        else: # rank order
            assert all(abs(a-b)<=1e-6 for p,q in zip(sorted(one['preds']), sorted(ddp['preds']))
                       for a,b in zip(p,q)) and len(ddp['preds'])==70, f"{k}: get_preds"
    assert 'pass n=' in rs[0]['nolen'], rs[0]['nolen']

def test_stream_2_ranks(tmp_path):
    "2 ranks, workers 0 and 2, four sources, resume mid-epoch, TimeCost"
    rs = run_ranks(STREAM, n=2, args=[tmp_path/'data', 'full'], env={'OMP_NUM_THREADS': '1', 'HF_DATASETS_OFFLINE': '1',
                                                                     'HF_HUB_OFFLINE': '1'}, timeout=600)
    _check(rs, 2, True)
    for r in rs: # the resumed run trains what the uninterrupted one trained from the checkpoint (step 3 of epoch 1) on, to the same weights
        rr = r['resume']
        assert rr['b'][0]==[] and 0<len(rr['b'][1])<len(rr['ref'][1]), rr # epoch 0 done before the kill, epoch 1 resumed mid-way
        assert rr['b'][1]==rr['ref'][1][-len(rr['b'][1]):], (rr['b'], rr['ref'])
        assert all(abs(a-b)<=1e-6 for p,q in zip(rr['w'], rr['w_ref'])
                   for a,b in zip(sum(p,[]) if isinstance(p[0], list) else p, sum(q,[]) if isinstance(q[0], list) else q))
    assert 0<rs[0]['tc']['data']<1

def test_stream_3_ranks(tmp_path):
    "3 ranks, 2 workers each: 6 parts over 7 uneven shards; WebDataset with 4 workers a rank, which its shards cannot feed"
    rs = run_ranks(STREAM, n=3, args=[tmp_path/'data', 'short'], env={'OMP_NUM_THREADS': '1', 'HF_DATASETS_OFFLINE': '1',
                                                                      'HF_HUB_OFFLINE': '1'}, timeout=600)
    _check(rs, 3, False)
    assert 'wds4' in rs[0] and "WebDataset: 7 shard(s) on 3 rank(s) leave a rank 2 shard(s) for num_workers=4" in rs.out, rs.out[-3000:]
