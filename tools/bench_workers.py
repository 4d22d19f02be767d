"""Seconds per epoch of the pets script (image decoding and augmentation in the DataLoader workers) on 2 CPU ranks, with the
DataLoader workers left at fastai's default inside `distrib_ctx` (which gives each rank its share, `n_workers()`), against fixed
counts per rank (fastai's own default, `min(16, CPUs)`, among them); interleaved, paired ratios against the rule.
Usage: `python tools/bench_workers.py [--reps 5] [--counts 0,1,2] [--save nbs/bench_results/19_pets_workers.json]`"""
import argparse, json, os, shlex, statistics, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARGS = ['--synthetic', '296', '--size', '64', '--bs', '16', '--arch', 'resnet18', '--no-pretrained', '--epochs', '1']

def run(w, d, n=2):
    "`sec_per_epoch` of one 2-rank run of the pets script with `--workers w` (-1: left at fastai's default)"
    out = Path(d)/f'w{w}'
    cmd = [sys.executable, '-m', 'fastddp.launch', '--nproc', str(n), str(ROOT/'scripts'/'pets_ddp.py'), *ARGS, '--workers', str(w),
           '--out', str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'FASTDDP_DATA': str(Path(d)/'data'), 'OMP_NUM_THREADS': '1'})
    if p.returncode: raise RuntimeError(f"{shlex.join(cmd)} exited with {p.returncode}:\n{(p.stdout+p.stderr)[-3000:]}")
    return json.loads((out/'metrics.json').read_text())['sec_per_epoch']

def name(w):
    import fastddp.core as c
    from fastcore.basics import defaults
    if w==-1: return f"left at fastai's default: distrib_ctx's share ({c.rank_workers(c.cpus()[0], 2)} per rank here)"
    return f"num_workers={w}"+(" (fastai's default here, min(16, CPUs))" if w==min(16, defaults.cpus) else "")

def table(res):
    "Markdown: seconds per epoch of each setting, and its paired ratio against the rule"
    base = res[-1]
    ls = ["| workers per rank | s/epoch (median) | runs | rule's speed / this one's (median of pairs) | spread |", "|---|---|---|---|---|"]
    for w,v in res.items():
        rs = [a/b for a,b in zip(v, base)]
        ls.append(f"| {name(w)} | {statistics.median(v):.2f} | {', '.join(f'{o:.2f}' for o in v)} | {statistics.median(rs):.2f} | "
                  f"{min(rs):.2f}-{max(rs):.2f} |")
    return '\n'.join(ls)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=5); p.add_argument('--counts', default='0,1,2'); p.add_argument('--save')
    a = p.parse_args()
    ws = [-1]+[int(o) for o in a.counts.split(',')]
    load0 = os.getloadavg()
    res = {w:[] for w in ws}
    with tempfile.TemporaryDirectory() as d:
        run(0, d) # generate the data once, untimed
        for i in range(a.reps):
            for w in ws: res[w].append(run(w, d))
            print(f"rep {i+1}: "+', '.join(f"{w}: {v[-1]:.2f}" for w,v in res.items()), flush=True)
    load1 = os.getloadavg()
    title = (f"pets script (resnet18, 64 px, 296 generated images, batch 16 per rank, fine_tune 1 epoch) on 2 CPU ranks: "
             f"DataLoader workers per rank, {a.reps} interleaved repetitions, 1 thread per process; "
             f"load average {load0[0]:.1f} before, {load1[0]:.1f} after (a shared machine)")
    t = table(res)
    sys.path.insert(0, str(ROOT))
    from fastddp.bench import show_result
    show_result(a.save, 'workers', title, 'python tools/bench_workers.py '+shlex.join(sys.argv[1:]), t,
                sec_per_epoch={str(k):v for k,v in res.items()}, load=[load0, load1])

if __name__=='__main__': main()
