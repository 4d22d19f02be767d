"""Short steps, paired within the same processes: blocks of a hand-written loop and of fastai's `fit` alternate (A B A B ...)
in one launch, so the load of a shared machine hits both alike; each pair of blocks gives a ratio and a difference in ms per step.

Workload: `python -m fastddp.bench --model mlp` (64-512-512-10, global batch 64, in-memory tensors, SGD with momentum, 1 thread
per process). Two launches: 2 ranks under `fastddp-launch` (the hand-written DDP loop with torch's DataLoader and DDP's defaults,
no comm hook; fastddp's default `distrib_ctx()` with the loaders left at fastai's defaults), and 1 process that never loads
fastddp's patches (the hand-written loop and plain fastai `fit`), which gives fastai's own cost per step.
With `--budget S`, the 2-rank launch also times fastddp's fit with `Preempt.budget = S` (the stop flag's check interval), paired.
Usage: `python tools/short_steps.py [--blocks 12] [--steps 200] [--budget 0.05] [--save nbs/bench_results/22_short_steps_paired.json]`"""
import argparse, os, shlex, statistics, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r'''
import os, sys, time, torch, torch.nn.functional as F
from torch.utils.data import DataLoader as TorchDL, TensorDataset, DistributedSampler
torch.set_num_threads(1)
blocks,steps,warmup,budget = int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3]),float(sys.argv[4])
ws = int(os.environ.get('WORLD_SIZE', 1))
if ws>1:
    import fastddp # before fastai: its patches, as a user's script loads them
    torch.distributed.init_process_group('gloo')
from fastai.basics import *
from fastai.callback.progress import ProgressCallback
from fastddp.testing import report
bs = 64
g = torch.Generator().manual_seed(0)
x,y = torch.randn(bs*(steps+warmup), 64, generator=g),torch.randint(0, 10, (bs*(steps+warmup),), generator=g)
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))
ds = TensorDataset(x, y)
m = model()
ddp = torch.nn.parallel.DistributedDataParallel(m) if ws>1 else m # DDP's defaults: 25 MiB buckets (a 1 MiB first one), no hook
opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
dl = TorchDL(ds, batch_size=bs//ws, sampler=DistributedSampler(ds, seed=0) if ws>1 else None, shuffle=ws==1)
def raw():
    for i,(xb,yb) in enumerate(dl):
        if i==warmup: t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(ddp(xb), yb).backward()
        opt.step()
    return (time.perf_counter()-t0)/steps*1e3
class Timer(Callback):
    order = 1e10
    def before_fit(self): self.i,self.nw = 0,self.learn.dls.train.fake_l.num_workers
    def after_batch(self):
        if not self.training: return
        self.i += 1
        if self.i==warmup: self.t0 = time.perf_counter()
        if self.i==warmup+steps: self.t1 = time.perf_counter()
tm = Timer()
# 2 ranks: `num_workers` left at fastai's default (distrib_ctx gives each rank its share);
# 1 process: none, like the loop (the stricter baseline)
dls = DataLoaders.from_dsets(ds, TensorDataset(x[:bs], y[:bs]), bs=bs//ws, device='cpu', **({} if ws>1 else dict(num_workers=0)))
learn = Learner(dls, model(), loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=0.01, cbs=tm)
learn.remove_cb(ProgressCallback)
def fa():
    learn.fit(1)
    return (tm.t1-tm.t0)/steps*1e3
def fa_budget(): # fastddp with another `Preempt.budget` (seconds of steps between two checks of the stop flag)
    from fastddp.preempt import Preempt
    old,Preempt.budget = Preempt.budget,budget
    try: return fa()
    finally: Preempt.budget = old
sides = [('raw', raw), ('fastai', fa)]+([('budget', fa_budget)] if ws>1 and budget else [])
res = {k:[] for k,_ in sides}
from contextlib import nullcontext
with (learn.distrib_ctx() if ws>1 else nullcontext()):
    for b in range(blocks):
        for k,f in sides[b%len(sides):]+sides[:b%len(sides)]: res[k].append(f()) # each side first in turn
        if ws>1: # rank 0's clock: the steps of every rank end together at the all-reduce
            t = torch.tensor([res[k][-1] for k,_ in sides]); torch.distributed.broadcast(t, 0)
            for (k,_),v in zip(sides, t.tolist()): res[k][-1] = v
report(res=res, patched='fastddp.distrib' in sys.modules, workers=tm.nw)
'''

def launch(n, blocks, steps, warmup, budget=0):
    sys.path.insert(0, str(ROOT))
    from fastddp.testing import run_ranks
    return run_ranks(WORKER, n=n, args=[blocks, steps, warmup, budget], launcher='fastddp' if n>1 else 'python',
                     env={'OMP_NUM_THREADS': '1'}, timeout=1800)[0]

def spread(v): return statistics.median(v), min(v), max(v)

def summary(r):
    "(median, min, max) of the block pairs' ratio raw/fastai (speed of fastai relative to the hand-written loop) and of fastai − raw in ms"
    ra = [a/b for a,b in zip(r['raw'], r['fastai'])]
    d = [b-a for a,b in zip(r['raw'], r['fastai'])]
    return spread(ra), spread(d), statistics.median(r['raw']), statistics.median(r['fastai'])

def table(one, two, budget=0):
    (r1,d1,a1,b1),(r2,d2,a2,b2) = summary(one),summary(two)
    ls = ["| run | hand-written loop, ms/step | fastai, ms/step | fastai's speed / the loop's (median of block pairs, spread) "
          "| fastai − loop, ms/step (median, spread) |", "|---|---|---|---|---|",
          f"| 1 process, fastai without fastddp (`fastai@1` vs `raw@1`) | {a1:.3f} | {b1:.3f} | "
          f"{r1[0]:.3f} ({r1[1]:.3f}-{r1[2]:.3f}) | {d1[0]:.3f} ({d1[1]:.3f} to {d1[2]:.3f}) |",
          f"| 2 ranks, fastddp's default `distrib_ctx()` (`fastddp@2` vs `raw@2`) | {a2:.3f} | {b2:.3f} | "
          f"{r2[0]:.3f} ({r2[1]:.3f}-{r2[2]:.3f}) | {d2[0]:.3f} ({d2[1]:.3f} to {d2[2]:.3f}) |",
          "", f"What fastddp adds under DDP beyond fastai's own loop: "
              f"(fastddp@2 − raw@2) − (fastai@1 − raw@1) = {d2[0]-d1[0]:.3f} ms per step (medians; target ≤ 0.2)"]
    if 'budget' in two: # the same fastddp fit with another `Preempt.budget`, paired with the default's blocks
        dd = spread([b-a for a,b in zip(two['fastai'], two['budget'])])
        ls += ["", f"With `Preempt.budget = {budget:g}` s: {statistics.median(two['budget']):.3f} ms/step; it minus the default, "
                   f"median of block pairs {dd[0]:.3f} ms/step (spread {dd[1]:.3f} to {dd[2]:.3f})"]
    return '\n'.join(ls)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--blocks', type=int, default=12); p.add_argument('--steps', type=int, default=200)
    p.add_argument('--warmup', type=int, default=20)
    p.add_argument('--budget', type=float, default=0, help="also fastddp's fit with this `Preempt.budget` (s), paired")
    p.add_argument('--save')
    a = p.parse_args()
    load0 = os.getloadavg()
    one = launch(1, a.blocks, a.steps, a.warmup)
    two = launch(2, a.blocks, a.steps, a.warmup, a.budget)
    load1 = os.getloadavg()
    assert not one['patched'] and two['patched']
    title = (f"short steps paired within the processes: MLP 64-512-512-10, global batch 64, {a.blocks} alternating blocks of {a.steps} "
             f"timed steps (after {a.warmup}) per side, 1 thread per process, fastddp's loaders at {two['workers']} workers per rank "
             f"(left at fastai's default), plain fastai's at {one['workers']}; "
             f"load average {load0[0]:.1f} before, {load1[0]:.1f} after (a shared 2-core machine)")
    t = table(one['res'], two['res'], a.budget)
    from fastddp.bench import show_result
    show_result(a.save, 'short_steps', title, 'python tools/short_steps.py '+shlex.join(sys.argv[1:]), t,
                one=one, two=two, load=[load0, load1])

if __name__=='__main__': main()
