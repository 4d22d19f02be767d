("What the numerics-changing opt-ins cost in final accuracy: an example script on 2 "
 "CPU ranks, each opt-in beside exact DDP, same seeds, interleaved")
import json, os, shlex, statistics, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    # the real Adult's 32,561 rows (generated offline, in its layout, with a learnable salary rule); fastai's default model and bs.
    # PowerSGD keeps its default 1,000 plain steps first: 8 epochs of 204 steps compress the last 632 (39%), the whole annealing tail
    'tabular': ['--synthetic', '32561', '--bs', '64', '--epochs', '8', '--lr', '1e-2'],
    # the benchmark's resnet18 at 64px from random weights, 1,480 generated pets (40 per breed); 18 steps per epoch: PowerSGD never starts
    'pets': ['--synthetic', '1480', '--size', '64', '--bs', '32', '--arch', 'resnet18', '--no-pretrained', '--epochs', '3']}
OPTS = {'exact': [], 'fp16': ['--comm-hook', 'fp16'], 'powersgd': ['--comm-hook', 'powersgd'], 'accum4': ['--accum', '4']}

def run(case, opt, seed, d):
    "The `metrics.json` of one 2-rank run of `case` with opt-in `opt`"
    out = Path(d)/f'{opt}{seed}'
    cmd = [sys.executable, '-m', 'fastddp.launch', '--nproc', '2', str(ROOT/'scripts'/f'{case}_ddp.py'), *CASES[case], *OPTS[opt],
           '--seed', str(seed), '--out', str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, 'FASTDDP_DATA': str(Path(d)/'data'), 'OMP_NUM_THREADS': '1'})
    return json.loads((out/'metrics.json').read_text())

def fmt(xs, f='.4f'): return f"{statistics.median(xs):{f}} ({min(xs):{f}} to {max(xs):{f}})"

def acc(r): return r['metrics']['accuracy'] if 'accuracy' in r['metrics'] else 1-r['metrics']['error_rate']

def main(case='tabular', seeds=5, opts=tuple(OPTS), save=None):
    with tempfile.TemporaryDirectory() as d:
        res = {o:[] for o in opts}
        for s in range(seeds): # interleaved: every opt-in once per seed, so drifts in the machine's speed hit them all
            for o in opts: res[o].append(run(case, o, s, d))
    title = (f"{case}_ddp.py {' '.join(CASES[case])}, 2 gloo ranks, seeds 0-{seeds-1}: median (min to max); "
             "differences and ratios are paired by seed")
    t = table(res)
    print(title+'\n'); print(t)
    if save:
        from fastddp.bench import save_result
        save_result(save, 'accuracy', title, 'python tools/bench_accuracy.py '+shlex.join(sys.argv[1:]), t, metrics=res)

def table(res):
    "Markdown: accuracy of each opt-in, its difference from exact DDP and its speed, paired by seed"
    ls = ["| opt-in | accuracy | accuracy - exact | valid loss | speed vs exact (s/epoch ratio) |", "|---|---|---|---|---|"]
    ex = res['exact']
    for o,rs in res.items():
        acs = [acc(r) for r in rs]
        da = [a-acc(e) for a,e in zip(acs, ex)]
        sp = [e['sec_per_epoch']/r['sec_per_epoch'] for r,e in zip(rs, ex)]
        ls.append(f"| {o} | {fmt(acs)} | {fmt(da, '+.4f')} | {fmt([r['valid_loss'] for r in rs])} | {fmt(sp, '.2f')} |")
    return '\n'.join(ls)

# python tools/bench_accuracy.py [case [seeds [opt-in ...]]] [--save FILE.json]: exact DDP always runs
if __name__=='__main__':
    a = sys.argv[1:]
    save = a[a.index('--save')+1] if '--save' in a else None
    if save: i = a.index('--save'); a = a[:i]+a[i+2:]
    main(a[0] if a else 'tabular', int(a[1]) if len(a)>1 else 5, ('exact', *a[2:]) if len(a)>2 else tuple(OPTS), save)
