"""fastai's optimizer step against `fastddp.foreach`'s, per step, on this CPU or a GPU: SGD, SGD with momentum and Adam, short-step MLP.

Each repetition times `--steps` steps of each (interleaved: fastai, foreach, fastai, ...), one thread, the same gradients; the table
gives the median of the repetitions and the median of the paired ratios with their spread. On a GPU (`--device cuda`) a timed block
ends when the GPU has finished its steps (`torch.cuda.synchronize`): for this MLP's small tensors that is the CPU's cost of launching
the kernels, which a short GPU step pays at every step (issue 36's MLP row).
Usage: `python tools/bench_foreach.py --reps 7 --save nbs/bench_results/24_foreach.json` (`--device cuda`: `make test-gpu` runs it)"""
import os, sys, time, shlex, statistics, argparse
from functools import partial
from pathlib import Path
import torch

def with_grads(m, dev='cpu'):
    "`m` (the bench's short-step MLP) on `dev` with a gradient on every parameter"
    m = m.to(dev)
    m(torch.randn(32,64, device=dev)).pow(2).mean().backward()
    return m

def per_step(opt, steps):
    "Milliseconds per `opt.step()` over `steps` steps, until the GPU has done them (the gradients stay: only the step is timed)"
    from fastddp.bench import _sync
    _sync(); t0 = time.perf_counter()
    for _ in range(steps): opt.step()
    _sync()
    return (time.perf_counter()-t0)/steps*1e3

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=7); p.add_argument('--steps', type=int, default=300); p.add_argument('--save')
    p.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    a = p.parse_args()
    dev = a.device
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fastai.optimizer import SGD, Adam
    from fastddp.foreach import use_foreach
    from fastddp.bench import show_result, _model
    torch.set_num_threads(1)
    mks = {'SGD': partial(SGD, lr=1e-3, wd=0.01), 'SGD, momentum 0.9': partial(SGD, lr=1e-3, mom=0.9, wd=0.01),
           'Adam': partial(Adam, lr=1e-5, wd=0.01)}
    if dev=='cuda': del mks['Adam'] # on a GPU `use_foreach` keeps fastai's Adam: its foreach kernels differ in the last bits there
    load0,res = os.getloadavg(),{k:{'fastai':[], 'foreach':[]} for k in mks}
    for _ in range(a.reps):
        for k,mk in mks.items():
            for side in ('fastai', 'foreach'):
                opt = mk(with_grads(_model('mlp'), dev).parameters())
                if side=='foreach': assert use_foreach(opt)
                per_step(opt, 20) # warm-up: the state is made at the first step
                res[k][side].append(per_step(opt, a.steps))
    load1 = os.getloadavg()
    med = statistics.median
    rows = ["| optimizer | fastai's step, ms (median) | foreach step, ms (median) | fastai / foreach (median of pairs, spread) |",
            "|---|---|---|---|"]
    for k,r in res.items():
        q = [x/y for x,y in zip(r['fastai'], r['foreach'])]
        rows.append(f"| {k} | {med(r['fastai']):.3f} | {med(r['foreach']):.3f} | {med(q):.2f} ({min(q):.2f}-{max(q):.2f}) |")
    where = f"on {torch.cuda.get_device_name(0)}" if dev=='cuda' else 'on CPU, one thread'
    title = (f"fastai's optimizer step and fastddp.foreach's on the MLP 64-512-512-10 (6 tensors, 0.3 M parameters), {where}, "
             f"{a.steps} steps, {a.reps} interleaved repetitions; load average {load0[0]:.1f} before, {load1[0]:.1f} after")
    show_result(a.save, 'foreach', title, 'python tools/bench_foreach.py '+shlex.join(sys.argv[1:]), '\n'.join(rows),
                runs=res, load=[load0, load1])

if __name__=='__main__': main()
