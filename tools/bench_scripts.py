"Seconds per epoch of each example script on its generated dataset: 1 process vs 2 CPU ranks, interleaved, paired ratios"
import json, os, shlex, statistics, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {'tabular': ['--synthetic', '2000', '--bs', '64', '--epochs', '2'],
         'pets': ['--synthetic', '296', '--size', '64', '--bs', '16', '--arch', 'resnet18', '--no-pretrained', '--epochs', '1'],
         'imdb': ['--sample', '--synthetic', '400', '--bs', '16', '--no-pretrained', '--epochs', '1']}

def run(name, n, d):
    "`sec_per_epoch` of one run of `scripts/{name}_ddp.py` on `n` processes"
    out = Path(d)/f'{name}{n}'
    cmd = [sys.executable, *(['-m', 'fastddp.launch', '--nproc', str(n)] if n>1 else []), str(ROOT/'scripts'/f'{name}_ddp.py'),
           *CASES[name], '--out', str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, 'FASTDDP_DATA': str(Path(d)/'data'), 'OMP_NUM_THREADS': '1'})
    return json.loads((out/'metrics.json').read_text())['sec_per_epoch']

def table(res):
    "Markdown: each script's seconds per epoch on 1 process and on 2 ranks, and their paired ratio"
    ls = ["| script | s/epoch, 1 process (median) | s/epoch, 2 ranks (median) | 1 process / 2 ranks (median of pairs) | spread |",
          "|---|---|---|---|---|"]
    for nm,(r1,r2) in res.items():
        rs = [a/b for a,b in zip(r1, r2)]
        ls.append(f"| {nm} | {statistics.median(r1):.2f} | {statistics.median(r2):.2f} | {statistics.median(rs):.2f} | "
                  f"{min(rs):.2f}-{max(rs):.2f} |")
    return '\n'.join(ls)

def main(reps=5, names=tuple(CASES), save=None):
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for nm in names:
            run(nm, 1, d) # generate the data once, untimed
            r1,r2 = [],[]
            for _ in range(reps): r1.append(run(nm, 1, d)); r2.append(run(nm, 2, d))
            res[nm] = (r1, r2)
            print(table({nm: res[nm]}).splitlines()[-1], flush=True)
    title = (f"seconds per epoch of the example scripts on generated data, 1 process vs 2 CPU ranks (fastddp-launch), "
             f"{reps} interleaved pairs, 1 thread per process")
    print(title); print(table(res))
    if save:
        from fastddp.bench import save_result
        save_result(save, 'scripts', title, 'python tools/bench_scripts.py '+shlex.join(sys.argv[1:]), table(res), sec_per_epoch=res,
                    cases=CASES)

# python tools/bench_scripts.py [reps [script ...]] [--save FILE.json]
if __name__=='__main__':
    a = sys.argv[1:]
    save = a[a.index('--save')+1] if '--save' in a else None
    if save: i = a.index('--save'); a = a[:i]+a[i+2:]
    main(int(a[0]) if a else 5, tuple(a[1:]) or tuple(CASES), save)
