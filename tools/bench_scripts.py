"Seconds per epoch of each example script on its generated dataset: 1 process vs 2 CPU ranks, interleaved, paired ratios"
import json, os, statistics, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {'tabular': ['--synthetic', '2000', '--bs', '64', '--epochs', '2'],
         'pets': ['--synthetic', '296', '--size', '64', '--bs', '16', '--arch', 'resnet18', '--no-pretrained', '--epochs', '1'],
         'imdb': ['--sample', '--synthetic', '400', '--bs', '16', '--no-pretrained', '--epochs', '1']}

def run(name, n, d):
    "`sec_per_epoch` of one run of `scripts/{name}_ddp.py` on `n` processes"
    out = Path(d)/f'{name}{n}'
    cmd = [sys.executable, *(['-m', 'fastddp.launch', '--nproc', str(n)] if n>1 else []), str(ROOT/'scripts'/f'{name}_ddp.py'), *CASES[name], '--out', str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, 'FASTDDP_DATA': str(Path(d)/'data'), 'OMP_NUM_THREADS': '1'})
    return json.loads((out/'metrics.json').read_text())['sec_per_epoch']

def main(reps=5, names=tuple(CASES)):
    print(f"| script | s/epoch, 1 process (median) | s/epoch, 2 ranks (median) | 1 process / 2 ranks (median of {reps} pairs) | spread |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for nm in names:
            run(nm, 1, d) # generate the data once, untimed
            r1,r2 = [],[]
            for _ in range(reps): r1.append(run(nm, 1, d)); r2.append(run(nm, 2, d))
            rs = [a/b for a,b in zip(r1, r2)]
            print(f"| {nm} | {statistics.median(r1):.2f} | {statistics.median(r2):.2f} | {statistics.median(rs):.2f} | {min(rs):.2f}-{max(rs):.2f} |", flush=True)

if __name__=='__main__': main(int(sys.argv[1]) if len(sys.argv)>1 else 5, tuple(sys.argv[2:]) or tuple(CASES))
