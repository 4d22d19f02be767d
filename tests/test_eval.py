"Exact evaluation: under DDP, validate(), the recorded metrics and get_preds() equal one process's, for any world size"
import pytest
from fastddp.testing import run_ranks

# Each rank first evaluates the learners alone (the single-process reference, same weights), then inside `distrib_ctx`.
EVAL = '''
import sys
import pandas as pd
from fastai.tabular.all import *
from fastai.vision.all import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.data import make_adult
path, text = Path(sys.argv[1]), sys.argv[2]=='text'
defaults.cpus = 0 # tokenise in-process: no worker pools inside the ranks
set_seed(0)
out = {}
def both(nm, learn, test_items=None, **kw):
    "Evaluate `learn` alone, then data-parallel; keep everything to compare"
    def ev():
        r = dict(val=learn.validate(), preds=learn.get_preds(with_decoded=True, **kw))
        if test_items is not None: r['test'] = learn.get_preds(dl=learn.dls.test_dl(test_items))[0]
        return r
    one = ev()
    with learn.distrib_ctx():
        ddp = ev()
        learn.fit(1, 1e-3) # the metrics fastai prints and records after an epoch
        rec = learn.recorder.values[-1]
    out[nm] = dict(one=one, ddp=ddp, rec=rec, rec_one=list(learn.validate()))

# tabular classification on the Adult layout; 23 validation rows, bs 4: neither a multiple of 2, 3, 4 nor of the batch
src = rank0_first(make_adult, path, n=150)
df = pd.read_csv(src/'adult.csv')
cat = ['workclass','education','marital-status','occupation','relationship','race']
cont = ['age','fnlwgt','education-num']
splits = (list(range(127)), list(range(127,150)))
to = TabularPandas(df, [Categorify, FillMissing, Normalize], cat, cont, y_names='salary', splits=splits)
dls = to.dataloaders(bs=4, device='cpu')
both('tab', tabular_learner(dls, layers=[16], metrics=[accuracy, error_rate, F1Score(), RocAucBinary()]), test_items=df.iloc[:7],
     with_input=True)

# tabular regression: rmse (AccumMetric) and R2
tr = TabularPandas(df, [Categorify, FillMissing, Normalize], cat, ['fnlwgt','education-num'], y_names='age', y_block=RegressionBlock(),
                   splits=splits)
both('reg', tabular_learner(tr.dataloaders(bs=4, device='cpu'), layers=[16], metrics=[rmse, R2Score()]))

# vision classification: a CNN with BatchNorm on 10 images, fewer than the batch size
x = torch.randn(30,3,16,16); y = (x.mean((1,2,3))>0).long()
ds = [(TensorImage(a), TensorCategory(b)) for a,b in zip(x,y)]
vdl = DataLoaders(DataLoader(ds[:20], bs=4, shuffle=True), DataLoader(ds[20:], bs=4), device='cpu')
cnn = nn.Sequential(ConvLayer(3,8,stride=2), ConvLayer(8,8,stride=2), nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(8,2))
both('vision', Learner(vdl, cnn, loss_func=CrossEntropyLossFlat(), metrics=[accuracy, F1Score()]))

# fewer validation items than ranks: 2 items (a rank gets none)
small = DataLoaders(DataLoader(ds[:20], bs=4), DataLoader(ds[20:22], bs=4), device='cpu')
torch.manual_seed(0)
both('tiny', Learner(small, nn.Sequential(Flatten(), nn.Linear(768,2)), loss_func=CrossEntropyLossFlat(), metrics=accuracy))

# an empty validation set: no hang, the single-process result ([None, None])
empty = DataLoaders(DataLoader(ds[:20], bs=4), DataLoader([], bs=4), device='cpu')
el = Learner(empty, nn.Sequential(Flatten(), nn.Linear(768,2)), loss_func=CrossEntropyLossFlat(), metrics=accuracy)
with el.distrib_ctx(): out['empty'] = dict(one=[None,None], ddp=list(el.validate()))

if text: # a text classifier (AWD-LSTM, no pretrained weights here)
    from fastai.text.all import *
    words = [['good','great','fine','nice'], ['bad','awful','poor','dull']]
    rng = np.random.default_rng(0)
    lbl = rng.integers(0, 2, 40)
    tdf = pd.DataFrame({'text': [' '.join(rng.choice(words[l], 6)) for l in lbl], 'label': lbl, 'is_valid': [i>=29 for i in range(40)]})
    tdls = TextDataLoaders.from_df(tdf, text_col='text', label_col='label', valid_col='is_valid', bs=4, seq_len=16, device='cpu')
    both('text', text_classifier_learner(tdls, AWD_LSTM, pretrained=False, metrics=accuracy))
    # rank-safe callbacks: one CSV log, the best model saved once and reloaded everywhere, early stopping on the
    # global metric, lr_find restoring the same weights with the same suggestion on every rank
    learn = tabular_learner(dls, layers=[16], metrics=accuracy, path=path/'run')
    w0 = [p.detach().clone() for p in learn.model.parameters()]
    with learn.distrib_ctx():
        sug = learn.lr_find(num_it=12, show_plot=False)
        back = all(torch.equal(a,b) for a,b in zip(w0, learn.model.parameters()))
        learn.fit(3, 1e-2, cbs=[CSVLogger(), SaveModelCallback(fname='best'), EarlyStoppingCallback(patience=0, min_delta=10)])
    learn.export('export.pkl')
    distrib_barrier()
    out['cbs'] = dict(sug=float(sug.valley), back=back, w=[p.detach().clone() for p in learn.model.parameters()],
                      csv=(path/'run'/'history.csv').read_text(), epochs=len(learn.recorder.values),
                      files=sorted(str(o.relative_to(path/'run')) for o in (path/'run').rglob('*') if o.is_file()))
report(**out)
'''

def _close(a, b, rel=1e-6):
    a,b = float(a),float(b)
    return abs(a-b) <= rel*max(1., abs(b))

def _eq_tensors(a, b):
    import torch
    if isinstance(a, (list, tuple)): return len(a)==len(b) and all(_eq_tensors(x,y) for x,y in zip(a,b))
    if a is None: return b is None
    return a.shape==b.shape and torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6)

# 1 and 2 ranks in the fast tier; 3 and 4 (uneven splits, padding) only in `make test`: 4 ranks on 2 cores take the longest
# 4 ranks covers what 3 did (23 rows padded by 1, 10 images by 2, a rank with no item of the 2-item set) and a batch cut short
@pytest.mark.parametrize('ws,text', [(1,False), (2,True), pytest.param(4, False, marks=pytest.mark.slow)])
def test_exact_eval(ws, text, tmp_path):
    rs = run_ranks(EVAL, n=ws, args=[tmp_path/'adult', 'text' if text else 'no'], launcher='torchrun', timeout=600)
    for r,o in enumerate(rs):
        for nm,d in o.items():
            if nm=='cbs': continue
            if nm=='empty': assert d['ddp']==[None, None]; continue
            one,ddp = d['one'],d['ddp']
            assert all(_close(a,b) for a,b in zip(ddp['val'], one['val'])), (r, nm, ddp['val'], one['val'])
            assert _eq_tensors(ddp['preds'], one['preds']), (r, nm)        # dataset order, no duplicates, inputs and decoded too
            if 'test' in one: assert _eq_tensors(ddp['test'], one['test']), (r, nm)
            # the values recorded after a data-parallel epoch equal one process's evaluation of the weights it ended with
            assert all(_close(a,b) for a,b in zip(d['rec'][1:1+len(d['rec_one'])], d['rec_one'])), (r, nm, d['rec'], d['rec_one'])
    assert set(rs[0])=={'tab','reg','vision','tiny','empty'} | ({'text','cbs'} if text else set())
    if text:
        cb = [o['cbs'] for o in rs]
        assert all(o['back'] for o in cb) and len({o['sug'] for o in cb})==1      # lr_find: same suggestion, weights restored
        assert all(_eq_tensors(o['w'], cb[0]['w']) for o in cb)                   # the best model, reloaded on every rank
        assert {o['epochs'] for o in cb}=={2}                                     # early stopping after the 2nd epoch, everywhere
        lines = cb[0]['csv'].splitlines()
        assert len(lines)==3 and lines[0].startswith('epoch,train_loss,valid_loss,accuracy')  # the header and 2 epochs, once
        assert cb[0]['files']==['export.pkl', 'history.csv', 'models/best.pth']
