"""The torch operators each training step dispatches in the main process: fastddp's default path against the hand-written loop.

On a GPU each operator that computes is a kernel launch, a few microseconds of the CPU's time, and on the short-step MLP (issue 36's
one row under its target) the CPU's time is the step. This counts them on any device, in one process at world size 1 (as
`python -m fastddp.bench` runs it), on the MLP workload with 1 DataLoader worker (so the batches are made, and counted, elsewhere):
a `TorchDispatchMode` counts each operator below autograd, the backward's included, over 20 and over 40 steps; the difference / 20
is one step's, without the fit's start and end. Usage: `python tools/ops_per_step.py [--device cuda] [--workers N]`."""
import sys, argparse, collections, contextlib, torch
from torch.utils._python_dispatch import TorchDispatchMode
from fastai.basics import Callback, CancelFitException
import fastddp.distrib # `distrib_ctx`
from fastddp.bench import _one_rank, _samples, gpu_workloads, _gpu_learn, _hand
from fastddp.handloop import InMemory

class Count(TorchDispatchMode):
    "How many times each operator ran while the mode was on"
    def __init__(self): super().__init__(); self.c = collections.Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.c[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

class Counted(Callback):
    "Count the operators of `n` training steps, after 5, from one `before_batch` to the one `n` steps later"
    order = -100
    def __init__(self, n): self.n,self.i,self.m = n,0,None
    def before_batch(self):
        if not self.training: return
        self.i += 1
        if self.i==5: self.m = Count(); self.m.__enter__()
        if self.i==5+self.n: self.m.__exit__(None, None, None); raise CancelFitException()

def counts(side, w, dev, n):
    "The operators of `n` steps of `side` ('hand' or 'fastddp') on workload `w`"
    x,y = _samples(w)
    ds = InMemory(x, y, n=w['bs']*(n+50))
    if side=='hand':
        h = _hand(w, dev, ds)
        h.steps(5)
        with Count() as c: h.steps(n)
        return c.c
    learn = _gpu_learn(w, dev, ds, InMemory(x[:w['bs']], y[:w['bs']]))
    cb = Counted(n); learn.add_cb(cb)
    with learn.no_bar(), learn.distrib_ctx(): learn.fit(1)
    return cb.m.c

def per_step(side, w, dev):
    "{operator: count per step}, from the difference of 40 and 20 steps"
    a,b = counts(side, w, dev, 20),counts(side, w, dev, 40)
    return {k:(b[k]-a[k])/20 for k in set(a)|set(b) if b[k]!=a[k]}

if __name__=='__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default='cpu'); p.add_argument('--workers', type=int, default=1)
    a = p.parse_args()
    dev,own = _one_rank(a.device)
    w = dict(gpu_workloads[0], workers=a.workers)
    try:
        for side in ('hand', 'fastddp'):
            d = per_step(side, w, dev)
            print(f"{side}: {sum(d.values()):.1f} operators a step")
            print('   '+', '.join(f"{k} {v:g}" for k,v in sorted(d.items(), key=lambda o: (-o[1], o[0]))))
    finally:
        if own: torch.distributed.destroy_process_group()
