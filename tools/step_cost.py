"""Where a short training step's time goes under `distrib_ctx`, per rank: each part of fastai's loop, each callback, DDP's prepared
model, the optimizer, the all-reduce, timed inside real runs of the MLP workload (`python -m fastddp.bench --model mlp`).

Each rank wraps the parts of its own `Learner` with `perf_counter` marks (this tool's own instrumentation: nothing in fastddp is
changed) and reports the mean per training step after a warm-up. Configurations: `default` (plain `distrib_ctx()`) and
`opt_ins` (`TimeCost`, `comm_stats`, `Throughput` on too), each on 1 process (fastai with fastddp loaded, no context) and 2 ranks.
Usage: `python tools/step_cost.py [--steps 600] [--reps 3] [--save nbs/bench_results/21_step_cost.json]`"""
import argparse, json, os, shlex, statistics, sys, time
from pathlib import Path

WORKER = r'''
import os, sys, time, json, torch, torch.distributed as dist
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastai.callback.progress import ProgressCallback
from fastddp.bench import _data, _model, _fastai_dls
from fastddp.testing import report
from fastddp.timecost import TimeCost
from fastddp.throughput import Throughput
torch.set_num_threads(1)
steps,warmup,cfg = int(sys.argv[1]),int(sys.argv[2]),sys.argv[3]
ws,bs = num_distrib() or 1,64
pc = time.perf_counter
acc,state = {},{'on': False}
def add(k, dt):
    if state['on']: acc[k] = acc.get(k, 0.)+dt
def timed(k, f):
    def _f(*a, **kw):
        t = pc()
        try: return f(*a, **kw)
        finally: add(k, pc()-t)
    return _f
class Clock(Callback):
    "Marks the step boundaries; installs the wrappers once the trainer has wrapped the model and the loaders"
    order = 1e9
    def before_fit(self): self.i,self.t = 0,None
    def before_train(self):
        l = self.learn
        dl = l.dl
        class It:
            def __init__(s): s.it = iter(dl)
            def __iter__(s): return s
            def __next__(s):
                t = pc()
                try: return next(s.it)
                finally: add('DataLoader: next batch (DistributedDL / TfmdDL)', pc()-t)
        class Wrap:
            def __len__(s): return len(dl)
            def __iter__(s): return It()
            def __getattr__(s, k): return getattr(dl, k)
        l.dl = Wrap()
        m = l.model
        inner = getattr(m, 'module', None)
        if not getattr(m, '_timed', False):
            if inner is not None:
                object.__setattr__(inner, 'forward', timed('model forward (the module itself)', inner.forward))
                m.forward = timed('DDP forward: wrapper + module', m.forward)
            else: m.forward = timed('model forward (the module itself)', m.forward)
            m._timed = True
            l.loss_func = timed('loss function', l.loss_func)
            l._backward = timed('backward (+ all-reduce under DDP)', l._backward)
            l._step = timed('optimizer step (fastai SGD, momentum)', l._step)
            l.opt.zero_grad = timed('zero_grad', l.opt.zero_grad)
            l._set_device = timed("Learner._set_device (the batch to the model's device)", l._set_device)
            for cb in l.cbs:
                if cb is self: continue
                for ev in ('before_batch','after_pred','after_loss','before_backward','after_backward','before_step','after_step',
                           'after_batch'):
                    f = cb.__dict__.get(ev) or getattr(type(cb), ev, None)
                    if f is None: continue
                    if ev not in cb.__dict__: f = getattr(cb, ev)
                    object.__setattr__(cb, ev, timed(f'callback {type(cb).__name__}', f))
            disp = l.__dict__.get('_call_one')
            l._call_one = timed('event dispatch (with the callbacks in it)', disp if disp is not None else l._call_one)
    def after_train(self): self.learn.dl = self.learn.dls.train
    def after_batch(self):
        if not self.training: return
        self.i += 1
        if self.i==warmup: self.t,state['on'] = pc(),True
        if self.i==warmup+steps: self.t1,state['on'] = pc(),False
x = _data(bs*(steps+warmup), 0, 'mlp')
dls = _fastai_dls(x, bs, ws, 'mlp')
cbs = [Clock()]+([TimeCost(skip=warmup, show=False), Throughput()] if cfg=='opt_ins' else [])
learn = Learner(dls, _model('mlp'), loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=0.01, cbs=cbs)
learn.remove_cb(ProgressCallback)
ctx = learn.distrib_ctx(comm_stats=cfg=='opt_ins') if ws>1 else learn.distrib_ctx()
with ctx: learn.fit(1)
res = {k:v/steps*1e3 for k,v in acc.items()}
res['total step'] = (learn.clock.t1-learn.clock.t)/steps*1e3
cb_in = sum(v for k,v in res.items() if k.startswith('callback '))
res['event dispatch (with the callbacks in it)'] -= cb_in
if 'DDP forward: wrapper + module' in res: res['DDP forward: wrapper + module'] -= res['model forward (the module itself)']
extra = {}
if ws>1: # the all-reduce of the gradients alone, and the backward alone (no_sync), after the fit on the same model
    g = torch.zeros(sum(p.numel() for p in learn.model.parameters()))
    for _ in range(20): dist.all_reduce(g)
    t = pc()
    for _ in range(200): dist.all_reduce(g)
    extra['all_reduce of the gradients alone (1 bucket)'] = (pc()-t)/200*1e3
report(ms=res, extra=extra, cbs=[type(o).__name__ for o in learn.cbs])
'''

ORDER = ['DataLoader: next batch (DistributedDL / TfmdDL)', "Learner._set_device (the batch to the model's device)",
         'event dispatch (with the callbacks in it)',
         'model forward (the module itself)', 'DDP forward: wrapper + module', 'loss function', 'backward (+ all-reduce under DDP)',
         'optimizer step (fastai SGD, momentum)', 'zero_grad',
         'callback TrainEvalCallback', 'callback Recorder', 'callback CastToTensor', 'callback DistributedTrainer', 'callback Heartbeat',
         'callback TimeCost', 'callback TimeEnd', 'callback Throughput']
NAMES = {'DDP forward: wrapper + module': 'DDP wrapper around the forward (Accelerate-prepared `DistributedDataParallel`)'}

def run(n, cfg, steps, warmup):
    "One run's report on each rank"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastddp.testing import run_ranks
    return run_ranks(WORKER, n=n, args=[steps, warmup, cfg], launcher='fastddp' if n>1 else 'python', env={'OMP_NUM_THREADS': '1'},
                     timeout=900)

def table(res):
    "Markdown: ms per training step of each part, median over the repetitions, for each configuration and rank"
    cols = list(res)
    seen = [k for c in cols for o in res[c] for k in o['ms'] if k!='total step']
    keys = list(dict.fromkeys([k for k in ORDER if k in seen]+seen)) # the known parts in the loop's order, then any other
    med = lambda c,k,f='ms': statistics.median(o[f].get(k, 0.) for o in res[c])
    ls = ["| ms per training step | "+" | ".join(cols)+" |", "|---|"+"---|"*len(cols)]
    for k in keys:
        ls.append(f"| {NAMES.get(k, k)} | "+" | ".join(f"{med(c, k):.3f}" if any(k in o['ms'] for o in res[c]) else '' for c in cols)+" |")
    ls.append("| the rest of fastai's loop (`one_batch`, `_with_events`, the learner's event calls), unattributed | "+" | ".join(
        f"{statistics.median(o['ms']['total step']-sum(v for k,v in o['ms'].items() if k!='total step') for o in res[c]):.3f}"
        for c in cols)+" |")
    ls.append("| **total step (instrumented)** | "+" | ".join(f"**{med(c, 'total step'):.3f}**" for c in cols)+" |")
    ex = [k for c in cols for o in res[c][:1] for k in o['extra']]
    for k in dict.fromkeys(ex):
        ls.append(f"| {k} | "+" | ".join(f"{med(c, k, 'extra'):.3f}" if res[c][0]['extra'] else '' for c in cols)+" |")
    return '\n'.join(ls)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--steps', type=int, default=600); p.add_argument('--warmup', type=int, default=50)
    p.add_argument('--reps', type=int, default=3); p.add_argument('--save')
    a = p.parse_args()
    load0 = os.getloadavg()
    res = {}
    for _ in range(a.reps): # interleaved: each configuration once per repetition
        for n in (1, 2):
            for cfg in ('default', 'opt_ins'):
                for rk,o in enumerate(run(n, cfg, a.steps, a.warmup)):
                    if n==1 and rk: continue
                    res.setdefault(f"{cfg}, {'1 process' if n==1 else '2 ranks'}, rank {rk}", []).append(o)
    load1 = os.getloadavg()
    title = (f"per-step cost by component, MLP 64-512-512-10, global batch 64, {a.steps} timed steps after {a.warmup}, "
             "1 thread per process, "
             f"median of {a.reps} interleaved repetitions; load average {load0[0]:.1f} before, {load1[0]:.1f} after (a shared machine)")
    t = table(res)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastddp.bench import show_result
    show_result(a.save, 'step_cost', title, 'python tools/step_cost.py '+shlex.join(sys.argv[1:]), t,
                runs=res, load=[load0, load1])

if __name__=='__main__': main()
