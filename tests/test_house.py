"Importing fastddp changes nothing in a one-process fit, and every method fastddp adds to `Learner` can be called twice"
import json, sys, subprocess
import pytest
from fastddp.testing import run_ranks

FIT = r'''
import sys, json, hashlib, torch, warnings
warnings.filterwarnings('ignore')
if sys.argv[1]=='fastddp': import fastddp
from fastai.tabular.all import *
from fastai.vision.all import *
from fastai.distributed import *
from fastddp.data import make_adult, make_pets
d = Path(sys.argv[2])
def tab():
    df = pd.read_csv(make_adult(d, n=400)/'adult.csv')
    dls = TabularDataLoaders.from_df(df, path=d, procs=[Categorify, FillMissing, Normalize], cat_names=['workclass','education','sex'],
        cont_names=['age','fnlwgt','education-num'], y_names='salary', valid_idx=list(range(300,400)), bs=32, num_workers=0)
    return tabular_learner(dls, layers=[32,16], metrics=[accuracy, F1Score()])
def vis():
    p = make_pets(d, n=148, size=48)/'images'
    lbl = lambda o: re.match(r'^(.+)_\d+\.jpg$', o.name).group(1)
    fs = sorted(get_image_files(p)); fs = [o for o in fs if lbl(o) in sorted(set(map(lbl, fs)))[:4]] # 4 breeds, 4 images each
    valid = {o for i,o in enumerate(fs) if i%4==0}
    dls = DataBlock((ImageBlock, CategoryBlock), get_items=lambda _: fs, get_y=lbl, splitter=FuncSplitter(lambda o: o in valid),
        item_tfms=Resize(32), batch_tfms=aug_transforms(size=32)).dataloaders(p, bs=4, num_workers=0)
    return vision_learner(dls, resnet18, pretrained=False, metrics=error_rate)
out = {}
for nm,mk in (('tab',tab),('vis',vis)):
    set_seed(0, reproducible=True)
    learn = mk()
    vals = []
    with learn.no_bar(), learn.no_logging():
        learn.fit_one_cycle(2, 1e-3); vals += learn.recorder.values
        lr = learn.lr_find(show_plot=False, num_it=5)
        learn.fit(1, 1e-3); vals += learn.recorder.values
        preds,targs = learn.get_preds()
    # the weights' bytes hashed: bit-identical or not, without printing resnet18's 11M floats as JSON
    w = hashlib.sha256(b''.join(p.detach().numpy().tobytes() for p in learn.model.parameters())).hexdigest()
    out[nm] = dict(w=w, vals=[list(map(float, v)) for v in vals],
                   preds=preds.flatten().tolist(), lr=float(lr.valley))
print(json.dumps(out))
'''

@pytest.mark.slow
def test_one_process_identical(tmp_path):
    "A one-process fit, `lr_find` and `get_preds` (tabular and vision) give bit-identical numbers with and without `import fastddp`"
    fn = tmp_path/'fit.py'; fn.write_text(FIT)
    res = {}
    for k in ('plain', 'fastddp'):
        p = subprocess.run([sys.executable, str(fn), k, str(tmp_path)], capture_output=True, text=True, timeout=600)
        assert p.returncode==0, p.stderr[-3000:]
        res[k] = json.loads(p.stdout.strip().splitlines()[-1])
    for nm in ('tab','vis'):
        a,b = res['plain'][nm],res['fastddp'][nm]
        assert len(a['vals'])==3 and a['w'], a['vals']
        assert a==b, f"{nm}: a one-process fit differs with fastddp imported"

TWICE = '''
import warnings; warnings.filterwarnings('ignore')
from fastai.tabular.all import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.timecost import TimeCost
from fastddp.data import make_adult
d = Path(sys.argv[1])
df = pd.read_csv(make_adult(d/f'r{rank()}', n=200)/'adult.csv')
set_seed(0) # the same random split on every rank (fastddp stops a run whose ranks hold different data)
dls = TabularDataLoaders.from_df(df, path=d/f'r{rank()}', procs=[Categorify, Normalize], cat_names=['sex'], cont_names=['age'],
    y_names='salary', bs=16, num_workers=0)
learn = tabular_learner(dls, layers=[8], metrics=accuracy)
out = {}
with learn.no_bar(), learn.no_logging():
    learn.add_time_cost(show=False); learn.add_time_cost(show=False, skip=1)
    out['time_costs'] = sum(isinstance(o, TimeCost) for o in learn.cbs)
    out['skip'] = learn.time_cost.skip
    for i in range(2):
        with learn.distrib_ctx(): learn.fit(1)
    out['report'] = 'samples/s' in str(learn.time_cost.report())
    learn.to_distributed(); learn.to_distributed()
    out['trainers'] = sum(isinstance(o, DistributedTrainer) for o in learn.cbs)
    learn.detach_distributed(); learn.detach_distributed()
    out['trainers_after'] = sum(isinstance(o, DistributedTrainer) for o in learn.cbs)
    learn.path = d # rank 0 saves, every rank loads
    for i in range(2): learn.save('m'); distrib_barrier(); learn.load('m'); distrib_barrier() # rank 0's next save overwrites 'm'
    for i in range(2): learn.export('e.pkl')
    distrib_barrier()
    out['export'] = (learn.path/'e.pkl').exists()
    for i in range(2): learn.to_detach(torch.ones(2))
report(**out)
'''

def test_methods_twice(tmp_path):
    "Each method fastddp adds to `Learner`, called twice in a row, does what one call does (2 ranks, and one process)"
    for n,launcher in ((2,'fastddp'), (1,'python')):
        rs = run_ranks(TWICE, n=n, args=[tmp_path], launcher=launcher)
        for r in rs: assert r==dict(time_costs=1, skip=1, report=True, trainers=1, trainers_after=0, export=True), r
