"""Where the short-step MLP's time goes (issue 36's MLP row, the one row under its target): by worker count, and per function.

On a GPU the MLP's step is the CPU's work: launching a few kernels, fastai's loop, and taking the next batch from the loader. This
measures, in one process at world size 1 (as `python -m fastddp.bench --device cuda` runs it):
1. fastddp's default path against the hand-written loop (`fastddp.handloop`) in paired blocks (`fastddp.bench.gpu_pair`), with the
   DataLoader workers left to fastddp (None: its rule, `n_workers()`) and at fixed counts on both sides;
2. the time each callback of fastddp's fit takes at each event, per training step (no profiler running);
3. cProfile of the main process over the same number of steps of each (fastddp's fit; the hand-written loop), the functions that
   took the most time themselves.
Usage: `python tools/profile_mlp.py --device cuda --save /tmp/profile_mlp.txt` (`make test-gpu` runs it; `--device cpu`: a check)."""
import sys, io, time, statistics, argparse, cProfile, pstats
import torch

def workload(device):
    from fastddp.bench import gpu_workloads, cpu_workloads
    return (gpu_workloads if device=='cuda' else cpu_workloads)[0]

def by_workers(dev, device, counts, steps, blocks):
    "Table rows: ms per step of each side and their paired ratio, for each worker count (None: fastddp's rule, 8 at most by hand)"
    from fastddp.bench import gpu_pair
    from fastddp.core import n_workers
    w,rows = workload(device),[]
    for k in counts:
        r = gpu_pair(dict(w, workers=k) if k is not None else {k_:v for k_,v in w.items() if k_!='workers'}, dev, steps, blocks)
        a,b = r['fastddp_s'],r['hand_s']
        rs = [y/x for x,y in zip(a, b)]
        rows.append(f"| {f'default ({n_workers()} fastddp, {min(8, n_workers())} hand-written)' if k is None else k} | "
                    f"{statistics.median(b)/steps*1e3:.3f} | {statistics.median(a)/steps*1e3:.3f} | "
                    f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f}) |")
    return ["| DataLoader workers | hand-written ms/step | fastddp ms/step | fastddp / hand-written, speed (median, range) |",
            "|---|---|---|---|", *rows]

def _top(pr, n):
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats('tottime').print_stats(n)
    return s.getvalue()

def callback_times(dev, device, steps, warmup=50, n=12):
    "Table rows: µs per training step that each callback of fastddp's fit spends at each event, the `n` costliest"
    from collections import Counter
    from fastai.callback.core import Callback
    ts,call = Counter(),Callback.__call__
    def timed(self, event_name):
        t = time.perf_counter()
        try: return call(self, event_name)
        finally: ts[(type(self).__name__, event_name)] += time.perf_counter()-t
    Callback.__call__ = timed # this tool's process only: each callback's events timed
    try: profiles(dev, device, steps, warmup, prof=False)
    finally: Callback.__call__ = call
    ts = {k:v for k,v in ts.items() if k[0]!='Prof'} # the harness's own
    k = warmup+steps # the training steps the fit ran (it stops there, before validating)
    rows = [f"| {c} | {e} | {v/k*1e6:.1f} |" for (c,e),v in sorted(ts.items(), key=lambda kv: -kv[1])[:n]]
    return [f"| callback | event | µs per training step (all {k} of the fit) |", "|---|---|---|", *rows]

def profiles(dev, device, steps, warmup=50, n=30, prof=True):
    "cProfile of fastddp's fit and of the hand-written loop over `steps` training steps each, after `warmup` (`prof=False`: none)"
    from fastai.basics import Callback, CancelFitException
    from fastai.distributed import DistributedTrainer # `distrib_ctx`
    from fastddp.bench import _gpu_learn, _hand, _data, _sync
    from fastddp.handloop import InMemory
    w = workload(device)
    x,y = _data(2*w['bs'], w['size'], 'mlp')
    ds = InMemory(x, y, n=w['bs']*(warmup+steps+10))
    pr = cProfile.Profile()
    class Prof(Callback):
        order = 1e9
        def before_fit(self): self.i = 0
        def after_batch(self):
            if not self.training: return
            self.i += 1
            if self.i==warmup:
                _sync(); self.t0 = time.perf_counter()
                if prof: pr.enable()
            if self.i==warmup+steps:
                _sync(); pr.disable(); self.ms = (time.perf_counter()-self.t0)/steps*1e3
                raise CancelFitException()
    learn,cb = _gpu_learn(w, dev, ds, InMemory(x[:w['bs']], y[:w['bs']])),Prof()
    learn.add_cb(cb)
    with learn.distrib_ctx(): learn.fit(1)
    if not prof: return []
    out = [f"fastddp's fit, {steps} steps: {cb.ms:.3f} ms/step under cProfile", _top(pr, n)]
    hand = _hand(w, dev, ds)
    hand.steps(warmup); _sync()
    pr = cProfile.Profile()
    t0 = time.perf_counter(); pr.enable(); hand.steps(steps); _sync(); pr.disable()
    out += [f"the hand-written loop, {steps} steps: {(time.perf_counter()-t0)/steps*1e3:.3f} ms/step under cProfile", _top(pr, n)]
    return out

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    p.add_argument('--steps', type=int, default=200); p.add_argument('--blocks', type=int, default=3)
    p.add_argument('--workers', default='none,0,2,8', help="counts to pair, 'none': fastddp's rule")
    p.add_argument('--save')
    a = p.parse_args()
    from fastddp.bench import _one_rank
    dev,_ = _one_rank(a.device)
    counts = [None if o=='none' else int(o) for o in a.workers.split(',')]
    if a.device=='cpu': counts = [o for o in counts if o in (None, 0)] # the CPU workload makes its batches in the main process
    card = torch.cuda.get_device_name(0) if a.device=='cuda' else 'CPU'
    ls = [f"MLP step, {card}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"python tools/profile_mlp.py {' '.join(sys.argv[1:])}", '', *by_workers(dev, a.device, counts, a.steps, a.blocks), '',
          *callback_times(dev, a.device, a.steps), '', *profiles(dev, a.device, a.steps)]
    txt = '\n'.join(ls)
    print(txt)
    if a.save: open(a.save, 'w').write(txt+'\n')

if __name__=='__main__': main()
