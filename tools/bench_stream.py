"""Streamed (WebDataset tar shards on local disk) against map-style (the same items in memory), same model, 2 ranks.

Rank 0 first writes `--items` items (64 float32 features as raw bytes and a label) into `--shards` tar shards with `wds.TarWriter`;
the streamed loader reads them with `wds.WebDataset(nodesplitter=wds.split_by_node)`, the map-style one holds them in memory. Then
each of `--reps` repetitions trains one epoch map-style and one epoch streamed, alternating which goes first (A B, B A, ...),
in the same launch: global samples/s of each (the slowest rank's wall time of `fit`), their ratio (streamed / map-style),
TimeCost's data-wait share of a step for each, and the end-of-epoch agreement's cost per step (`StreamDL.agree_s`: starting the
all-reduce of the has-data flag and waiting for it), and the flag's all-reduce alone with the ranks in step (200 in a row). \
Median of the paired ratios with min-max spread; `uptime` recorded.
Usage: python tools/bench_stream.py [--items 20000] [--shards 16] [--bs 64] [--reps 5] [--workers 0] [--width 512] [--save FILE.json]"""
import json, os, shlex, sys, tempfile, time
import numpy as np
from fastcore.script import call_parse
from fastddp.testing import run_ranks

_run = '''
import sys, time
import torch.distributed as dist
from pathlib import Path
import webdataset as wds
from fastai.basics import *
from fastai.distributed import *
from fastddp.core import *; from fastddp.testing import report
from fastddp.timecost import TimeCost
from fastddp.stream import StreamDL
path,n,n_sh,bs,reps,nw,width = Path(sys.argv[1]),*map(int, sys.argv[2:8])
defaults.callbacks = [TrainEvalCallback, Recorder]
torch.manual_seed(0)
x = torch.randn(n, 64); y = (x[:,:10].argmax(1))
def write():
    path.mkdir(parents=True, exist_ok=True)
    per = -(-n//n_sh)
    for s in range(n_sh):
        with wds.TarWriter(str(path/f'shard-{s:03d}.tar')) as w:
            for i in range(s*per, min(n, (s+1)*per)):
                w.write({'__key__': f'{i:07d}', 'x.bin': x[i].numpy().tobytes(), 'cls.txt': str(int(y[i]))})
rank0_first(write)
files = sorted(map(str, path.glob('shard-*.tar')))
def item(d): return torch.from_numpy(np.frombuffer(d['x.bin'], dtype=np.float32).copy()), tensor(int(d['cls.txt']))
def dls(kind):
    if kind=='map': ds = list(zip(x, y)); tr = DataLoader(ds, bs=bs, shuffle=True, num_workers=nw)
    else: tr = DataLoader(wds.WebDataset(files, shardshuffle=False, nodesplitter=wds.split_by_node).map(item), bs=bs, n=n, num_workers=nw)
    return DataLoaders(tr, DataLoader(list(zip(x[:bs], y[:bs])), bs=bs), device='cpu')
def fit(kind):
    learn = Learner(dls(kind), nn.Sequential(nn.Linear(64,width), nn.ReLU(), nn.Linear(width,width), nn.ReLU(), nn.Linear(width,10)),
                    loss_func=CrossEntropyLossFlat())
    class Keep(Callback):
        def after_train(self): self.dl = self.learn.dl # the rank's training loader (StreamDL for the stream)
    with learn.distrib_ctx():
        distrib_barrier(); t0 = time.perf_counter()
        learn.fit(1, 1e-3, cbs=[tc:=TimeCost(skip=2, show=False), k:=Keep()])
        secs = time.perf_counter()-t0
        dl = k.dl
    st = tc.stats() if rank()==0 else None
    return dict(secs=secs, steps=getattr(dl, 'n_steps', None),
                agree_ms=1e3*dl.agree_s/max(dl.n_steps,1) if isinstance(dl, StreamDL) else None,
                data=st['share']['data'] if st else None, items=n)
fit('map'); fit('stream') # warm up: imports, first worker start, page cache
res = []
for r in range(reps): res.append({k:fit(k) for k in (('map','stream') if r%2==0 else ('stream','map'))})
# the flag's all-reduce alone, both ranks in step: what the agreement costs where nothing else makes a rank wait
from fastddp.core import flag_group
g,t = flag_group(),torch.ones(1, dtype=torch.long)
distrib_barrier(); t0 = time.perf_counter()
for _ in range(200): dist.all_reduce(t, op=dist.ReduceOp.MIN, group=g, async_op=True).wait()
report(res=res, flag_ms=1e3*(time.perf_counter()-t0)/200)
'''

@call_parse
def main(items:int=20000, # items of the epoch
         shards:int=16, # tar shards
         bs:int=64, # batch size per rank
         reps:int=5, # repetitions (map-style and streamed each)
         workers:int=0, # DataLoader workers per rank
         width:int=512, # hidden features of the MLP 64-width-width-10 (compute per item)
         save:str=None): # write the results to this JSON file
    "Streamed against map-style on 2 ranks: samples/s ratio, data-wait share, the agreement's cost per step"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        rs = run_ranks(_run, n=2, args=[f'{d}/data', items, shards, bs, reps, workers, width], env={'OMP_NUM_THREADS': '1'}, timeout=3000)
    reps_ = [[r['res'][i] for r in rs] for i in range(reps)]
    def sps(rep, k): return items/max(o[k]['secs'] for o in rep) # the epoch ends on the slowest rank
    ratio = [sps(o,'stream')/sps(o,'map') for o in reps_]
    agree = [np.median([o['stream']['agree_ms'] for o in rep]) for rep in reps_]
    data = {k:[rep[0][k]['data'] for rep in reps_] for k in ('map','stream')}
    med = lambda a: (float(np.median(a)), float(min(a)), float(max(a)))
    out = dict(ratio=med(ratio), sps_map=med([sps(o,'map') for o in reps_]), sps_stream=med([sps(o,'stream') for o in reps_]),
               data_map=med(data['map']), data_stream=med(data['stream']), agree_ms=med(agree), steps=reps_[0][0]['stream']['steps'],
               flag_ms=max(r['flag_ms'] for r in rs))
    fmt = lambda t, f='{:.2f}': f"{f.format(t[0])} ({f.format(t[1])}-{f.format(t[2])})"
    table = ("| | map-style | streamed (WebDataset) |\n|---|---|---|\n"
             f"| samples/s, 2 ranks | {fmt(out['sps_map'], '{:.0f}')} | {fmt(out['sps_stream'], '{:.0f}')} |\n"
             f"| data wait, share of a step (TimeCost, rank 0) | {fmt(out['data_map'], '{:.1%}')} | {fmt(out['data_stream'], '{:.1%}')} |\n"
             f"| end-of-epoch agreement: a rank's wait for the flag, ms per step (waiting for slower ranks included) | | "
             f"{fmt(out['agree_ms'], '{:.3f}')} |\n"
             f"| the flag's all-reduce alone, ranks in step (gloo), ms | | {out['flag_ms']:.3f} |\n\n"
             f"Streamed / map-style samples/s: **{fmt(out['ratio'])}** (median of {reps} paired ratios, min-max); "
             f"{out['steps']} steps per rank an epoch; "
             f"{items} items in {shards} shards, batch {bs} per rank, {workers} DataLoader workers per rank, "
             f"MLP 64-{width}-{width}-10, gloo, 1 thread a rank. "
             f"Load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (the machine is shared with other jobs).\n")
    print(table)
    if save:
        from fastddp.bench import machine
        res = dict(kind='stream', title='Streams: WebDataset shards against map-style, 2 ranks',
                   command=shlex.join(['python', 'tools/bench_stream.py', *sys.argv[1:]]),
                   machine=machine(), date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), table=table, raw=out, reps=reps_)
        from pathlib import Path
        Path(save).write_text(json.dumps(res, indent=1))
