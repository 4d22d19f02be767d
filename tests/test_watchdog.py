"The watchdog under a launcher other than fastddp's: a rank whose DataLoader worker never answers is named, and nothing is left running"
import time, pytest
from fastddp.testing import run_ranks
from conftest import wait_gone

_stuck_worker = '''
import os, sys, time
from fastai.basics import *
from fastai.distributed import *
import fastddp
from fastddp.core import rank
from fastddp.testing import report
class DS(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        if rank()==1 and i>=16: time.sleep(3600) # in rank 1's DataLoader worker, from its third batch on
        return torch.randn(3), torch.randn(1)
learn = Learner(DataLoaders(DataLoader(DS(), bs=8, num_workers=1), DataLoader(DS(), bs=8), device='cpu'), nn.Linear(3,1),
                loss_func=MSELossFlat())
with learn.distrib_ctx(): learn.fit(1)
report(done=True)
'''

def test_stuck_dataloader_under_torchrun(marker):
    t0 = time.time()
    rs = run_ranks(_stuck_worker, n=2, launcher='torchrun', args=[marker], env={'FASTDDP_STALL': '6'}, check=False, timeout=150)
    took = time.time()-t0
    assert rs.rc!=0 and [o for o in rs]==[None, None], rs.out[-3000:]
    msg = [l for l in rs.out.splitlines() if 'made no progress' in l]
    assert msg and 'rank 1 made no progress' in msg[0] and 'waiting for its DataLoader workers' in msg[0], rs.out[-3000:]
    assert 'RankStalled: rank 1' in rs.out, rs.out[-3000:] # torchrun's summary gives the same reason
    assert took<100, took
    assert wait_gone(marker, 20)==[] # the ranks, and rank 1's stuck DataLoader worker

_exit_hangs = '''
import atexit, threading
from fastai.basics import *
from fastai.distributed import *
import fastddp
from fastddp.core import rank
from fastddp.testing import report
x = torch.randn(32,3); ds = list(zip(x, x[:,:1]))
learn = Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds, bs=8), device='cpu'), nn.Linear(3,1), loss_func=MSELossFlat())
with learn.distrib_ctx(): learn.fit(1)
if rank()==1: atexit.register(threading.Event().wait) # an exit handler that never returns
report(done=True)
'''

@pytest.mark.parametrize('launcher', ['fastddp', 'torchrun'])
def test_exit_that_hangs_ends(launcher, marker):
    "Training done, a rank's exit hangs: it ends within FASTDDP_STALL with its stacks, and the job with it"
    t0 = time.time()
    rs = run_ranks(_exit_hangs, n=2, launcher=launcher, args=[marker], env={'FASTDDP_STALL': '4'}, check=False, timeout=120)
    assert [o and o['done'] for o in rs]==[True, True], rs.out[-3000:]
    assert rs.rc!=0 and 'Timeout (0:00:04)!' in rs.out and 'in wait' in rs.out, rs.out[-3000:] # faulthandler's dump of the stuck exit
    assert time.time()-t0<90
    assert wait_gone(marker, 20)==[]

# argv: 'own' (a first fit in which rank 1's loss is NaN, which `TerminateOnNaNCallback` cancels on every rank at one step, then a
# fit that rank 1 alone cancels, on its own values) or 'exit' (rank 1 alone calls sys.exit(0) mid-fit), then a marker
_left = '''
import sys
from fastai.basics import *
from fastai.callback.tracker import TerminateOnNaNCallback
import fastddp
from fastddp.core import rank
from fastddp.testing import report
from fastddp.watchdog import Watchdog
Watchdog.peer_wait = 5
class Odd(Callback):
    def __init__(self, mode): self.mode = mode
    def after_loss(self): # the loss reported, not the one backpropagated
        if self.mode=='nan' and self.training and self.iter==2 and rank()==1: self.learn.loss = self.loss*float('nan')
    def after_batch(self):
        if self.training and self.iter==5 and rank()==1:
            if self.mode=='own': raise CancelFitException() # an early stop on this rank's own loss, say
            if self.mode=='exit': sys.exit(0)
x = torch.randn(256, 3); ds = list(zip(x, x.sum(1, keepdim=True)))
learn = Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:16], bs=8), device='cpu'), nn.Linear(3, 1), loss_func=MSELossFlat(),
                cbs=TerminateOnNaNCallback())
with learn.distrib_ctx():
    if sys.argv[1]=='own':
        learn.fit(2, cbs=Odd('nan'))
        report(nan_iter=learn.train_iter)
    learn.fit(2, cbs=Odd(sys.argv[1]))
report(done=True)
'''

@pytest.mark.parametrize('mode,launcher', [('own', 'torchrun'), ('exit', 'fastddp')])
def test_rank_leaves_fit(mode, launcher, marker):
    ("A rank that leaves a fit alone (CancelFitException on its own values, sys.exit(0)) ends the run within `Watchdog.peer_wait`, named "
     "with why (it took ~250 s for the watchdog, which blamed the wrong rank); a NaN loss on one rank cancels every rank at one step")
    t0 = time.time()
    rs = run_ranks(_left, n=2, launcher=launcher, args=[mode, marker], check=False, timeout=150, merge=True)
    took = time.time()-t0
    assert rs.rc!=0 and not any(o and o.get('done') for o in rs), rs.out[-3000:]
    why = {'own': "rank 1 cancelled it (CancelFitException) at epoch 0, batch 5, in Odd.after_batch",
           'exit': "rank 1 left it with sys.exit(0) at epoch 0, batch 5, in Odd.after_batch"}[mode]
    first = {'own': "RankStalled: rank 0 waited", 'exit': "DistribError: rank 0 lost rank(s) that left this fit early"}[mode]
    assert why in rs.out and first in rs.out and "Every rank must leave a fit at the same step" in rs.out, rs.out[-3000:]
    if mode=='own': assert [o['nan_iter'] for o in rs]==[3, 3], rs.out[-3000:] # rank 1's NaN at step 2 stopped both after it
    # on a line of its own, not after rank 0's progress bar (which ends its redraws with '\r')
    own = {'own': "fastddp: rank 0 waited", 'exit': "fastddp-launch: rank 0 (pid"}[mode]
    assert any(l.startswith(own) for l in rs.out.split('\n')), rs.out[-3000:]
    assert took<90, took # the 5 s of peer_wait, and starting Python and torch on a loaded machine
    assert wait_gone(marker, 20)==[]
