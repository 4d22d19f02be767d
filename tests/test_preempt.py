("Preemption: a signal to the launcher, to one rank, or from SLURM stops every rank at one step with a checkpoint "
 "there and exit code 75; the same command resumes to the uninterrupted weights, bit for bit")
import os, re, sys, time, signal, pytest, torch
from pathlib import Path
from fastddp.testing import run_ranks
from fastddp.preempt import PREEMPTED
from conftest import wait_gone

# argv: folder, then key=value: at='train@E.I'|'valid@E'|'last', to='launcher'|'rank1'|'slurm', sig='SIGTERM'|'SIGUSR1',
# then flags: term2, shard, nock, and a marker
PRE = '''
import sys, os, time, signal, subprocess, multiprocessing
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.checkpoint import Checkpoint, checkpoints
from fastddp.preempt import Preempted, Preempt
Preempt.budget = 0.05 # a check at each of the 50 ms steps below (the default: every 0.5 s), so the stopping step is known
path,o = Path(sys.argv[1]),dict(a.split('=', 1) for a in sys.argv[2:] if '=' in a)
flags = set(a for a in sys.argv[2:] if '=' not in a)
torch.set_num_threads(1)
first = not (path/'checkpoints').exists() # the self-sent signal comes on the first run only: the second is the same command again
class Ck(Checkpoint):
    def write(self, st, fn):
        if 'term2' in flags and self.stop is None and self.got: # a second SIGTERM while the preemption checkpoint is written
            os.kill(os.getppid(), signal.SIGTERM); time.sleep(1)
        return super().write(st, fn)
def send(learn):
    s = getattr(signal, o.get('sig', 'SIGTERM'))
    if o['to']=='launcher': os.kill(os.getppid(), s)
    elif o['to']=='rank1': os.kill(os.getpid(), s)
    elif o['to']=='slurm': subprocess.run(['scancel', '--signal', s.name[3:], os.environ['SLURM_JOB_ID']], check=True)
    # the step it lands at is the one the test names: wait until this rank has it (through the launcher or SLURM on a busy machine,
    # a signal can take longer than the rest of a short validation)
    end = time.time()+20
    while not any(isinstance(c, Preempt) and c.got for c in learn.cbs) and time.time()<end: time.sleep(0.01)
class Sig(Callback):
    order = 60
    def after_batch(self):
        at = o.get('at', '')
        if not first or (o.get('to')=='rank1')!=(rank()==1) or (o.get('to')!='rank1' and rank()!=0): return
        # slow enough for the signal to land mid-epoch, and for a check (every `Preempt.budget` = 50 ms of steps) at every step
        if self.training and 'nock' not in flags: time.sleep(0.05)
        if self.training and at==f'train@{self.epoch}.{self.iter}': send(self.learn)
        if not self.training and at==f'valid@{self.epoch}' and self.iter==0: send(self.learn)
        if self.training and at=='last' and self.epoch==self.n_epoch-1 and self.iter==self.n_iter-1: send(self.learn)
        if self.training and self.iter==2: report(wpids=[p.pid for p in multiprocessing.active_children()])
set_seed(0)
x = torch.randn(96,3); ds = list(zip(x, x@tensor([1.,-2.,3.])[:,None]))
torch.manual_seed(0)
nw = 0 if 'shard' in flags else 2
cbs = [Sig()]+([] if 'nock' in flags else [Ck(every=5)])
# 12 steps an epoch on each of 2 ranks
learn = Learner(DataLoaders(DataLoader(ds, bs=4, shuffle=True, num_workers=nw), DataLoader(ds[:16], bs=4), device='cpu'),
                nn.Sequential(nn.Linear(3,16), nn.Dropout(0.3), nn.Linear(16,1)), loss_func=MSELossFlat(), path=path, cbs=cbs)
try:
    with learn.distrib_ctx(**(dict(shard=True, shard_min=10) if 'shard' in flags else {})): learn.fit_one_cycle(3, 0.01)
except Preempted as e:
    report(stop=dict(code=e.code, sig=e.sig, epoch=e.epoch, it=e.it, ckpt=e.ckpt and Path(e.ckpt).name, secs=e.secs, write=e.write,
                     steps=e.steps),
           handlers=[getattr(signal.getsignal(s), '__name__', None) for s in (signal.SIGTERM, signal.SIGUSR1)])
    raise
report(w=[p.detach().clone() for p in learn.model.parameters()],
       ckpts=[f.name for f in checkpoints(path/'checkpoints')] if (path/'checkpoints').exists() else [],
       handlers=[signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)])
'''

def _flat(ws): return torch.cat([o.flatten() for o in ws])

def _gone(rs):
    "Every DataLoader worker a rank reported is gone"
    import psutil
    for o in rs:
        for p in (o or {}).get('wpids', []):
            assert not psutil.pid_exists(p) or psutil.Process(p).status()==psutil.STATUS_ZOMBIE, f"DataLoader worker {p} left running"

@pytest.fixture(scope='module')
def ref(tmp_path_factory):
    "The uninterrupted run's weights (2 ranks, DataLoader workers on)"
    return _flat(run_ranks(PRE, n=2, args=[tmp_path_factory.mktemp('ref')])[0]['w'])

def _stopped(rs, code=PREEMPTED):
    assert rs.rc==code, rs.out[-3000:]
    st = [o['stop'] for o in rs]
    assert st[0]==st[1] or {**st[0], 'secs':0, 'write':0}=={**st[1], 'secs':0, 'write':0}, st # the same step on every rank
    return st[0]

def test_launcher_term(tmp_path, ref, marker):
    ("fastddp-launch, DataLoader workers on: SIGTERM to the launcher mid-epoch, and a second one during the write: "
     "checkpoint at that step, exit 75, nothing left; the same command again ends bit-equal")
    args = [tmp_path, 'at=train@1.3', 'to=launcher', 'sig=SIGTERM', 'term2', marker]
    rs = run_ranks(PRE, n=2, args=args, check=False)
    st = _stopped(rs)
    assert st['epoch']==1 and 3<st['it']<12 and st['ckpt']==f"ckpt_e0001_s{st['it']:06d}.pth" and st['sig']=='SIGTERM', st
    # the write took the 1 s sleep after the second SIGTERM, and the line says how long from the signal
    assert st['secs']>=st['write']>=1, st
    # the step under way when the signal came, and the one the asynchronous answer lags (50 ms steps: a check each): none is lost
    assert 1<=st['steps']<=2, st
    assert (tmp_path/'checkpoints'/st['ckpt']).is_file() and not list((tmp_path/'checkpoints').glob('*.tmp'))
    assert (f"fastddp: SIGTERM: every rank stopped at epoch 1, step {st['it']}; checkpoint" in rs.out
            and "exit code 75: the same command resumes" in rs.out), rs.out[-3000:]
    assert "every rank wrote the checkpoint and stopped: exit code 75" in rs.out and 'Traceback' not in rs.out, rs.out[-3000:]
    assert rs[0]['handlers']==['_late']*2 # a stop signal is the same request again while the process exits
    assert not wait_gone(marker, 10); _gone(rs)
    again = run_ranks(PRE, n=2, args=args)
    assert f"resuming from {tmp_path/'checkpoints'/st['ckpt']}" in again.out, again.out[-3000:]
    for o in again: assert torch.equal(_flat(o['w']), ref)

def test_torchrun_usr1_and_one_rank(tmp_path, ref, marker):
    ("torchrun --signals-to-handle: SIGUSR1 to the agent checkpoints mid-epoch; then SIGUSR1 to "
     "rank 1 alone, later in the resumed run; the third run ends bit-equal")
    largs = ['--signals-to-handle', 'SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1']
    rs = run_ranks(PRE, n=2, launcher='torchrun', largs=largs, args=[tmp_path, 'at=train@1.3', 'to=launcher', 'sig=SIGUSR1', marker],
                   check=False)
    st = _stopped(rs, rs.rc); assert rs.rc!=0
    assert st['code']==PREEMPTED and st['epoch']==1 and 3<st['it']<12 and st['sig']=='SIGUSR1', st
    assert not wait_gone(marker, 10); _gone(rs)
    (tmp_path/'first').mkdir() # not `first` any more: rank 1 signals itself on this run, which resumes
    rs2 = run_ranks(PRE.replace("first = not (path/'checkpoints').exists()", "first = not (path/'first').exists() or o.get('to')=='rank1'"),
                    n=2, launcher='torchrun', largs=largs,
                    args=[tmp_path, 'at=train@2.1', 'to=rank1', 'sig=SIGUSR1', marker], check=False)
    st2 = _stopped(rs2, rs2.rc)
    # torchrun itself exits 1 whatever the ranks' codes
    assert rs2.rc==1 and st2['code']==PREEMPTED and st2['epoch']==2 and st2['it']>1, (rs2.rc, st2)
    assert f"resuming from {tmp_path/'checkpoints'/st['ckpt']}" in rs2.out, rs2.out[-3000:]
    again = run_ranks(PRE, n=2, launcher='torchrun', largs=largs, args=[tmp_path, 'at=train@1.3', 'to=launcher', 'sig=SIGUSR1', marker])
    for o in again: assert torch.equal(_flat(o['w']), ref)
    assert not wait_gone(marker, 10)

def test_validation_last_step_no_checkpoint(tmp_path, ref, marker):
    ("Without Checkpoint, SIGUSR1 during validation: every rank stops after the epoch, one line, exit 128+10. With it, SIGTERM in the "
     "very last step: the final checkpoint, exit 75; the same command again trains nothing and ends bit-equal")
    rs = run_ranks(PRE, n=2, args=[tmp_path/'a', 'at=valid@1', 'to=launcher', 'sig=SIGUSR1', 'nock', marker], check=False)
    st = _stopped(rs, 128+signal.SIGUSR1)
    assert (st['epoch'], st['it'], st['ckpt']) == (2, 0, None), st
    assert (rs.out.count("fastddp: SIGUSR1: every rank stopped at epoch 2, step 0; no checkpoint")==1
            and 'Traceback' not in rs.out), rs.out[-3000:]
    assert "fastddp-launch: stopped by SIGUSR1" in rs.out, rs.out[-3000:]
    assert not wait_gone(marker, 10); _gone(rs)
    args = [tmp_path/'b', 'at=last', 'to=launcher', 'sig=SIGTERM', marker]
    st = _stopped(run_ranks(PRE, n=2, args=args, check=False))
    assert (st['epoch'], st['it'], st['ckpt']) == (3, 0, 'ckpt_e0003_s000000.pth'), st
    again = run_ranks(PRE, n=2, args=args)
    assert "resuming from" in again.out and "(epoch 3 of 3, step 0)" in again.out, again.out[-3000:]
    for o in again: assert torch.equal(_flat(o['w']), ref)

# `make test-floor`'s sharding and DCP at the floors: FSDP2, a sharded checkpoint written at a signal, resumed bit-equal
@pytest.mark.smoke
def test_sharded(tmp_path, ref, marker):
    ("Sharded (FSDP2): SIGUSR1 to the launcher mid-epoch: every rank writes its shards at one step, "
     "exit 75; the same command again ends bit-equal to the uninterrupted run (at 2 ranks sharded and DDP add the same gradients)")
    args = [tmp_path/'run', 'at=train@1.3', 'to=launcher', 'sig=SIGUSR1', 'shard', marker]
    rs = run_ranks(PRE, n=2, args=args, check=False)
    st = _stopped(rs)
    assert st['epoch']==1 and 3<st['it']<12 and st['ckpt']==f"ckpt_e0001_s{st['it']:06d}.dcp", st
    assert 'stays sharded' not in rs.out, rs.out[-2000:] # a planned stop, not a failure
    assert (tmp_path/'run'/'checkpoints'/st['ckpt']/'meta.pth').is_file()
    assert not wait_gone(marker, 10)
    again = run_ranks(PRE, n=2, args=args)
    for o in again: assert torch.equal(_flat(o['w']), ref)

STUCK = '''
import os, time, signal
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *
from fastddp.preempt import Preempt
Preempt.stuck = 4 # the default 20 s: the same path, slower
class Stuck(Callback):
    def after_batch(self):
        if self.training and self.iter==3 and rank()==1:
            os.kill(os.getppid(), signal.SIGTERM) # to the launcher, which forwards it to both ranks
            time.sleep(120) # stuck before the step every rank must reach
x = torch.randn(64, 3); ds = list(zip(x, x.sum(1, keepdim=True)))
learn = Learner(DataLoaders(DataLoader(ds, bs=4), DataLoader(ds[:8], bs=4), device='cpu'), nn.Linear(3, 1), loss_func=MSELossFlat(),
                cbs=Stuck())
with learn.distrib_ctx(): learn.fit(1)
'''

def test_stuck_after_signal(marker):
    "A rank stuck after a stop signal is named within `Preempt.stuck` seconds, not FASTDDP_STALL's 180: inside the 30 s grace"
    rs = run_ranks(STUCK, n=2, args=[marker], check=False, timeout=100)
    named = re.search(r"rank 1 made no progress for [4-9] s \(FASTDDP_STALL=180, 4 s since a stop signal\)", rs.out)
    assert rs.rc!=0 and named, rs.out[-3000:]
    assert "time.sleep(120)" in rs.out, rs.out[-3000:] # where it was stuck
    assert not wait_gone(marker, 10)

# argv: folder, then 'ranks' (in `distrib_ctx`) or 'term' (one process: catch the failure, then SIGTERM to itself), and a marker
BAD = '''
import sys, os, signal
from fastai.basics import *
from fastddp.distrib import *; from fastddp.checkpoint import Checkpoint; from fastddp.testing import report
class DS:
    def __len__(self): return 256
    def __getitem__(self, i):
        if i==100: raise ValueError(f"bad item {i}")
        return torch.randn(4), torch.tensor([float(i%2)])
dls = DataLoaders.from_dsets(DS(), DS(), bs=16, num_workers=2, shuffle=False, device='cpu')
learn = Learner(dls, nn.Linear(4,1), loss_func=MSELossFlat(), path=Path(sys.argv[1]), cbs=Checkpoint())
if 'ranks' in sys.argv:
    with learn.distrib_ctx(): learn.fit(1)
elif 'term' in sys.argv:
    try: learn.fit(1)
    except ValueError: os.kill(os.getpid(), signal.SIGTERM)
    report(survived=True)
else: learn.fit(1)
'''

@pytest.mark.parametrize('how', ['one', 'term', 'ranks'])
def test_failed_fit(tmp_path, how, marker):
    ("A DataLoader worker that raises, with `Checkpoint` (whose workers ignore SIGTERM during the fit): the process ends at once "
     "with the error (it waited forever in one process, and ~190 s for the watchdog on 2 ranks), and after a failed fit that the "
     "script caught, SIGTERM has its default effect")
    flags = {'one': [], 'term': ['term'], 'ranks': ['ranks']}[how]
    t = time.time()
    rs = run_ranks(BAD, n=2 if how=='ranks' else 1, launcher='fastddp' if how=='ranks' else 'python', args=[tmp_path, *flags, marker],
                   check=False, timeout=90)
    took = time.time()-t
    if how=='one': assert rs.rc==1 and "ValueError: bad item 100" in rs.out, rs.out[-3000:]
    if how=='term': assert rs.rc==-signal.SIGTERM and rs[0] is None, rs.out[-3000:]
    if how=='ranks': # the worker's own error, in the launcher's line
        # item 100 is rank 0's 51st (each rank every other item), in its 4th batch of 16: made by the second worker
        assert rs.rc==1 and "failed: exit code 1: ValueError: bad item 100 (in DataLoader worker process 1)" in rs.out, rs.out[-3000:]
    assert "killed by signal" not in rs.out and "Exception ignored" not in rs.out, rs.out[-3000:]
    assert not wait_gone(marker, 10), f"left running after {took:.0f} s"

LATE = '''
import sys, os, signal, time
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastddp.checkpoint import Checkpoint; from fastddp.preempt import Preempted
class Sig(Callback):
    def after_batch(self):
        if self.training and self.epoch==1 and self.iter==2: os.kill(os.getpid(), signal.SIGTERM)
learn = synth_learner(n_trn=10, path=sys.argv[1], cbs=[Checkpoint(), Sig()])
learn.dls.train.num_workers = 2 # workers make the exit slower: a signal during it found the default handler
try: learn.fit(2)
except Preempted:
    os.kill(os.getpid(), signal.SIGTERM) # SLURM's, once rank 0 has requeued the job
    time.sleep(0.3)
    raise
'''

def test_signal_after_stop(tmp_path):
    "One process: a second SIGTERM after the stop, while the process exits, leaves the announced exit code 75 (it was -15)"
    rs = run_ranks(LATE, n=1, launcher='python', args=[tmp_path], check=False, timeout=120)
    assert rs.rc==PREEMPTED and "exit code 75: the same command resumes" in rs.out, rs.out[-3000:]

# argv: mode ('after_fit': rank 1 stuck in an `after_fit` until the launcher's SIGTERM; 'kill': rank 1 SIGKILLed while its DataLoader
# workers are busy), then a marker
ENDS = '''
import sys, os, time, signal
from fastai.basics import *
from fastddp.distrib import *; from fastddp.preempt import Preempt; from fastddp.testing import report
R,mode = int(os.environ['RANK']),sys.argv[1]
class DS:
    def __len__(self): return 64
    def __getitem__(self, i):
        if mode=='kill' and R==1 and os.path.exists(sys.argv[2]+'.slow'): time.sleep(60) # busy when its rank dies
        return torch.randn(4), torch.tensor([float(i%2)])
class Stuck(Callback):
    order = 50 # after the watchdog (13) has stopped, before `Preempt` (75) agrees on the stop flag a last time
    def after_fit(self):
        if mode!='after_fit' or R!=1: return
        p = next(o for o in self.learn.cbs if isinstance(o, Preempt))
        while not p.got: time.sleep(0.1) # until the launcher's SIGTERM
    def after_batch(self):
        if not (mode=='kill' and R==1 and self.training): return
        if self.iter==1: Path(sys.argv[2]+'.slow').touch() # the items asked for from now on take a minute: the workers are busy
        if self.iter==3:
            import multiprocessing
            report(wpids=[o.pid for o in multiprocessing.active_children()])
            os.kill(os.getpid(), signal.SIGKILL)
dls = DataLoaders.from_dsets(DS(), DS(), bs=4, num_workers=2 if mode=='kill' else 0, shuffle=False, device='cpu')
learn = Learner(dls, nn.Linear(4,1), loss_func=MSELossFlat(), cbs=Stuck())
with learn.distrib_ctx(): learn.fit(1)
'''

def test_rank_ends(tmp_path, marker):
    ("The ends of a failed run: a rank stuck after the watchdog stopped (a callback's `after_fit`) fails the others' last stop-flag "
     "check after FASTDDP_TIMEOUT with a line that says so (it waited 30 min, torch's default); a rank SIGKILLed while its "
     "DataLoader workers are busy takes them along (they were left running, and kept the other rank waiting for their sockets)")
    rs = run_ranks(ENDS, n=2, args=['after_fit', marker], env={'FASTDDP_TIMEOUT': '5'}, check=False, timeout=120)
    assert rs.rc==1 and "rank 0 waited 5 s (FASTDDP_TIMEOUT) for the other ranks at the stop-signal check" in rs.out, rs.out[-3000:]
    assert not wait_gone(marker, 10)
    rs = run_ranks(ENDS, n=2, args=['kill', tmp_path/'flag', marker], check=False, timeout=120)
    assert rs.rc==1 and "rank 1 (pid" in rs.out and "failed: killed by SIGKILL" in rs.out, rs.out[-3000:]
    import psutil
    ps = [p for p in rs[1]['wpids'] if psutil.pid_exists(p) and psutil.Process(p).status()!=psutil.STATUS_ZOMBIE]
    assert not ps, f"rank 1's DataLoader workers {ps} left running"
    assert not wait_gone(marker, 10)

def test_forkserver_workers(tmp_path):
    ("DataLoader workers under `forkserver` (Python 3.14's default on Linux; `spawn`, macOS's, is alike): their parent is not the "
     "rank, and `Checkpoint`'s workers still train (asking to die with a parent that is not the rank killed them at once)")
    code = '''
import sys, multiprocessing
if __name__=='__main__':
    multiprocessing.set_start_method('forkserver')
    multiprocessing.set_forkserver_preload(['torch', 'fastai.basics']) # each worker then starts in a moment
    from fastai.basics import *
    from fastddp.checkpoint import Checkpoint; from fastddp.handloop import InMemory; from fastddp.testing import report
    x = torch.randn(64,4); y = torch.randint(0,2,(64,))
    dls = DataLoaders.from_dsets(InMemory(x,y), InMemory(x[:16],y[:16]), bs=8, num_workers=2, device='cpu')
    learn = Learner(dls, nn.Linear(4,2), loss_func=CrossEntropyLossFlat(), path=sys.argv[1], cbs=Checkpoint())
    with learn.no_logging(): learn.fit(1)
    report(epochs=len(learn.recorder.values))
'''
    rs = run_ranks(code, n=1, launcher='python', args=[tmp_path], check=False, timeout=180)
    assert rs.rc==0 and rs[0]=={'epochs': 1}, rs.out[-3000:]
