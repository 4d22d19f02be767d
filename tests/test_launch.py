"Launcher: `fastddp-launch` / `python -m fastai.launch` on torch's elastic agent; failures stop every rank, nothing is left behind"
import os, re, sys, time, json, signal, socket, subprocess, pytest
from pathlib import Path
from fastddp.launch import free_port, launch
from fastddp.testing import run_ranks, read_reports
from conftest import procs_with, wait_gone, start, ROOT

# A plain torch DDP-style loop: cheap to start (no fastai import), and blocks in all_reduce like real training.
LOOP = '''
import os, sys, time, torch, torch.distributed as dist
from fastddp.core import *; from fastddp.testing import report
init_distrib('gloo')
report(pid=os.getpid(), restart=os.environ.get('TORCHELASTIC_RESTART_COUNT'), ws=world_size())
print(f"hello from rank {rank()}", flush=True)
t = torch.ones(1000)
mode, steps = sys.argv[2], int(sys.argv[3])
for i in range(steps):
    dist.all_reduce(t); t /= world_size()
    if i==5 and rank()==world_size()-1:
        if mode=='exit': os._exit(3)
        if mode=='raise': raise ValueError("boom on the last rank")
        if mode=='restart' and os.environ.get('TORCHELASTIC_RESTART_COUNT')=='0': os._exit(4)
    time.sleep(0.05)
report(done=True, t=t.sum().item())
'''

@pytest.mark.parametrize('mode,why', [('exit', 'exit code 3'), ('raise', 'exit code 1: ValueError: boom on the last rank')])
def test_rank_failure_stops_all(mode, why, marker):
    "One rank dies mid-training: every other rank is stopped within 30 s, the launcher names the rank and exits non-zero"
    t0 = time.time()
    rs = run_ranks(LOOP, n=3, args=[marker, mode, 100000], check=False, timeout=120)
    assert time.time()-t0 < 60
    assert rs.rc!=0
    assert f"fastddp-launch: rank 2 (pid {rs[2]['pid']}) failed: {why}" in rs.out.splitlines(), rs.out[-2000:]
    assert not wait_gone(marker, 5)
    assert not any(o.get('done') for o in rs)

def _training(marker, env=None):
    "`LOOP` started under fastddp-launch on 2 ranks, once the launcher and both ranks run: the launcher's `Popen`"
    p,_ = start(LOOP, ['--nproc', '2'], [marker, 'run', 100000], env=env)
    end = time.time()+60
    while len(procs_with(marker))<3 and time.time()<end: time.sleep(0.2) # the launcher and both ranks
    time.sleep(2)
    return p

# both in the fast tier: the ranks end within a few seconds of either (SIGINT took ~34 s in torch's agent before fastddp's worker)
@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_all(sig, marker):
    "Ctrl-C or SIGTERM to the launcher stops all ranks and exits non-zero; no stray process"
    p = _training(marker)
    p.send_signal(sig)
    out,_ = p.communicate(timeout=60)
    assert p.returncode!=0
    assert f"stopped by {sig.name}" in out, out[-2000:]
    # Ctrl-C: a line where each rank was, no KeyboardInterrupt traceback (a rank whose peer ended first may still show its lost peer)
    if sig==signal.SIGINT: assert 'interrupted at' in out and 'KeyboardInterrupt' not in out and ']:[rank' not in out, out[-2000:]
    assert not wait_gone(marker, 30)

def test_launcher_killed(marker, tmp_path):
    ("The launcher killed at once (SIGKILL, the OOM killer): the kernel sends each rank SIGTERM (`fastddp.worker.die_with_parent`), "
     "and no rank goes on training unseen. Its folder of log files stays; the next launch on the host removes it")
    p = _training(marker, env={'TMPDIR': str(tmp_path)})
    assert len(procs_with(marker))==3
    p.kill(); p.communicate(timeout=30)
    assert not wait_gone(marker, 30)
    left = [o.name for o in tmp_path.glob('fastddp-launch-*')]
    assert len(left)==1 and left[0].startswith(f'fastddp-launch-{socket.gethostname()}-{p.pid}-'), left # its host, its PID
    run_ranks(LOOP, n=1, args=[marker, 'run', 1], env={'TMPDIR': str(tmp_path)})
    assert not list(tmp_path.glob('fastddp-launch-*')), list(tmp_path.iterdir())

def test_rank_killed(marker):
    ("A rank killed from outside (SIGKILL: the OOM killer): the launcher names it as the cause, not its peer whose collective then "
     "failed")
    p,d = start(LOOP, ['--nproc', '2'], [marker, 'run', 100000])
    end = time.time()+60
    while None in read_reports(d, 2) and time.time()<end: time.sleep(0.2) # both ranks have joined and reported
    pid = read_reports(d, 2)[1]['pid']
    time.sleep(1)
    os.kill(pid, signal.SIGKILL)
    out,_ = p.communicate(timeout=60)
    assert p.returncode!=0 and f"rank 1 (pid {pid}) failed: killed by SIGKILL" in out, out[-2000:]
    assert not wait_gone(marker, 30)

@pytest.mark.smoke
def test_ranks_and_prefixes(marker, tmp_path):
    ("Every rank runs; lines of ranks other than 0 are prefixed; a busy 29500 does not matter when no port is given; "
     "no folder of log files is left in the temporary folder")
    with socket.socket() as s:
        try: s.bind(('127.0.0.1', 29500)); s.listen()
        except OSError: pass # already busy: all the better
        rs = run_ranks(LOOP, n=2, args=[marker, 'run', 10], env={'TMPDIR': str(tmp_path)})
    # torch's agent left one (`torchelastic_*`) at every run
    left = [o.name for o in tmp_path.iterdir() if o.name.startswith(('torchelastic_', 'fastddp-launch-'))]
    assert not left, left
    assert [o['ws'] for o in rs]==[2,2] and all(o['done'] for o in rs)
    lines = rs.out.splitlines()
    assert "hello from rank 0" in lines
    assert "[rank1]:hello from rank 1" in lines
    assert "no GPU found: starting 2 CPU processes with the gloo backend" in rs.out or "GPU" not in rs.out

def test_busy_port_given(tmp_path):
    "A busy port the user names gives one clear error, exit code 2, nothing started"
    scr = tmp_path/'s.py'; scr.write_text("open(__file__+'.ran','w')")
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([sys.executable, '-m', 'fastddp.launch', '--master-port', str(port), str(scr)], capture_output=True, text=True)
    assert p.returncode==2
    assert p.stderr.strip().splitlines()==[f"fastddp-launch: --master-port {port}: port busy on 127.0.0.1 "
                                           "(an earlier run may still hold it); pick another or leave it out on a single node"]
    assert not Path(str(scr)+'.ran').exists()

@pytest.mark.parametrize('argv,msg', [
    (['nope.py'], 'nope.py: no such script'),
    (['--gpus', '7', 'S'], 'GPU 7 does not exist'),
    (['--nproc', '0', 'S'], '--nproc 0: at least 1 process'),
    (['--gpus', '0,,1', 'S'], "expected 'all' or comma-separated GPU ids"),
    (['--nnodes', '2', '--node-rank', '2', 'S'], '--node-rank 2: must be in 0..1'),
    (['--iface', 'nosuch0', 'S'], '--iface nosuch0: no such interface with an IPv4 address on this host')]) # one node: checked too
def test_bad_input(argv, msg, tmp_path, capsys):
    "Bad input: one line of error, exit code 2, nothing started"
    scr = tmp_path/'s.py'; scr.write_text("open(__file__+'.ran','w')")
    assert launch([str(scr) if o=='S' else o for o in argv])==2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines())==1 and msg in err, err
    assert not Path(str(scr)+'.ran').exists()

@pytest.mark.parametrize('var,val,msg', [
    ('FASTDDP_TIMEOUT', '5m', "FASTDDP_TIMEOUT='5m': give a number of seconds, more than 0 (e.g. FASTDDP_TIMEOUT=300)"),
    ('FASTDDP_TIMEOUT', '-3', "FASTDDP_TIMEOUT='-3': give a number of seconds, more than 0 (e.g. FASTDDP_TIMEOUT=300)"),
    ('FASTDDP_FIRST_TIMEOUT', '1h', "FASTDDP_FIRST_TIMEOUT='1h': give a number of seconds, more than 0 (e.g. FASTDDP_FIRST_TIMEOUT=3600)"),
    ('FASTDDP_STALL', 'abc', "FASTDDP_STALL='abc': give a number of seconds, 0 or more (e.g. FASTDDP_STALL=180)")])
def test_bad_env(var, val, msg, tmp_path, capsys, monkeypatch):
    "A timeout variable that is not a number of seconds: one line naming it, exit code 2, no rank started (each raised a ValueError)"
    monkeypatch.setenv(var, val)
    scr = tmp_path/'s.py'; scr.write_text("open(__file__+'.ran','w')")
    assert launch([str(scr)])==2
    err = capsys.readouterr().err
    assert err.strip().splitlines()==[f"fastddp-launch: {msg}"], err
    assert not Path(str(scr)+'.ran').exists()

@pytest.mark.smoke
def test_max_restarts(marker):
    "`--max-restarts 1` restarts every worker once after a failure, saying which rank failed, and the run then finishes"
    rs = run_ranks(LOOP, n=2, args=[marker, 'restart', 20], largs=['--max-restarts', '1'])
    assert rs.rc==0 and all(o['done'] for o in rs)
    assert [o['restart'] for o in rs]==['1','1']
    ls = [l for l in rs.out.splitlines() if 'restarting every rank' in l]
    assert len(ls)==1 and re.fullmatch(r"fastddp-launch: rank 1 \(pid \d+\) failed: exit code 4; restarting every rank \(restart 1 of 1\)",
                                       ls[0]), rs.out[-2000:]

def test_log_dir(marker, tmp_path):
    "`--log-dir DIR` keeps every rank's output, rank 0's too, in DIR/<run>/attempt_0/<rank>/stdout.log; the console still shows it"
    rs = run_ranks(LOOP, n=2, args=[marker, 'run', 10], largs=['--log-dir', str(tmp_path/'logs')])
    assert all(o['done'] for o in rs)
    for r in (0,1):
        fs = list((tmp_path/'logs').glob(f'*/attempt_0/{r}/stdout.log'))
        assert len(fs)==1 and f"hello from rank {r}" in fs[0].read_text().splitlines(), (r, fs)
    assert "[rank0]:hello from rank 0" in rs.out.splitlines(), rs.out[-2000:]

@pytest.mark.smoke
def test_help_and_entry_points():
    "`python -m fastai.launch --help` and `fastddp-launch --help` work; every [project.scripts] entry imports"
    import tomllib, importlib
    for cmd in ([sys.executable, '-m', 'fastai.launch', '--help'], [str(Path(sys.executable).parent/'fastddp-launch'), '--help']):
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode==0 and '--gpus' in p.stdout and '--nproc' in p.stdout, p.stderr
    eps = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['scripts']
    for k,v in eps.items():
        mod,fn = v.split(':')
        assert callable(getattr(importlib.import_module(mod), fn)), k

@pytest.mark.smoke
def test_fastai_launch_is_ours_and_fastai_intact():
    "The compatibility module calls fastddp's launcher, lives in fastai's namespace, and leaves fastai's own modules alone"
    code = ("import fastai, fastai.launch, fastai.basics, fastddp.launch; "
            "print(fastai.launch.main is fastddp.launch.main, fastai.__version__)")
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert p.returncode==0, p.stderr
    assert p.stdout.split()[0]=='True'

def test_launcher_is_light():
    "The launcher imports neither fastai nor the user's script"
    code = "import sys, fastddp.launch as l; l.launch_config; print([m for m in sys.modules if m.startswith('fastai')])"
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert p.stdout.strip()=='[]', p.stdout+p.stderr

MN = '''
import sys
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
set_seed(rank()) # different data and init on every rank: DDP must make the weights agree
x = torch.randn(16,3); dsets = list(zip(x, x.sum(1, keepdim=True)))
learn = Learner(DataLoaders(DataLoader(dsets, bs=4, shuffle=True), DataLoader(dsets[:4], bs=4), device='cpu'), nn.Linear(3,1),
                loss_func=MSELossFlat())
with learn.distrib_ctx(): learn.fit(1)
report(w=learn.model.weight.detach().clone(), ws=world_size(), rank=rank())
if sys.argv[2]=='hang':
    import torch.distributed as dist
    t = torch.ones(10)
    while True: dist.all_reduce(t); time.sleep(0.05)
'''

def _two_nodes(marker, mode, port):
    res = []
    for nr in (0,1):
        res.append(start(MN, ['--nnodes', '2', '--node-rank', str(nr), '--master-addr', '127.0.0.1', '--master-port', str(port),
                              '--nproc', '2'], [marker, mode]))
    return res

def test_multi_node(marker):
    "Two launchers with --nnodes 2 form one 4-rank job that trains to identical weights on every rank"
    from fastddp.testing import read_reports
    nodes = _two_nodes(marker, 'train', free_port())
    outs = [p.communicate(timeout=240)[0] for p,d in nodes]
    assert [p.returncode for p,d in nodes]==[0,0], outs
    rs = [o for p,d in nodes for o in read_reports(d, 4) if o]
    assert sorted(o['rank'] for o in rs)==[0,1,2,3] and {o['ws'] for o in rs}=={4}
    for o in rs: assert (o['w']-rs[0]['w']).abs().max()<1e-6

@pytest.mark.slow # two launchers, one stopped: `make test` only
def test_multi_node_stop_one(marker):
    "Stopping one node (SIGTERM to its launcher) ends the other with a clear error; no worker of either is left"
    from fastddp.testing import read_reports
    (p0,d0),(p1,d1) = _two_nodes(marker, 'hang', free_port())
    end = time.time()+240
    while sum(1 for o in read_reports(d0, 4)+read_reports(d1, 4) if o)<4 and time.time()<end: time.sleep(0.5)
    time.sleep(1)
    p1.send_signal(signal.SIGTERM)
    out1,_ = p1.communicate(timeout=60)
    out0,_ = p0.communicate(timeout=120)
    assert p1.returncode!=0 and p0.returncode!=0
    assert "stopped by SIGTERM" in out1
    assert "failed" in out0, out0[-2000:]
    assert not wait_gone(marker, 30)

PEER = '''
import os, sys, time, signal, torch, torch.distributed as dist
from fastddp.core import *; from fastddp.testing import report
init_distrib('gloo')
mode = sys.argv[2]
# rank 0 must live to record torch's message: once rank 1 fails the agent stops every rank, and on a loaded machine its SIGTERM
# could land before gloo's error (seen once in a fresh-clone run: rank 0 reported nothing). It exits by itself on that error
if rank()==0: signal.signal(signal.SIGTERM, signal.SIG_IGN)
t = torch.ones(1000)
try:
    for i in range(1000):
        if i==3 and rank()==1:
            if mode=='kill': os._exit(3)
            if mode=='raise': raise ValueError("boom on rank 1")
            if mode=='hang': time.sleep(60)
        dist.all_reduce(t)
except Exception as e:
    report(msg=f"{type(e).__name__}: {e}".strip().splitlines()[0]) # what the worker's error file records, first line
    raise
'''

@pytest.mark.parametrize('mode,env', [('kill', {}), ('raise', {}), ('hang', {'FASTDDP_TIMEOUT': '3'})])
def test_peer_lost_messages(mode, env, marker):
    "torch's own messages for a lost peer (provoked for real) are classified as symptoms, so the launcher names the cause"
    from fastddp.launch import peer_lost
    rs = run_ranks(PEER, n=2, args=[marker, mode], env=env, check=False, timeout=100)
    assert rs.rc!=0
    assert peer_lost(rs[0]['msg']), rs[0]['msg'] # a torch that words it differently fails here (the table in 01_launch)
    r0 = 0 if mode=='hang' else 1 # a hung rank never fails by itself: the agent stops it once rank 0 timed out
    assert any(l.startswith(f"fastddp-launch: rank {r0} (pid ") for l in rs.out.splitlines()), rs.out[-2000:]
    if mode=='raise': assert not peer_lost(rs[1]['msg'])
    assert not wait_gone(marker, 10)

LATE = '''
import os, sys, time
from fastddp.core import *
if rank()==1: time.sleep(60) # still loading its data, say
init_distrib('gloo')
'''

def test_rank_never_joins(marker):
    "A rank that never reaches the process group is named by the others after FASTDDP_TIMEOUT (they quoted torch's store key)"
    rs = run_ranks(LATE, n=3, args=[marker], env={'FASTDDP_TIMEOUT': '4'}, check=False, timeout=100)
    assert rs.rc==2, rs.out[-2000:]
    # ranks 0 and 2 both wait for it and time out together: whichever fails first is the one the launcher quotes (rank 2, once in a
    # cold run on a busy machine)
    said = r"DistribError: rank [02]: rank\(s\) 1 did not join the process group within 4 s \(FASTDDP_TIMEOUT\)"
    assert re.search(said, rs.out), rs.out[-2000:]
    assert not wait_gone(marker, 10)

# Each writer raises or fails with a long message: its record takes seconds to write, and the test stops it as soon as the file or
# its temporary appears. torch's own `ErrorHandler` fails this: it leaves an empty file (what the agent then failed on)
WRITE = '''
import sys
if sys.argv[1]=='record':
    from fastddp.worker import WholeErrorFile
    try: raise RuntimeError('x'*100_000_000)
    except RuntimeError as e: WholeErrorFile().record_exception(e)
else:
    from fastddp.watchdog import _fail
    _fail('x'*100_000_000)
'''

@pytest.mark.parametrize('writer', ['record', 'watchdog'])
def test_error_file_whole(writer, tmp_path):
    "A rank stopped while it writes the launcher's error file leaves the whole record or none (an empty one stopped fastddp-launch)"
    fn = tmp_path/'error.json'
    p = subprocess.Popen([sys.executable, '-c', WRITE, writer], env=dict(os.environ, TORCHELASTIC_ERROR_FILE=str(fn)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.time()
    while p.poll() is None and not list(tmp_path.iterdir()) and time.time()-t<60: time.sleep(0.001)
    p.kill(); p.wait()
    assert list(tmp_path.iterdir()), "the writer wrote nothing"
    if fn.exists(): assert json.loads(fn.read_text())['message']['message'].endswith('x'*100) # whole, if the stop came late

# torch's own `@record` in the script: rank 0 writes a long record in place, and the agent stops it mid-write when rank 1 fails
HALF = '''
import os, time, torch.distributed as dist
from pathlib import Path
from torch.distributed.elastic.multiprocessing.errors import record
from fastddp.core import *
init_distrib('gloo')
@record
def main():
    dist.barrier()
    if rank()==1: # fails as soon as rank 0's record is begun: rank 0 writes for seconds (4 s here), the agent stops it within 0.1 s
        mine = Path(os.environ['TORCHELASTIC_ERROR_FILE']) # .../attempt_0/1/error.json
        while not (mine.parent.parent/'0'/mine.name).exists(): time.sleep(0.01)
        os._exit(3)
    raise RuntimeError('x'*200_000_000)
main()
'''

def test_half_written_error_file(marker):
    "An error file torch's agent cannot read (a script's own `@record` stopped mid-write): one line naming it, exit 1, nothing left"
    rs = run_ranks(HALF, n=2, args=[marker], check=False, timeout=120)
    assert rs.rc==1, rs.out[-3000:]
    assert re.search(r"fastddp-launch: a rank's error file \S+error\.json was empty or half-written", rs.out), rs.out[-3000:]
    assert not wait_gone(marker, 10)
