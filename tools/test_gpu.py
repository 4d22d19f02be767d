"""`make test-gpu`: every GPU check in one command, one table at the end (`python tools/test_gpu.py WORD...`: only the steps whose
names hold a word). On a machine whose Python has torch but not fastai it
first installs the carried wheels offline (`make gpu-wheels` downloads them here); on a machine without CUDA it reports each GPU
step as not run."""
import os, sys, time, json, tempfile, subprocess, importlib.util, importlib.metadata as md
from pathlib import Path

ROOT = Path(__file__).parent.parent
LOGS = Path(os.environ.get('OUT') or ROOT/'gpu-logs') # the device tool brings $OUT back
PY = sys.executable
# seconds for every step together: a device call may run 600 s, and the table must come back even when a step runs long
BUDGET = float(os.environ.get('FASTDDP_GPU_BUDGET') or 540)
# issue 36's targets: fastddp / hand-written loop, median of the paired blocks (and the lowest pair) per workload
TARGETS = {'MLP': (0.9, None), 'resnet18': (0.98, 0.95), 'resnet50': (0.98, 0.95)}

def _dist(whl): return whl.name.split('-')[0].lower().replace('_', '-')

def _installed(name):
    try: md.version(name); return True
    except md.PackageNotFoundError: return False

def install():
    "Install the carried wheels this Python lacks, and fastddp itself (editable), offline; a line saying what was done"
    with tempfile.TemporaryDirectory() as d:
        ws = [w for o in ('wheels', 'wheels-text') for w in sorted((ROOT/o).glob('*.whl'))]
        if (ROOT/'gpu-wheels.tar.xz').exists(): # `make gpu-wheels`'s one file to carry: all the wheels
            sys.path.insert(0, str(ROOT/'tools'))
            from gpu_wheels import unpack
            have = {o.name for o in ws}
            ws += [o for o in unpack(ROOT/'gpu-wheels.tar.xz', d) if o.name not in have]
        ws = [w for w in ws if not _installed(_dist(w))]
        if ws: subprocess.run([PY, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps', *map(str, ws)], check=True)
    importlib.invalidate_caches() # `steps` looks for spaCy, installed just now
    if importlib.util.find_spec('fastddp') is None or not _installed('fastddp'):
        subprocess.run([PY, '-m', 'pip', 'install', '-q', '--no-deps', '--no-build-isolation', '-e', str(ROOT)], check=True)
    return f"installed {len(ws)} carried wheel(s)" if ws else "nothing to install"

def _nbs_with_cuda():
    return sorted(p.name for p in (ROOT/'nbs').rglob('*.ipynb') if '#| cuda' in p.read_text())

def steps():
    "(name, command, seconds allowed, why it cannot run here or None); the correctness steps share the GPU, each benchmark runs alone"
    scripts = ROOT/'scripts'
    has_spacy = importlib.util.find_spec('spacy') is not None
    bench_dev = '--device' in subprocess.run([PY, '-m', 'fastddp.bench', '--help'], capture_output=True, text=True).stdout
    nbs = '|'.join(n.removesuffix('.ipynb') for n in _nbs_with_cuda())
    xd = ['-n', '6'] if importlib.util.find_spec('xdist') else []
    return [
        ('doctor', [PY, '-c', 'from fastddp.doctor import doctor; doctor()'], 120, None),
        ('cuda tests (one GPU, nccl)', [PY, '-m', 'pytest', '-q', '-rA', '-m', 'cuda', '-p', 'no:cacheprovider', *xd, '--deselect',
                                        'tests/test_gpu.py', '--deselect', 'tests/test_bench.py::test_gpu_bench', 'tests'], 300, None),
        ('ranks sharing the GPU (gloo, CUDA tensors)', [PY, '-m', 'pytest', '-q', '-rA', '-p', 'no:cacheprovider', *xd,
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
    "Start one step with its output in a log file: (process, log, start time)"
    log = LOGS/(''.join(c if c.isalnum() else '_' for c in name)[:40]+'.log')
    f = open(log, 'w')
    return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), log, time.time()

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
    ("Wait for the started steps `(name, secs, process, log, start)`, each until its own limit or the `deadline`; `done` after each: "
     "`{name: (result, seconds, last line)}`")
    res,left = {},list(running)
    while left:
        for o in list(left):
            name,secs,p,log,t0 = o
            rc = p.poll()
            if rc is None and time.time()<min(t0+secs, deadline): continue
            if rc is None: p.kill(); p.wait(); rc = 'timeout'
            tail = [l for l in log.read_text(errors='replace').splitlines() if l.strip()][-1:] or ['']
            res[name] = ('passed' if rc==0 else f'FAILED ({rc})'), time.time()-t0, tail[0][:100]
            if rc==0 and 'fastddp.bench' in name: # its numbers against the targets, in the table
                try: r,detail = bench_verdict(LOGS/'bench_cuda.json')
                except (OSError, KeyError, ValueError) as e: r,detail = 'FAILED (its saved rows)',f"{type(e).__name__}: {e}"
                res[name] = r,res[name][1],detail
            print(f"{name}: {res[name][0]} in {res[name][1]:.0f} s", flush=True)
            left.remove(o)
            done(res)
        time.sleep(0.5)
    return res

def main():
    LOGS.mkdir(parents=True, exist_ok=True)
    t0,rows = time.time(),{}
    import torch
    cuda = torch.cuda.is_available()
    card = torch.cuda.get_device_name(0) if cuda else 'no CUDA GPU'
    if cuda: rows['install (offline)'] = ('passed', time.time()-t0, install())
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
              '', '| step | result | seconds | detail |', '|---|---|---|---|']
        ls += [f"| {n} | {rs[n][0]} | {rs[n][1]:.0f} | {rs[n][2].replace('|', '/')} |" for n in order if n in rs]
        (LOGS/'summary.md').write_text('\n'.join(ls)+'\n')
        (LOGS/'summary.json').write_text(json.dumps(dict(card=card, torch=torch.__version__, rows=rs)))
        return ls
    # the correctness steps together (16 CPUs, one GPU), then each benchmark alone: its timings must not share the GPU
    for group in ([o for o in todo if 'bench' not in o[0]], *[[o] for o in todo if 'bench' in o[0]]):
        if time.time()>deadline-20: # too little left to start it: said, not run
            rows.update({o[0]: ('not run', 0., f'the {BUDGET:.0f} s budget (FASTDDP_GPU_BUDGET) was spent') for o in group}); continue
        rows.update(finish([(name, secs, *start(name, cmd)) for name,cmd,secs,_ in group], deadline, summary))
    print('\n'.join(summary()))
    return 1 if any(r.startswith('FAILED') for r,_,_ in rows.values()) else 0

if __name__=='__main__': sys.exit(main())
