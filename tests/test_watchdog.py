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
