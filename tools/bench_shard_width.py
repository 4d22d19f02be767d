"""The widest tabular MLP that trains at 2 ranks within a per-rank memory budget, DDP against sharded.

For each width (hidden features of a 4-layer MLP on Adult-shaped inputs), 2 gloo ranks train 3 Adam steps under
`distrib_ctx()` and under `distrib_ctx(shard=True)`; each rank measures what it holds after a step (parameters +
gradients + optimizer state, from the live tensors: `fastddp.memory.rank_memory`). A width fits the budget when the
largest rank's total is within it. Memory is deterministic here: one repetition of each is the measurement.
Usage: python tools/bench_shard_width.py [--budget-mib 64] [--widths 256,512,1024,1536,2048,3072] [--save FILE.json]"""
import shlex, sys
from fastcore.script import call_parse
from fastddp.testing import run_ranks

_run = '''
import sys
from fastai.basics import *
from fastai.distributed import *
from fastddp.testing import report
from fastddp.memory import rank_memory
w,shard = int(sys.argv[1]),sys.argv[2]=='shard'
x = torch.randn(48,14); ds = list(zip(x, x[:,:1]))
class Mem(Callback):
    def after_step(self): self.st = rank_memory(self.learn)
m = nn.Sequential(nn.Linear(14,w), nn.ReLU(), nn.Linear(w,w), nn.ReLU(), nn.Linear(w,w), nn.ReLU(), nn.Linear(w,1))
l = Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:8], bs=8), device='cpu'), m, loss_func=MSELossFlat(), opt_func=Adam)
with l.distrib_ctx(**(dict(shard=True, shard_min=w*w) if shard else {})): l.fit(1, 1e-3, cbs=(mm:=Mem()))
report(mem=mm.st, n=sum(p.numel() for p in l.model.parameters()))
'''

def total(m): return m['params']+m['grads']+m['opt']

@call_parse
def main(budget_mib:float=64, # per-rank budget for parameters + gradients + optimizer state
         widths:str='256,512,1024,1536,2048,3072', # hidden widths to try
         save:str=None): # write the result as JSON for tools/bench_page.py
    "Per width: the largest rank's MiB under DDP and sharded; the widest that fits the budget each way"
    res = {}
    for w in map(int, widths.split(',')):
        rs = {k: run_ranks(_run, n=2, args=[w, k], env={'OMP_NUM_THREADS': '1'}) for k in ('ddp', 'shard')}
        res[w] = dict(params=rs['ddp'][0]['n'], **{k: max(total(o['mem']) for o in v) for k,v in rs.items()})
    fits = {k: max([w for w,o in res.items() if o[k]<=budget_mib], default=None) for k in ('ddp', 'shard')}
    ls = [f"| width | parameters | DDP: MiB per rank | sharded: MiB per rank | sharded / DDP |", "|---|---|---|---|---|"]
    ls += [f"| {w} | {o['params']:,} | {o['ddp']:.1f} | {o['shard']:.1f} | {o['shard']/o['ddp']:.2f} |" for w,o in res.items()]
    ls += ["", f"Widest within {budget_mib:g} MiB per rank: DDP {fits['ddp']}, sharded {fits['shard']}"
           + (f" ({res[fits['shard']]['params']/res[fits['ddp']]['params']:.2f}x the parameters)" if fits['ddp'] and fits['shard'] else '')]
    t = '\n'.join(ls)
    title = (f"the widest 4-layer MLP whose parameters, gradients and Adam state fit {budget_mib:g} MiB per rank at 2 gloo ranks, "
             "DDP vs sharded")
    print(title); print(t)
    if save:
        from fastddp.bench import save_result
        save_result(save, 'shard_width', title, 'python tools/bench_shard_width.py '+shlex.join(sys.argv[1:]), t, widths=res, fits=fits)
