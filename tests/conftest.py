import os, sys, time, shutil, subprocess, tempfile, uuid, pytest, psutil
from pathlib import Path

# Two pytest-xdist workers share the cores, and most tests start processes of their own. An OpenMP thread waiting for work spins
# (libgomp's default) and burns the cores the other worker's processes need: waiting threads sleep instead. Measured: a one-process
# run of the pets script beside two busy cores took 23.7 s of CPU with spinning threads, 8.8 s without. No number depends on it.
# Set before anything here loads torch; every process a test starts inherits it
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

# What the suite's processes leave in the temporary folder goes in one folder of the run's, removed when it ends: fastddp-launch's log
# folder and `multiprocessing`'s of a launcher or rank a test kills with SIGKILL, torchrun's log folders (torch leaves them always),
# torch's error files, the watchdog's stack files of the ranks tests stall, the tests' own folders. A machine that runs the suite
# daily kept hundreds in /tmp. pytest's folders stay where pytest puts them (its own `tempfile.gettempdir()`, read first, is kept:
# pytest-xdist gives its workers theirs below it). The controller makes it; the workers and every process inherit `TMPDIR`
_TMP = None
if 'PYTEST_XDIST_WORKER' not in os.environ and 'FASTDDP_TEST_TMP' not in os.environ:
    tempfile.gettempdir()
    os.environ['TMPDIR'] = os.environ['FASTDDP_TEST_TMP'] = _TMP = tempfile.mkdtemp(prefix='fastddp-tests-')

def pytest_unconfigure(config):
    if _TMP: shutil.rmtree(_TMP, ignore_errors=True)

HERE = Path(__file__).parent
ROOT = HERE.parent

# Every Python process the suite starts loads tests/site/sitecustomize.py (it says what it does: a faster exit, 1.3 s of CPU a process),
# except those of the tests that ask for `natural_exit`
SITE = str(HERE/'site')
def _without_site(): return [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p and p!=SITE]
os.environ['PYTHONPATH'] = os.pathsep.join([SITE]+_without_site())

@pytest.fixture
def natural_exit(monkeypatch):
    "The processes this test starts exit as CPython does, with its last garbage collections (no tests/site/sitecustomize.py)"
    rest = _without_site()
    if rest: monkeypatch.setenv('PYTHONPATH', os.pathsep.join(rest))
    else: monkeypatch.delenv('PYTHONPATH')

def has_cuda():
    import torch
    return torch.cuda.is_available()

# modules that launch many runs, start clusters, run every notebook or build the docs: `make test-fast` leaves them out
# (`-m "not slow"`)
SLOW = {'test_notebooks', 'test_docs', 'test_hosts', 'test_slurm', 'test_shard', 'test_tune', 'test_scripts', 'test_checkpoint',
        'test_loggers', 'test_precision', 'test_bench', 'test_distrib', 'test_watchdog', 'test_stream', 'test_compile', 'test_preempt',
        'test_overhead', 'test_prefetch', 'test_resume', 'test_forecast'}

# `make test` runs the modules on 2 pytest-xdist workers, a module's tests in one worker (its fixtures made once), the longest first
# (each worker takes the next module as it frees up: longest first leaves neither with a long one at the end, where the other would
# wait). The order: each module's seconds in a full `make test` (`--durations=0`, summed per module; 2-core Intel Xeon, 2026-11-27),
# from notebooks (330 s) to throughput (7 s), then the rest (test_gpu: skipped without CUDA); the two that share the `hosts`
# namespaces run as one (226 s together)
LONG = ['test_notebooks', 'test_resume', 'test_hosts', 'test_slurm', 'test_preempt', 'test_compile', 'test_checkpoint', 'test_scripts',
        'test_bench', 'test_shard', 'test_distrib', 'test_launch', 'test_eval', 'test_forecast', 'test_precision', 'test_watchdog',
        'test_docs', 'test_stream', 'test_tune', 'test_house', 'test_doctor', 'test_overhead', 'test_tools', 'test_loggers',
        'test_timecost', 'test_train', 'test_imports', 'test_prefetch', 'test_internals', 'test_throughput']
GROUP = {'test_hosts': 'hosts', 'test_slurm': 'hosts'}

@pytest.hookimpl(optionalhook=True) # only where pytest-xdist is installed (the floor venv has none)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling
    config.option.loadscopereorder = False # xdist would put the modules with most tests first: keep `LONG`'s order
    class ByModule(LoadScopeScheduling):
        "xdist's `--dist loadfile`, with the modules of `GROUP` as one (xdist's own `loadgroup` does not group under pytest 9)"
        def _split_scope(self, nodeid):
            f = nodeid.split('::')[0]
            return GROUP.get(Path(f).stem, f)
    return ByModule(config, log)

def pytest_collection_modifyitems(config, items):
    for it in items:
        if it.module.__name__ in SLOW: it.add_marker(pytest.mark.slow)
    first = {m:i for i,m in enumerate(LONG)}
    items.sort(key=lambda it: first.get(it.module.__name__, len(LONG))) # stable: order kept within a module
    if has_cuda(): return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for it in items:
        if 'cuda' in it.keywords: it.add_marker(skip)

def procs_with(marker):
    "Live processes whose command line contains `marker` (workers run in their own sessions: find them by PID/cmdline)"
    res = []
    for p in psutil.process_iter(['pid', 'cmdline', 'status']):
        try:
            if p.info['status']!=psutil.STATUS_ZOMBIE and marker in ' '.join(p.info['cmdline'] or []): res.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied): pass
    return res

def wait_gone(marker, timeout=30):
    "Wait until no process carries `marker`; return the ones left"
    end = time.time()+timeout
    while time.time()<end:
        left = procs_with(marker)
        if not left: return []
        time.sleep(0.2)
    return procs_with(marker)

@pytest.fixture(scope='session')
def hosts():
    "Two hosts (network namespaces joined by a veth pair) for the tests across hosts (test_hosts, test_slurm); removed at the end"
    from hosts import Hosts
    with Hosts() as hs: yield hs

@pytest.fixture
def marker():
    "A unique script argument: it shows in every worker's command line"
    return f"mark-{uuid.uuid4().hex}"

def start(code, largs=(), args=(), env=None, launcher='fastddp'):
    "Start `code` under `fastddp-launch` without waiting; return (Popen, tmpdir)"
    d = tempfile.mkdtemp()
    fn = Path(d)/'script.py'
    fn.write_text(code)
    cmd = {'fastddp': [sys.executable, '-m', 'fastddp.launch'], 'fastai': [sys.executable, '-m', 'fastai.launch']}[launcher]
    e = {**os.environ, 'FASTDDP_REPORT_DIR': d, 'PYTHONUNBUFFERED': '1', **(env or {})}
    p = subprocess.Popen(cmd+list(map(str, largs))+[str(fn), *map(str, args)], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, stdin=subprocess.DEVNULL)
    return p, d
