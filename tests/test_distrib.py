"Foundation: `learn.distrib_ctx()` trains data-parallel on gloo with every launcher, and gives one process's weights"
import math, pytest, re
from fastddp.launch import free_port
from fastddp.testing import run_ranks

# One launch checks many things: each rank reports what it saw, the test asserts on the reports.
EQUIV = '''
import sys, time, os
from pathlib import Path
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
n,bs,ws = int(sys.argv[1]),2,world_size()
set_seed(0)
x = torch.randn(n,3); y = x@tensor([1.,-2.,3.])[:,None]+0.1
dsets = list(zip(x,y))
def mk(items, bs, shuffle=False):
    dls = DataLoaders(DataLoader(items, bs=bs, shuffle=shuffle), DataLoader(dsets[:5], bs=bs), device='cpu')
    torch.manual_seed(1)
    return Learner(dls, nn.Linear(3,1), loss_func=MSELossFlat(), opt_func=SGD, lr=0.1)

# rank0_first: rank 0 runs first, the others after it finished (checked through the filesystem)
log = Path(sys.argv[2])
def _f():
    with log.open('a') as f: f.write(f"start {rank()}\\n")
    if rank()==0: time.sleep(1)
    with log.open('a') as f: f.write(f"end {rank()}\\n")
    return rank()
report(r0f=rank0_first(_f))

# same weights as one process with a ws-times larger batch over the same samples
learn = mk(dsets, bs)
class Typ(Callback):
    def after_batch(self): report(in_ctx=type(self.learn.model).__name__)
with learn.distrib_ctx(): learn.fit(2, cbs=Typ())
report(w=learn.model.weight.detach().clone(), model=type(learn.model).__name__, losses=[float(o) for o in learn.recorder.losses],
       vals=learn.recorder.values,
       cbs=[type(o).__name__ for o in learn.cbs])
if rank()==0:
    m = -(-n//ws)
    order = (list(range(n))*2)[:m*ws] # one process's order, with the items the ranks repeat to take equal shares
    ref = mk([dsets[i] for i in order], bs*ws)
    ref.fit(2)
    report(ref=ref.model.weight.detach().clone(), ref_losses=[float(o) for o in ref.recorder.losses], ref_vals=ref.recorder.values)
    # after the context, the learner trains as a single process again, on rank 0 alone
    w0 = learn.model.weight.detach().clone()
    learn.fit(1)
    report(single_again=not torch.equal(w0, learn.model.weight))

# the shards each rank sees per epoch, with shuffling
seen = []
class Rec(Callback):
    def before_epoch(self): seen.append([])
    def after_batch(self):
        if self.training: seen[-1] += [int(o) for o in self.learn.xb[0][:,0]]
idx = [(tensor([float(i)]), tensor([0.])) for i in range(n)]
sl = Learner(DataLoaders(DataLoader(idx, bs=bs, shuffle=True), DataLoader(idx[:3], bs=bs), device='cpu'), nn.Linear(1,1),
             loss_func=MSELossFlat(), cbs=Rec())
with sl.distrib_ctx(): sl.fit(2, 0)
report(seen=seen)
'''

def _check_equiv(rs, n, ws, log):
    test_ws = len(rs)
    assert test_ws==ws
    for o in rs:
        assert o['in_ctx']=='DistributedDataParallel' and o['model']=='Linear' and not {'DistributedTrainer','EpochLoss'} & set(o['cbs'])
    for o in rs[1:]: assert (o['w']-rs[0]['w']).abs().max()<1e-6, "ranks ended with different weights"
    assert (rs[0]['w']-rs[0]['ref']).abs().max()<1e-5, (rs[0]['w'], rs[0]['ref'])
    assert rs[0]['single_again']
    # the smoothed training loss, recorded per step and per epoch, is the one-process loss of the global batch, on every rank
    for o in rs:
        assert (all(abs(a-b)<1e-5*max(1,abs(b)) for a,b in zip(o['losses'], rs[0]['ref_losses']))
                and len(o['losses'])==len(rs[0]['ref_losses']))
        assert all(abs(x-y)<1e-5*max(1,abs(y)) for a,b in zip(o['vals'], rs[0]['ref_vals']) for x,y in zip(a,b)) # train and valid loss
    # rank0_first: rank 0 started and ended before any other rank started
    lines = log.read_text().split()
    ev = list(zip(lines[::2], lines[1::2]))
    assert ev[:2]==[('start','0'),('end','0')], ev
    assert [o['r0f'] for o in rs]==list(range(ws))
    # shards: disjoint apart from the padding, covering the data set, different from one epoch to the next
    m = -(-n//ws)
    for e in range(2):
        shards = [o['seen'][e] for o in rs]
        assert all(len(s)==m for s in shards)
        allv = sum(shards, [])
        assert set(allv)==set(range(n))
        assert len(allv)-len(set(allv))==m*ws-n
    assert [o['seen'][0] for o in rs]!=[o['seen'][1] for o in rs]

@pytest.mark.smoke
@pytest.mark.parametrize('launcher,ws,n', [('torchrun',2,11), ('accelerate',3,22)])
def test_equivalence(launcher, ws, n, tmp_path):
    "N ranks with batch bs = one process with batch N*bs; plus rank0_first order and the shards, in the same launch"
    log = tmp_path/'order.log'
    rs = run_ranks(EQUIV, n=ws, args=[n, log], launcher=launcher)
    _check_equiv(rs, n, ws, log)

WS1 = '''
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
x = torch.randn(8,2); dsets = list(zip(x, x.sum(1, keepdim=True)))
learn = Learner(DataLoaders(DataLoader(dsets, bs=4), DataLoader(dsets, bs=4), device='cpu'), nn.Linear(2,1), loss_func=MSELossFlat())
w0 = learn.model.weight.detach().clone()
with learn.distrib_ctx(): learn.fit(1)
report(trained=not torch.equal(w0, learn.model.weight.detach().cpu()), cbs=[type(o).__name__ for o in learn.cbs], ws=world_size())
if not has_cuda():
    try:
        with learn.distrib_ctx(backend='nccl'): pass
    except DistribError as e: report(nccl=str(e))
'''

def test_world_size_1():
    "Under `torchrun --nproc_per_node 1` the context trains and cleans up (fastai left the trainer in `learn.cbs`)"
    rs = run_ranks(WS1, n=1, launcher='torchrun')
    assert rs[0]['trained'] and rs[0]['ws']==1
    assert 'DistributedTrainer' not in rs[0]['cbs']
    from fastddp.core import has_cuda
    if not has_cuda(): assert "needs a CUDA GPU" in rs[0]['nccl']

# Accelerate leaves a one-process model unwrapped on a GPU; on a CPU machine `cpu=False` does the same at any world size
UNWRAPPED = '''
import fastddp.distrib
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
x = torch.randn(8,2); dsets = list(zip(x, x.sum(1, keepdim=True)))
def mk():
    torch.manual_seed(0)
    return Learner(DataLoaders(DataLoader(dsets, bs=4), DataLoader(dsets, bs=4), device='cpu'), nn.Linear(2,1), loss_func=MSELossFlat())
class Typ(Callback):
    def after_batch(self): report(in_fit=type(self.learn.model).__name__)
learn = mk()
try:
    with learn.distrib_ctx(cpu=False): learn.fit(2, cbs=Typ())
    report(model=type(learn.model).__name__, w=learn.model.weight.detach().clone(), vals=learn.recorder.values,
           group=torch.distributed.is_initialized(), leaves=bool(fastddp.distrib._leaving))
except Exception as e: report(err=f"{type(e).__name__}: {e}")
if world_size()==1:
    ref = mk(); ref.fit(2)
    report(ref=ref.model.weight.detach().clone(), ref_vals=ref.recorder.values)
'''

def test_unwrapped_model():
    "A model Accelerate leaves unwrapped (one process on one GPU) trains to one process's numbers; at 2 ranks: one clear error"
    import torch
    r = run_ranks(UNWRAPPED, n=1, launcher='torchrun')[0]
    assert 'err' not in r, r['err']
    assert (r['in_fit'], r['model']) == ('Linear', 'Linear') # never wrapped, given back as it was
    assert torch.equal(r['w'], r['ref']) and r['vals']==r['ref_vals']
    assert r['leaves'] or not r['group'] # the one-rank group Accelerate made is left at exit
    rs = run_ranks(UNWRAPPED, n=2, launcher='fastddp')
    assert all("Accelerate left the model unwrapped at 2 ranks" in o['err'] for o in rs), [o.get('err') for o in rs]

VISION_TAB = '''
import pandas as pd
from fastai.vision.all import *
from fastai.tabular.all import *
from fastai.distributed import *
from torchvision.models import resnet18
from fastddp.core import *; from fastddp.testing import report
set_seed(0)
# a torchvision resnet with BatchNorm, default distrib_ctx arguments
x = torch.randn(16,3,32,32); y = torch.randint(0,2,(16,))
ds = [(TensorImage(a), TensorCategory(b)) for a,b in zip(x,y)]
dls = DataLoaders(DataLoader(ds, bs=4, shuffle=True), DataLoader(ds[:6], bs=4), device='cpu')
learn = vision_learner(dls, resnet18, n_out=2, pretrained=False, loss_func=CrossEntropyLossFlat(), metrics=accuracy)
with learn.distrib_ctx(): learn.fit(1, 1e-3)
report(vision=[p.detach().clone() for p in learn.model.parameters()], vis_loss=learn.recorder.values[-1][1])
# a tabular learner
df = pd.DataFrame({'a': np.random.randn(64), 'b': np.random.choice(['u','v'], 64)}); df['y'] = (df.a>0).astype(int)
tdl = TabularDataLoaders.from_df(df, procs=[Categorify, Normalize], cat_names=['b'], cont_names=['a'], y_names='y', y_block=CategoryBlock(),
                                 bs=8, device='cpu')
from fastddp.checkpoint import Checkpoint
import tempfile
tl = tabular_learner(tdl, layers=[8], metrics=accuracy, path=tempfile.mkdtemp(), cbs=Checkpoint()) # it checks its stop flag each epoch
with tl.distrib_ctx():
    tl.fit(1, 1e-2)
    if rank()==0: row = tl.predict(df.iloc[0])[2] # rank 0 alone (a row's probabilities), then a fit of every rank
    tl.fit(1, 1e-2)
report(tab=[p.detach().clone() for p in tl.model.parameters()], tab_loss=tl.recorder.values[-1][1], row=row if rank()==0 else None)
# categorical columns only: fastai's model keeps an empty `bn_cont`, which no forward uses (DDP waited for its gradient)
cdl = TabularDataLoaders.from_df(df, procs=[Categorify], cat_names=['b'], cont_names=[], y_names='y', y_block=CategoryBlock(), bs=8,
                                 valid_idx=range(52, 64), device='cpu') # rank 0's predict drew from the random state: a fixed split
cl = tabular_learner(cdl, layers=[8])
with cl.distrib_ctx(): cl.fit(1, 1e-2)
report(cat=[p.detach().clone() for p in cl.model.parameters()], cat_clean=not hasattr(cl.model, '_ddp_params_and_buffers_to_ignore'))
# fastai's nbs/examples/train_imagenette.py: an xresnet with self-attention and Mish, ranger, label smoothing, to_fp16, MixUp,
# fit_flat_cos, and `learn.to_distributed(gpu)`, written when the first argument was the GPU (fastai <2.7): an int, read as such
xl = Learner(dls, xresnet18(n_out=2, act_cls=Mish, sa=1, pool=MaxPool), opt_func=partial(ranger, mom=0.9, sqr_mom=0.99, eps=1e-6, beta=0.),
             metrics=accuracy, loss_func=LabelSmoothingCrossEntropy()).to_fp16()
xl.to_distributed(local_rank())
xl.fit_flat_cos(1, 1e-2, wd=1e-2, cbs=MixUp(0.2))
xl.detach_distributed()
report(xres=[p.detach().clone() for p in xl.model.parameters()], xres_loss=xl.recorder.values[-1][1])
# a branch no forward uses: DDP stops at the next step, and the message names what got no gradient
class Two(nn.Module):
    def __init__(self): super().__init__(); self.a,self.b = nn.Linear(2,1),nn.Linear(2,1)
    def forward(self, x): return self.a(x)
xy = list(zip(torch.randn(16,2), torch.randn(16,1)))
ul = Learner(DataLoaders(DataLoader(xy, bs=4), DataLoader(xy, bs=4), device='cpu'), Two(), loss_func=MSELossFlat())
try:
    with ul.distrib_ctx(): ul.fit(1)
except DistribError as e: report(unused=str(e))
'''

def test_vision_tabular():
    ("A resnet with BatchNorm, a tabular learner (rank 0 alone predicting a row between two fits), one with categorical columns only "
     "and fastai's train_imagenette.py "
     "train under 2-process DDP with default arguments; "
     "sync_bn is off on CPU, said once; `to_distributed(gpu)` of fastai <2.7 reads the int as the GPU, said once")
    rs = run_ranks(VISION_TAB, n=2, launcher='fastddp')
    import torch
    # every parameter tensor equal on both ranks: DDP gives each the same averaged gradients (BatchNorm's running
    # statistics are buffers, per rank on CPU, and not compared)
    for k in ('vision','tab','xres','cat'):
        a,b = rs[0][k],rs[1][k]
        assert len(a)==len(b)>0 and all(torch.equal(x,y) for x,y in zip(a,b)), k
    assert all(o['vis_loss']==o['vis_loss'] and o['tab_loss']==o['tab_loss'] and o['xres_loss']==o['xres_loss'] for o in rs) # no NaN
    msg = "no gradient in this step (a branch the model did not use: b.weight, b.bias): pass find_unused_parameters=True"
    assert all(msg in o['unused'] for o in rs), [o.get('unused') for o in rs]
    assert all(o['cat_clean'] for o in rs) # the model as it was after the fit (DDP's list of what to leave out taken back)
    assert rs[0]['row'].shape==(2,) and rs[1]['row'] is None # `predict` on rank 0 alone inside the context (it waited for rank 1)
    assert rs.out.count("sync_bn is off on CPU")==1, rs.out[-2000:]
    assert rs.out.count("to_distributed(0): since fastai 2.7 the first argument is sync_bn")==1, rs.out[-2000:]

# fastai's notebook of distributed examples (nbs/examples/distributed_app_examples.ipynb): the segmentation, collaborative filtering
# and keypoint learners, as written there, on small data generated in the shape of CAMVID_TINY, ML_SAMPLE and BIWI_HEAD_POSE (made
# before the launch, as `untar_data` runs there); its image and text classifiers and its tabular learner: the scripts
NOTEBOOK = '''
import sys, time
import fastddp
from accelerate import notebook_launcher
from fastai.vision.all import *
from fastai.collab import *
from fastai.distributed import *
from fastddp.core import world_size
from fastddp.testing import report
root,rng = Path(sys.argv[2]),np.random.default_rng(0)
seg,pts = root/'camvid_tiny',root/'biwi'
for d in (seg/'images', seg/'labels', pts/'01', pts/'13'): d.mkdir(parents=True)
for i in range(16): # a bright square (code 1) and a red one (code 2) on noise
    m = np.zeros((32,32), np.uint8); r = rng.integers(4, 16); m[:r,:r] = 1; m[-r:,-r:] = 2
    img = (rng.random((32,32,3))*60).astype(np.uint8); img[m==1] += 150; img[m==2,0] = 250
    PILImage.create(img).save(seg/'images'/f'im{i:02d}.png'); PILMask.create(m).save(seg/'labels'/f'im{i:02d}_P.png')
np.savetxt(seg/'codes.txt', np.array(['Void','Sky','Car']), fmt='%s')
for i in range(24): # a white dot; its centre in a `_pose.txt` beside the image
    x,y = rng.integers(4, 28, 2); img = np.zeros((32,32,3), np.uint8); img[y-2:y+2,x-2:x+2] = 255
    f = pts/('13' if i>=18 else '01')/f'frame_{i:05d}_rgb.png'; PILImage.create(img).save(f)
    Path(str(f)[:-7]+'pose.txt').write_text(f"{x} {y}")
ratings = pd.DataFrame({'userId': rng.integers(0, 30, 600), 'movieId': rng.integers(0, 40, 600),
                        'rating': rng.integers(1, 6, 600).astype(float), 'timestamp': rng.integers(0, 10**9, 600)})

def train():
    x = torch.randn(8,2); dsets = list(zip(x, x.sum(1, keepdim=True)))
    torch.manual_seed(0)
    learn = Learner(DataLoaders(DataLoader(dsets, bs=2), DataLoader(dsets, bs=2), device='cpu'), nn.Linear(2,1), loss_func=MSELossFlat())
    with learn.distrib_ctx(in_notebook=True): learn.fit(1)
    report(w=learn.model.weight.detach().clone(), ws=world_size(), pg=torch.distributed.is_initialized())
    if world_size()>1 and torch.distributed.get_rank()==0: time.sleep(2) # busy after a context: the other rank starts the next
    set_seed(0)
    dls = SegmentationDataLoaders.from_label_func(seg, bs=4, fnames=get_image_files(seg/'images'),
                                                  label_func=lambda o: seg/'labels'/f'{o.stem}_P{o.suffix}',
                                                  codes=np.loadtxt(seg/'codes.txt', dtype=str))
    learn = unet_learner(dls, resnet18, pretrained=False)
    with learn.distrib_ctx(in_notebook=True, sync_bn=False): learn.fine_tune(1)
    report(seg=learn.recorder.values, seg_model=type(learn.model).__name__)
    set_seed(0)
    learn = collab_learner(CollabDataLoaders.from_df(ratings, bs=32), y_range=(0.5,5.5))
    with learn.distrib_ctx(in_notebook=True): learn.fine_tune(2)
    report(collab=learn.recorder.values, collab_one=list(learn.validate())) # after the context: one process's evaluation
    set_seed(0)
    def get_ctr(f): return tensor([float(o) for o in Path(str(f)[:-7]+'pose.txt').read_text().split()])
    biwi = DataBlock(blocks=(ImageBlock, PointBlock), get_items=get_image_files, get_y=get_ctr,
                     splitter=FuncSplitter(lambda o: o.parent.name=='13'),
                     batch_tfms=[*aug_transforms(size=(32,32)), Normalize.from_stats(*imagenet_stats)])
    learn = vision_learner(biwi.dataloaders(pts, bs=4), resnet18, y_range=(-1,1), pretrained=False)
    with learn.distrib_ctx(in_notebook=True, sync_bn=False): learn.fine_tune(1)
    report(pts=learn.recorder.values)
notebook_launcher(train, num_processes=2, use_port=sys.argv[1])
'''

def test_notebook_launcher(tmp_path):
    ("`distrib_ctx(in_notebook=True)` under Accelerate's `notebook_launcher` on CPU; in the same function, the segmentation, "
     "collaborative filtering and keypoint examples of fastai's notebook of distributed examples, the first started while rank 0 "
     "is still busy after the first context")
    rs = run_ranks(NOTEBOOK, n=2, args=[free_port(), tmp_path], launcher='python')
    assert [o['ws'] for o in rs]==[2,2] and all(o['pg'] for o in rs) # the context joined the group; the processes leave it at the end
    assert (rs[0]['w']-rs[1]['w']).abs().max()<1e-6
    for k,n in (('seg', 1), ('collab', 2), ('pts', 1)): # fine_tune's last fit: its epochs, the same numbers on every rank
        v = rs[0][k]
        assert len(v)==n and rs[1][k]==v and all(math.isfinite(x) for row in v for x in row), (k, v, rs[1][k])
    assert rs[0]['seg_model']=='DynamicUnet'
    # the validation loss recorded under DDP is one process's evaluation of the weights it ended with
    assert all(abs(o['collab'][-1][1]-o['collab_one'][0])<1e-5 for o in rs), [(o['collab'][-1], o['collab_one']) for o in rs]

CAUSE = '''
import sys, time
import fastddp
from accelerate import notebook_launcher
from fastai.basics import *
from fastai.distributed import *
class Boom(Callback):
    def after_batch(self):
        if self.iter==3 and rank_distrib()==1:
            time.sleep(1.02-time.time()%1) # just after a whole second: rank 0's lost peer would fall in the same second
            raise ValueError("boom on rank 1")
def train():
    x = torch.randn(64,3); ds = list(zip(x, x.sum(1, keepdim=True)))
    learn = Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:16], bs=8), device='cpu'), nn.Linear(3,1), loss_func=MSELossFlat(),
                    cbs=Boom())
    with learn.distrib_ctx(in_notebook=True): learn.fit(1)
notebook_launcher(train, num_processes=2, use_port=sys.argv[1])
'''

def test_notebook_launcher_cause():
    ("A rank that fails under `notebook_launcher` is the root cause its summary names, not the rank that then lost its peer (torch's "
     "agent takes the earliest failure, in whole seconds: the rank that lost its peer ends over a second later)")
    rs = run_ranks(CAUSE, n=2, args=[free_port()], launcher='python', check=False)
    cause = rs.out.split('Root Cause')[-1].split('=====')[0]
    assert rs.rc!=0 and 'rank      : 1' in cause and 'boom on rank 1' in cause, cause

def test_bad_use():
    "No GPU visible, and nccl without CUDA, give one clear message; a task that sees one GPU uses it whatever its local rank"
    from fastddp.core import check_gpu, check_backend, DistribError, has_cuda
    with pytest.raises(DistribError, match=r"no GPU is visible"): check_gpu(0, 0)
    assert check_gpu(3, 1)==0 and check_gpu(3, 4)==3 # SLURM's --gpus-per-task=1: every task sees its own GPU as GPU 0
    if not has_cuda():
        with pytest.raises(DistribError, match="needs a CUDA GPU"): check_backend('nccl')

# what each rank sees while it trains: where the model is, and the process group's backend (None when there is none)
GPU = WS1.replace("device='cpu'", "device='cuda'").replace("learn.fit(1)", """learn.fit(1, cbs=Dev())""").replace(
    "w0 = ", """class Dev(Callback):
    def after_batch(self):
        pg = torch.distributed.is_initialized()
        report(dev=str(next(self.learn.model.parameters()).device), be=torch.distributed.get_backend() if pg else None)
w0 = """)

@pytest.mark.cuda
def test_cuda_world_size_1():
    "On a GPU machine at world size 1: the model trains on cuda:0 (nccl itself is shown by the 2-GPU test)"
    rs = run_ranks(GPU, n=1, launcher='fastddp')
    assert rs[0]['trained'] and rs[0]['dev']=='cuda:0'
    assert rs[0]['be'] in (None, 'nccl') # Accelerate may make a 1-process group under a launcher; never gloo on a GPU

@pytest.mark.cuda
def test_nccl_two_gpus():
    "On a machine with 2 GPUs: nccl, each rank's model on cuda:LOCAL_RANK"
    import torch
    if torch.cuda.device_count()<2: pytest.skip("needs 2 GPUs")
    rs = run_ranks(GPU, n=2, launcher='fastddp')
    assert [(o['be'], o['dev']) for o in rs]==[('nccl','cuda:0'), ('nccl','cuda:1')] and all(o['trained'] for o in rs)

# A user's plain torch loaders: the collate_fn, sampler, worker_init_fn and prefetch_factor kept (fastai's DistributedDL drops them)
TORCH_DL = '''
import sys
from pathlib import Path
from fastai.basics import *
from fastai.distributed import *
from torch.utils.data import DataLoader as TorchDL, WeightedRandomSampler, DistributedSampler, Sampler
from fastddp.core import *; from fastddp.testing import report
d,bs,ws = Path(sys.argv[1]),4,world_size()
seqs = [(torch.ones(i%4+1), tensor([float(i%4+1)])) for i in range(20)] # a sequence and its length
w = [1.]*16+[0.]*4 # the last four never drawn
def pad(b): # fastai's collation fails on sequences of different lengths
    xs,ys = zip(*b)
    return nn.utils.rnn.pad_sequence(xs, batch_first=True),torch.stack(ys)
def wif(i): (d/f"wif-{rank()}-{i}").touch()
class Sum(nn.Module): # the same output whatever the padding
    def __init__(self): super().__init__(); self.lin = nn.Linear(1, 1)
    def forward(self, x): return self.lin(x.sum(1, keepdim=True))
class Seen(Callback):
    def before_fit(self): self.ys,self.pf = [],[]
    def after_batch(self):
        if self.training: self.ys += self.yb[0].flatten().tolist(); self.pf.append(self.dl.fake_l.prefetch_factor)
def mk(sampler, b, n_workers=1):
    torch.manual_seed(1)
    dls = DataLoaders(TorchDL(seqs, batch_size=b, sampler=sampler, collate_fn=pad, num_workers=n_workers, worker_init_fn=wif,
                              prefetch_factor=3 if n_workers else None),
                      TorchDL(seqs[:10], batch_size=b, collate_fn=pad))
    return Learner(dls, Sum(), loss_func=MSELossFlat(), opt_func=SGD, lr=0.01)
g = torch.Generator().manual_seed(0)
learn,seen = mk(WeightedRandomSampler(w, 16, generator=g), bs),Seen()
with learn.distrib_ctx(): learn.fit(2, cbs=seen)
report(w=[p.detach().clone() for p in learn.model.parameters()], ys=seen.ys, pf=seen.pf, vals=learn.recorder.values,
       back=type(learn.dls.train).__module__)
learn,seen = mk(DistributedSampler(seqs, shuffle=False), bs, 0),Seen()
with learn.distrib_ctx(): learn.fit(1, cbs=seen)
report(dist_ys=seen.ys)
if rank()==0: # one process, batch ws*bs, the same sampler with the same seed
    ref = mk(WeightedRandomSampler(w, 16, generator=torch.Generator().manual_seed(0)), bs*ws, 0)
    ref.fit(2)
    report(ref=[p.detach().clone() for p in ref.model.parameters()], ref_vals=ref.recorder.values)
'''

def test_torch_loaders(tmp_path):
    ("Plain torch DataLoaders under distrib_ctx at 2 ranks: the collate_fn (padding), a weighted sampler with its generator, "
     "worker_init_fn and prefetch_factor kept; the weights and validation of one process at batch 2×4; a DistributedSampler split once")
    rs = run_ranks(TORCH_DL, n=2, args=[tmp_path])
    ref = rs[0]
    for r in rs:
        for a,b in zip(r['w'], ref['w']): assert (a-b).abs().max()<1e-6, (r['w'], ref['w'])
        for a,b in zip(r['w'], ref['ref']): assert (a-b).abs().max()<1e-6, (r['w'], ref['ref'])
        rv = ref['ref_vals'][-1] # validation: the same on both ranks, and as one process's
        assert r['vals']==ref['vals'] and all(abs(a-b)<1e-6 for a,b in zip(r['vals'][-1], rv)), (r['vals'], rv)
        assert r['pf']==[3]*len(r['pf']) and r['pf'] and r['back']=='torch.utils.data.dataloader' # the user's loaders after the fit
        assert set(r['ys'])<={1., 2., 3., 4.} and len(r['ys'])==2*2*4 # 16 draws of the first 16 items: 2 steps an epoch, 2 epochs
    assert sorted(f.name for f in tmp_path.iterdir())==['wif-0-0', 'wif-1-0'] # each rank's worker ran the user's set-up
    assert sorted(rs[0]['dist_ys']+rs[1]['dist_ys'])==sorted(float(i%4+1) for i in range(20)) # every item once, not a quarter
    assert "a DistributedSampler splits the data per rank" in rs.out

# rank 0 dies while the others wait for its download in `rank0_first`
FIRST_DIES = '''
import os, sys
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastddp.distrib import rank0_first
def fetch(): os._exit(3) # rank 0 ends half-way through (the OOM killer, a node lost)
rank0_first(fetch)
'''

def test_rank0_first_dies(tmp_path, marker):
    ("Ranks started without a launcher, as `srun` starts them: rank 0 dies inside `rank0_first`; the other ends at once with one "
     "line naming what rank 0 was doing, not after FASTDDP_FIRST_TIMEOUT (an hour)")
    import os, sys, time, subprocess
    from conftest import wait_gone
    (tmp_path/'s.py').write_text(FIRST_DIES)
    port = str(free_port())
    def env(r): return {**os.environ, 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': port, 'WORLD_SIZE': '2', 'RANK': str(r),
                        'LOCAL_RANK': str(r), 'LOCAL_WORLD_SIZE': '2', 'CUDA_VISIBLE_DEVICES': ''}
    t = time.time()
    ps = [subprocess.Popen([sys.executable, str(tmp_path/'s.py'), marker], env=env(r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True) for r in (0, 1)]
    out = [p.communicate(timeout=200)[0] for p in ps]
    assert ps[0].returncode==3, out[0][-2000:]
    assert ps[1].returncode==1, out[1][-2000:]
    assert "DistribError: rank 1: rank 0 stopped while it ran fetch first (its output says why)" in out[1], out[1][-2000:]
    assert time.time()-t<100, time.time()-t
    assert not wait_gone(marker, 10)
