"""`make test-gpu`: every GPU check in one command, one table at the end (`python tools/test_gpu.py WORD...`: only the steps whose
names hold a word). On a machine whose Python has torch but not fastai it
first installs the carried wheels offline (`make gpu-wheels` downloads them here); on a machine without CUDA it reports each GPU
step as not run. A step starts only when its time limit fits in what is left of the budget: one that does not is reported
'not run (budget)', apart from the failures, and the table's first line names it. A step past its limit, and every process it
started, is ended (its ranks too, which torch's elastic agent starts in sessions of their own)."""
import os, re, sys, time, json, signal, tempfile, subprocess, importlib.util, importlib.metadata as md
from pathlib import Path

ROOT = Path(__file__).parent.parent
LOGS = Path(os.environ.get('OUT') or ROOT/'gpu-logs') # the device tool brings $OUT back
PY = sys.executable
# seconds for every step together: a device call may run 600 s, and the table must come back even when a step runs long
BUDGET = float(os.environ.get('FASTDDP_GPU_BUDGET') or 540)
GRACE = 5. # seconds a step's processes get between SIGTERM (torch's agent then stops its ranks) and SIGKILL
# issue 36's targets: fastddp / hand-written loop, median of the paired blocks (and the lowest pair) per workload
TARGETS = {'MLP': (0.9, None), 'resnet18': (0.98, 0.95), 'resnet50': (0.98, 0.95)}

def _dist(whl): return whl.name.split('-')[0].lower().replace('_', '-')

def _installed(name):
    try: md.version(name); return True
    except md.PackageNotFoundError: return False

def install():
    "Install the carried wheels this Python lacks, and fastddp itself (editable), offline; (result, detail) for the table"
    with tempfile.TemporaryDirectory() as d:
        ws = [w for o in ('wheels', 'wheels-text') for w in sorted((ROOT/o).glob('*.whl'))]
        if (ROOT/'gpu-wheels.tar.xz').exists(): # `make gpu-wheels`'s one file to carry: all the wheels
            sys.path.insert(0, str(ROOT/'tools'))
            from gpu_wheels import unpack
            have = {o.name for o in ws}
            ws += [o for o in unpack(ROOT/'gpu-wheels.tar.xz', d) if o.name not in have]
        ws = [w for w in ws if not _installed(_dist(w))]
        try:
            if ws: subprocess.run([PY, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', *map(str, ws)], check=True)
            importlib.invalidate_caches() # `steps` looks for spaCy, installed just now
            if importlib.util.find_spec('fastddp') is None or not _installed('fastddp'):
                subprocess.run([PY, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation', '-e', str(ROOT)], check=True)
        except subprocess.CalledProcessError as e: # the table still comes back; pip's own lines are above it
            return 'FAILED (pip install)',f"pip install exited with {e.returncode}"
    r,detail = check_install()
    return r,f"{f'installed {len(ws)} carried wheel(s)' if ws else 'nothing to install'}; {detail}"

def check_install():
    ("(result, detail) of the install: `pip check`'s problems only warn (the wheels went in with --no-deps, so a compiled one, "
     "spaCy's thinc or blis, may not match the image's numpy, which only the IMDB step needs); fastai or fastddp not importing fails")
    c = subprocess.run([PY, '-m', 'pip', 'check'], capture_output=True, text=True)
    (LOGS/'pip_check.log').write_text(c.stdout+c.stderr)
    probs = [l for l in (c.stdout+c.stderr).splitlines() if l.strip()] if c.returncode else []
    for l in probs[:20]: print(f"WARNING pip check: {l}", flush=True)
    if len(probs)>20: print(f"WARNING pip check: {len(probs)-20} more line(s) in {LOGS/'pip_check.log'}", flush=True)
    detail = f"pip check WARNING, {len(probs)} line(s): {probs[0]}" if probs else 'pip check: no broken requirements'
    imp = lambda code: subprocess.run([PY, '-c', code], capture_output=True, text=True)
    if importlib.util.find_spec('spacy') is not None and (o := imp('import spacy')).returncode:
        print(f"WARNING spaCy does not import: {o.stderr.strip().splitlines()[-1:]}", flush=True)
        detail += f"; spaCy does not import: {''.join(o.stderr.strip().splitlines()[-1:])}"
    if (o := imp('import fastai.basics, fastddp.core')).returncode:
        return 'FAILED (fastai/fastddp do not import)',f"{''.join(o.stderr.strip().splitlines()[-1:])}; {detail}"
    return 'passed',detail

def _nbs_with_cuda():
    return sorted(p.name for p in (ROOT/'nbs').rglob('*.ipynb') if '#| cuda' in p.read_text())

def steps():
    "(name, command, seconds allowed, why it cannot run here or None); the correctness steps share the GPU, each benchmark runs alone"
    scripts = ROOT/'scripts'
    has_spacy = importlib.util.find_spec('spacy') is not None
    bench_dev = '--device' in subprocess.run([PY, '-m', 'fastddp.bench', '--help'], capture_output=True, text=True).stdout
    nbs = '|'.join(n.removesuffix('.ipynb') for n in _nbs_with_cuda())
    xd = ['-n', '6'] if importlib.util.find_spec('xdist') else []
    # the pytest steps run -v: each test's result is in the log as it ends, so a step stopped at its limit still says which passed
    return [
        ('doctor', [PY, '-c', 'from fastddp.doctor import doctor; doctor()'], 120, None),
        ('cuda tests (one GPU, nccl)', [PY, '-m', 'pytest', '-v', '-rA', '-m', 'cuda', '-p', 'no:cacheprovider', *xd, '--deselect',
                                        'tests/test_gpu.py', '--deselect', 'tests/test_bench.py::test_gpu_bench', 'tests'], 300, None),
        ('ranks sharing the GPU (gloo, CUDA tensors)', [PY, '-m', 'pytest', '-v', '-rA', '-p', 'no:cacheprovider', *xd,
                                                        'tests/test_gpu.py'], 300,
         None),
        ('notebooks: cuda cells', [PY, '-c', f'from nbdev.test import nbdev_test; nbdev_test(flags="cuda", n_workers=4, '
                                   f'file_re="^({nbs})\\\\.ipynb$")'], 300,
         None if importlib.util.find_spec('nbdev') else 'nbdev is not installed'),
        ('tabular script, python -m fastai.launch', [PY, '-m', 'fastai.launch', str(scripts/'tabular_ddp.py'), '--synthetic', '2000',
                                                     '--epochs', '1', '--fp16'], 300, None),
        ('pets script, fastddp-launch, --fp16 --time-cost', [PY, '-m', 'fastddp.launch', str(scripts/'pets_ddp.py'), '--synthetic', '148',
                                                             '--arch', 'resnet18', '--no-pretrained', '--size', '64', '--epochs', '1',
                                                             '--fp16', '--time-cost'], 300, None),
        ('IMDB sample script, python', [PY, str(scripts/'imdb_ddp.py'), '--sample', '--synthetic', '200', '--no-pretrained', '--epochs',
                                        '1'], 300,
         None if has_spacy else 'spaCy missing: carry gpu-wheels.tar.xz (make gpu-wheels)'),
        ('python -m fastddp.bench --device cuda', [PY, '-m', 'fastddp.bench', '--device', 'cuda', '--save', str(LOGS/'bench_cuda.json')],
         150, None if bench_dev else 'fastddp.bench has no --device option'),
        ("fastai's optimizer step vs fastddp.foreach's, bench on the GPU", [PY, 'tools/bench_foreach.py', '--device', 'cuda', '--save',
                                                                          str(LOGS/'foreach_cuda.json')], 60, None),
        ("the MLP step by DataLoader workers, and cProfile'd (bench)", [PY, 'tools/profile_mlp.py', '--device', 'cuda', '--save',
                                                                       str(LOGS/'profile_mlp.txt')], 150, None),
    ]

def start(name, cmd):
    ("Start one step with its output in a log file: (process, log, start time). In a session of its own, so that `stop` can end "
     "its process group; unbuffered, so that a stopped step's log holds all it printed")
    log = LOGS/(''.join(c if c.isalnum() else '_' for c in name)[:40]+'.log')
    with open(log, 'w') as f: # the child keeps its own copy of the file
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             env={**os.environ, 'PYTHONUNBUFFERED': '1'})
    return p, log, time.time()

def _procs():
    "{pid: (parent pid, process group)} of the live processes (not zombies), from Linux's /proc; {} elsewhere"
    res = {}
    for d in (os.listdir('/proc') if os.path.isdir('/proc') else []):
        if not d.isdigit(): continue
        try: st = Path(f'/proc/{d}/stat').read_text()
        except OSError: continue # ended meanwhile
        f = st[st.rindex(')')+2:].split() # the command's name, in parentheses, may hold spaces
        if f[0]!='Z': res[int(d)] = int(f[1]),int(f[2])
    return res

def _tree(pid, ps=None):
    "`pid` and its live descendants, whichever session each is in"
    ps = _procs() if ps is None else ps
    kids = {}
    for c,(pp,_) in ps.items(): kids.setdefault(pp, []).append(c)
    res,todo = set(),[pid]
    while todo:
        x = todo.pop()
        if x in ps and x not in res: res.add(x); todo += kids.get(x, [])
    return res

def _signal(pids, pg, sig):
    for f,x in [(os.killpg, pg)]*(pg is not None)+[(os.kill, o) for o in pids]:
        try: f(x, sig)
        except (ProcessLookupError, PermissionError): pass # ended meanwhile

def stop(pids, pg=None, grace=GRACE):
    ("End the processes `pids` and the process group `pg`: SIGTERM, then SIGKILL to what is left after `grace` s; waits (a few s) "
     "until they are gone, so that the next step has the GPU's memory. The pids, not only the group: torch's elastic agent (under "
     "torchrun, fastddp-launch, fastai.launch, accelerate) starts each rank in a session of its own")
    alive = lambda: {o for o,(_,g) in _procs().items() if o in pids or (pg is not None and g==pg)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal(pids, pg, sig)
        t = time.time()+grace
        while (left := alive()) and time.time()<t: time.sleep(0.1)
        if not left: return
        pids = left

def stop_step(p, grace=GRACE):
    "End step `p` and every process it started; its return code"
    if p.poll() is None: stop(_tree(p.pid), p.pid, grace)
    return p.wait()

def subreaper():
    ("Make this process the child subreaper (Linux): the processes a step leaves when it ends become ours, not init's, and "
     "`stragglers` finds them; False where it cannot")
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)==0 # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError): return False

def stragglers():
    "{pid: command line} of our descendants: what ended steps left (run_ranks's timeout kills the launcher, not its ranks)"
    res = {}
    for o in _tree(os.getpid())-{os.getpid()}:
        try: res[o] = Path(f'/proc/{o}/cmdline').read_bytes().replace(b'\0', b' ').decode(errors='replace').strip()[:100]
        except OSError: pass # ended meanwhile
    return res

def _results(log):
    "The pytest results a -v log has so far: 'N passed, M failed' (its lines name each test as it ends)"
    n = {}
    for l in log.read_text(errors='replace').splitlines():
        m = re.search(r'\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b', l)
        if m and '::' in l and not l.startswith(m[1]): n[m[1].lower()] = n.get(m[1].lower(), 0)+1 # not -rA's summary lines
    return ', '.join(f'{v} {k}' for k,v in n.items())

def bench_verdict(fn):
    "(result, detail) of the GPU benchmark's saved rows: each workload's ratio against issue 36's target; host syncs fail the step"
    rows = json.loads(Path(fn).read_text())['rows']
    med = lambda xs: sorted(xs)[len(xs)//2]
    parts,syncs = [],0
    for r in rows:
        rs = [h/f for f,h in zip(r['fastddp_s'], r['hand_s'])] # speed: hand-written time / fastddp time, per pair of blocks
        k = r['name'].split()[0]
        tgt,low = TARGETS.get(k, (None, None))
        ok = tgt is None or (med(rs)>=tgt and (low is None or min(rs)>=low))
        parts.append(f"{k} {med(rs):.2f} ({min(rs):.2f}-{max(rs):.2f}){'' if tgt is None else ' meets' if ok else ' UNDER'} "
                     f"{'' if tgt is None else tgt}")
        syncs += sum(r['fastddp_syncs'])
    return ('passed' if syncs==0 else 'FAILED (host syncs)'), f"{'; '.join(parts)}; fastddp host syncs {syncs}"

def finish(running, deadline, done=lambda res: None):
    ("Wait for the started steps `(name, secs, process, log, start)`, each until its own limit (then it fails: FAILED (timeout)) or "
     "the `deadline` (not its fault: 'not finished (budget)'); `done` after each: `{name: (result, seconds, detail)}`. On any way "
     "out (an error, ^C, SIGTERM) the steps still running are stopped")
    res,left = {},list(running)
    try:
        while left:
            for o in list(left):
                name,secs,p,log,t0 = o
                rc = p.poll()
                if rc is None and time.time()<min(t0+secs, deadline): continue
                if rc is None: stop_step(p); rc = 'timeout' if time.time()>=t0+secs else 'budget'
                tail = [l for l in log.read_text(errors='replace').splitlines() if l.strip()][-1:] or ['']
                r = 'passed' if rc==0 else 'not finished (budget)' if rc=='budget' else f'FAILED ({rc})'
                detail = tail[0][:100]
                if rc in ('timeout', 'budget'): # and which tests had passed, for a pytest step
                    done_ = _results(log)
                    detail = (f"stopped at {f'its {secs}' if rc=='timeout' else f'the budget: {deadline-t0:.0f}'} s"
                              f"{f'; {done_} before' if done_ else ''}; last line: {tail[0][:80]}")
                res[name] = r, time.time()-t0, detail
                if rc==0 and 'fastddp.bench' in name: # its numbers against the targets, in the table
                    try: r,detail = bench_verdict(LOGS/'bench_cuda.json')
                    except (OSError, KeyError, ValueError) as e: r,detail = 'FAILED (its saved rows)',f"{type(e).__name__}: {e}"
                    res[name] = r,res[name][1],detail
                print(f"{name}: {res[name][0]} in {res[name][1]:.0f} s", flush=True)
                left.remove(o)
                done(res)
            time.sleep(0.5)
    finally:
        for o in left: stop_step(o[2])
    return res

def run(groups, deadline, done=lambda res: None):
    ("Run each group of steps `(name, command, secs, why)` in turn, the steps of a group together. A step starts only if its limit "
     "(and a stop's two graces) fits before `deadline`, else it is 'not run (budget)': cut at the deadline it would tell nothing, "
     "and count as failed. After each group, what its steps left running is ended. `{name: (result, seconds, detail)}`")
    res = {}
    for group in groups:
        now = time.time()
        fit = [o for o in group if now+o[2]+2*GRACE<=deadline]
        for name,_,secs,_ in group:
            if any(o[0]==name for o in fit): continue
            res[name] = 'not run (budget)',0.,f"its {secs} s limit did not fit in the {max(deadline-now, 0):.0f} s left of the budget"
            print(f"{name}: {res[name][0]}", flush=True)
        if fit: res.update(finish([(name, secs, *start(name, cmd)) for name,cmd,secs,_ in fit], deadline, lambda r: done({**res, **r})))
        if sl := stragglers(): # before the next group: a benchmark must have the GPU to itself
            print(f"ending {len(sl)} process(es) the steps left running: {list(sl.values())[:3]}", flush=True)
            stop(set(sl))
        done(res)
    return res

def unrun(rows):
    "The table's first line: the steps the budget left out, and how to run them, or '' when all ran"
    ns = [n for n,(r,_,_) in rows.items() if 'budget' in r]
    return (f"**Not run for lack of time ({BUDGET:.0f} s budget, FASTDDP_GPU_BUDGET): {'; '.join(ns)}.** Not failures: run them "
            f"next, `python tools/test_gpu.py WORD...` with a word of each name" if ns else '')

def main():
    LOGS.mkdir(parents=True, exist_ok=True)
    t0,rows = time.time(),{}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)) # a SIGTERM ends it by its `finally`s: the steps' processes too
    subreaper()
    import torch
    cuda = torch.cuda.is_available()
    card = torch.cuda.get_device_name(0) if cuda else 'no CUDA GPU'
    if cuda: r,detail = install(); rows['install (offline)'] = r,time.time()-t0,detail
    sts = steps()
    only = sys.argv[1:] # words: run only the steps whose names hold one of them (a rerun of what failed)
    if only: sts = [o for o in sts if any(w in o[0] for w in only)]
    for name,_,_,why in sts:
        if not cuda: why = 'not run: no CUDA GPU (torch.cuda.is_available() is False)'
        if why: rows[name] = ('not run', 0., why)
    todo,deadline = [o for o in sts if o[0] not in rows],t0+BUDGET
    order = ['install (offline)']+[o[0] for o in sts] # the table in the steps' order, whenever each ended
    def summary(res=None):
        "The table so far, written after each step: a run cut short still leaves it"
        rs = {**rows, **(res or {})}
        ls = [f"make test-gpu on {card}, torch {torch.__version__}, Python {sys.version.split()[0]}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {time.time()-t0:.0f} s in all; logs in {LOGS}",
              *[o for o in [unrun(rs)] if o], '', '| step | result | seconds | detail |', '|---|---|---|---|']
        ls += [f"| {n} | {rs[n][0]} | {rs[n][1]:.0f} | {rs[n][2].replace('|', '/')} |" for n in order if n in rs]
        (LOGS/'summary.md').write_text('\n'.join(ls)+'\n')
        (LOGS/'summary.json').write_text(json.dumps(dict(card=card, torch=torch.__version__, rows=rs)))
        return ls
    # the correctness steps together (16 CPUs, one GPU), then each benchmark alone: its timings must not share the GPU
    groups = [[o for o in todo if 'bench' not in o[0]], *[[o] for o in todo if 'bench' in o[0]]]
    try: rows.update(run(groups, deadline, summary))
    finally: # an error, ^C or SIGTERM: nothing of ours left on the GPU
        if sl := stragglers(): stop(set(sl))
    print('\n'.join(summary()))
    return 1 if any(r.startswith('FAILED') for r,_,_ in rows.values()) else 0

if __name__=='__main__': sys.exit(main())
