"""Time from a SIGTERM to the launcher to the checkpoint on disk, and the training steps done after it, for the shipped scripts on 2 ranks.

Each repetition starts `fastddp-launch --nproc 2 SCRIPT ... --checkpoint TMP`, waits until training has run `--after` seconds,
sends SIGTERM to the launcher, and reads the line every stopped run prints ("checkpoint ... written in X s, Y s and N step(s)
after the signal"); it also checks the launcher's exit code (75) and that the checkpoint is there.
Usage: `python tools/bench_preempt.py --reps 3 --save nbs/bench_results/23_preempt_time.json`"""
import os, re, sys, time, signal, shutil, tempfile, statistics, subprocess
from pathlib import Path
from fastcore.script import call_parse

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {'resnet18': ['scripts/pets_ddp.py', '--synthetic', '600', '--arch', 'resnet18', '--no-pretrained', '--size', '64', '--bs', '32',
                        '--epochs', '3'],
           'tabular': ['scripts/tabular_ddp.py', '--synthetic', '40000', '--epochs', '3']}
LINE = re.compile(r"fastddp: (SIG\w+): every rank stopped at epoch (\d+), step (\d+); checkpoint (\S+) written in ([\d.]+) s, "
                  r"([\d.]+) s and (\d+) step\(s\) after the signal")

def once(model, after):
    "One stopped run of `model`'s script: the figures of its line, and the launcher's exit code"
    d = tempfile.mkdtemp()
    try:
        cmd = [sys.executable, '-m', 'fastddp.launch', '--nproc', '2', *SCRIPTS[model], '--checkpoint', d]
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, 'PYTHONUNBUFFERED': '1'})
        out,t0 = '',None
        os.set_blocking(p.stdout.fileno(), False)
        while p.poll() is None:
            out += (p.stdout.read() or b'').decode(errors='replace')
            if t0 is None and re.search(r'Epoch \d+/\d+ : \|', out): t0 = time.time() # the first training step is under way
            if t0 and time.time()-t0>after and p.returncode is None:
                p.send_signal(signal.SIGTERM); after = float('inf')
            time.sleep(0.05)
        out += (p.stdout.read() or b'').decode(errors='replace')
        m = LINE.search(out)
        if not m: raise RuntimeError(f"{model}: no preemption line (exit code {p.returncode}):\n{out[-3000:]}")
        ck = Path(m.group(4))
        return dict(rc=p.returncode, sig=m.group(1), epoch=int(m.group(2)), step=int(m.group(3)), ckpt_ok=ck.exists(),
                    write_s=float(m.group(5)), signal_to_disk_s=float(m.group(6)), steps_after=int(m.group(7)),
                    ckpt_mib=sum(f.stat().st_size for f in ([ck] if ck.is_file() else ck.rglob('*')))/2**20)
    finally: shutil.rmtree(d, ignore_errors=True)

FLAG = '''
import sys, time, torch, torch.distributed as dist
from fastddp.core import *; from fastddp.testing import report
from fastddp.core import flag_group
from fastddp.preempt import Preempt
init_distrib('gloo'); torch.set_num_threads(1)
reps,n = int(sys.argv[1]),int(sys.argv[2])
p = Preempt(check=1); p.group,p.got,p.work = flag_group(),[],None
res = dict(none=[], flag=[])
for _ in range(reps):
    for k in res: # interleaved
        dist.barrier(); t0 = time.perf_counter()
        for i in range(n):
            if k=='flag': p._flag(False) # read the last check's answer, post this one
        res[k].append((time.perf_counter()-t0)/n*1e6)
p._collect()
report(**res)
'''

def flag_cost(reps, n=2000):
    ("Microseconds per check with nothing between two checks (so every check waits for the whole "
     "round trip of the previous one): an upper bound of its cost per step")
    from fastddp.testing import run_ranks
    r = run_ranks(FLAG, n=2, args=[reps, n], env={'OMP_NUM_THREADS': '1'})[0]
    return [f-o for f,o in zip(r['flag'], r['none'])]

@call_parse
def main(models:str='resnet18,tabular', # comma-separated: resnet18, tabular
         reps:int=3, # stopped runs per model (interleaved)
         after:float=3., # seconds of training before the signal
         save:str=None): # JSON file for the results
    "Stop each script with SIGTERM to its launcher `reps` times and summarise the time from the signal to the checkpoint on disk"
    ms,res = models.split(','),{}
    load0 = os.getloadavg()
    us = flag_cost(max(reps, 5))
    for _ in range(reps):
        for m in ms: res.setdefault(m, []).append(once(m, after))
    rows = ["| model | signal → checkpoint on disk (s), median [min-max] | write (s) | steps after the signal | checkpoint MiB | "
            "exit codes |",
            "|---|---|---|---|---|---|"]
    for m,rs in res.items():
        f = lambda k: f"{statistics.median(o[k] for o in rs):.2f} [{min(o[k] for o in rs):.2f}-{max(o[k] for o in rs):.2f}]"
        rows.append(f"| {m} | {f('signal_to_disk_s')} | {f('write_s')} | {', '.join(str(o['steps_after']) for o in rs)} | "
                    f"{rs[0]['ckpt_mib']:.1f} | {', '.join(str(o['rc']) for o in rs)} |")
    table = ('\n'.join(rows)+f"\n\nOne check of the stop flag (2 ranks, gloo, nothing between two checks: each waits for the previous "
             f"all-reduce's whole round trip, an upper bound per step): median {statistics.median(us):.0f} µs "
             f"[{min(us):.0f}-{max(us):.0f}] over {len(us)} interleaved repetitions of 2000."
             +f"\n\nLoad average before/after: {load0[0]:.1f} / {os.getloadavg()[0]:.1f} (a shared machine). "
             "torchrun's and Kubernetes' default grace periods are 30 s.")
    print(table)
    if save:
        from fastddp.bench import save_result
        save_result(save, 'preempt', 'Preemption: from the signal to the checkpoint on disk (2 ranks), and the cost of a check',
                    'python tools/bench_preempt.py '+' '.join(sys.argv[1:]), table, runs=res, flag_us=us)
