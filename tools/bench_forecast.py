"""The forecast (`fastddp.forecast`) against real runs: each run measures itself with `TimeCost` and forecasts the others.

Runs, per workload, one process each (1 thread, as the launcher gives a rank; the batch per rank fixed: weak scaling; in-memory
data loaded by the rank itself, num_workers=0 in every run: workers would contend for the 2 cores the ranks fill), all in
`distrib_ctx` as the scripts train:
  links     - per repetition, first: each `--rates` link between two hosts as a user measures it, `fastddp-doctor --bench --json`
              started by the launcher on both hosts (`fastddp.allreduce.bench_launched`)
  1 rank    - `python`, measured; forecasts 2 ranks on this host (over the link the forecast measures by default: the doctor's
              all-reduce sweep and DDP's all-reduce of the run's gradients after each step's work, `probe_rank`, in one launch of
              two ranks) and 1 rank on each of 2 hosts over every link, measured and nominal (and with `--whatifs`,
              accumulation 4 and fp16 compression over the slowest, measured)
  2 ranks   - `fastddp-launch --nproc 2`, measured; forecasts 1 rank, and 1 rank on each of 2 hosts over every `--rates` link as
              measured
  2 hosts   - one rank in each of two network namespaces joined by a veth pair that `tc` shapes to each rate (`tests/hosts.py`,
              root only; the token bucket 250 us of the link), measured; with `--whatifs`, also with accumulation 4 and fp16
              compression over the slowest link (fewer steps there: seconds each)
  a wire    - with `--delay MS`: one rank in each of two namespaces joined by a wire that long (`tools/delay_wire.py`: the kernel
              here has no netem), measured with fewer steps; forecast over the doctor's measure of it, and with its bandwidth and
              the delay as the latency of a ring hop (the latency term, from the wire's known length)
Nothing is fitted to these runs: the model's inputs are the 1-rank (or 2-rank) run's own timings and the links, measured by the
doctor's benchmark and `probe_rank`, or named. Each (forecast, measured) pair is the median over `--reps` interleaved
repetitions; the error is forecast / measured - 1 on samples/s. The load average is recorded at every run: on a shared
machine, regenerate on a quiet one.
Usage: python tools/bench_forecast.py [--workloads resnet18,mlp,tabular] [--rates 1gbit,100mbit] [--reps 3] [--save FILE.json]"""
import os, sys, json, shlex, shutil, statistics, tempfile, contextlib
from pathlib import Path
from fastcore.script import call_parse
from fastddp.testing import run_ranks, read_reports
sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'tests'))
from hosts import Hosts # test code, kept with the tests
from delay_wire import WireHosts
from fastddp.bench import save_result
from fastddp.forecast import parse_link, tcp_share, bench_link
from fastddp.bench import _model

# one run: the workload as `fastddp.bench` builds it, `TimeCost` on, then the forecasts asked for (rank 0 reports)
WORKER = '''
import sys, json, torch
import fastddp
from fastai.basics import *
from fastai.distributed import *
from fastai.callback.progress import ProgressCallback
from fastddp.core import *
from fastddp.train import Accumulate
from fastddp.testing import report
from fastddp.bench import _data, _model
from torch.utils.data import TensorDataset
a = json.loads(sys.argv[1])
torch.set_num_threads(1)
ws,bs = world_size(),a['bs']
d = _data(bs*ws*a['accum']*(a['steps']+a['warmup']), a['size'], a['arch'])
# in-memory tensors, loaded by the rank itself in every run: workers would contend for the 2 cores that the ranks already fill
dls = DataLoaders(DataLoader(TensorDataset(*d), bs=bs, shuffle=True, num_workers=0),
                  DataLoader(TensorDataset(*[o[:bs] for o in d]), bs=bs, num_workers=0), device='cpu')
learn = Learner(dls, _model(a['arch']), loss_func=CrossEntropyLossFlat(), opt_func=partial(SGD, mom=0.9), lr=0.01,
                cbs=[Accumulate(a['accum'])] if a['accum']>1 else [])
learn.remove_cb(ProgressCallback)
learn.add_time_cost(skip=a['warmup']*a['accum'], show=False)
with learn.distrib_ctx(comm_hook=a['hook']): learn.fit(1) # one process too, as the scripts do
tc = learn.time_cost
if is_rank0():
    fs = {k:tc.forecast(*t, link=lk, **w) for k,(t,lk,w) in a['forecasts'].items()}
    report(samples_s=tc.stats()['samples_per_s'], forecasts=fs, bytes=tc.ranks[0]['comm'])
'''

def _args(arch, size, bs, steps, warmup, accum=1, hook=None, forecasts=None):
    return json.dumps(dict(arch=arch, size=size, bs=bs, steps=steps, warmup=warmup, accum=accum, hook=hook, forecasts=forecasts or {}))

def on_one_host(script, n, args):
    "Rank 0's report of `n` ranks on this host (`python` for one)"
    return run_ranks(str(script), n=n, launcher='fastddp' if n>1 else 'python', args=[args], env={'OMP_NUM_THREADS': '1'},
                     timeout=1800)[0]

def across(hs, script, args):
    "Rank 0's report with one rank on each host"
    with tempfile.TemporaryDirectory() as d:
        ps = hs.launch(script, [args], env={'FASTDDP_REPORT_DIR': d, 'OMP_NUM_THREADS': '1'})
        outs = [p.communicate(timeout=1800)[0] for p in ps]
        if any(p.returncode for p in ps): raise RuntimeError('\n'.join(o[-3000:] for o in outs))
        return read_reports(d, 2)[0]

# arch, px, batch per rank, steps, warm-up steps; steps over the slowest link (capped: a resnet18 step takes seconds at 100 Mbit/s)
_work = dict(resnet18=('resnet18', 64, 16, 12, 2, 6), mlp=('mlp', None, 32, 400, 20, 200), tabular=('tabular', None, 64, 600, 20, 300))

def burst(rate):
    "tc's token bucket for `rate`: 250 us of the link, at least 8 KiB"
    # a smaller one starves tbf at 1 Gbit/s on 2 cores; a larger one sends the first part of each all-reduce at once (a wire has no credit)
    bits = parse_link(rate)['bw']/tcp_share*8
    return f"{max(8, round(bits/8*250e-6/1024))}kb"

def link_across(hs):
    "The link between the two hosts as `fastddp-doctor --bench --json` measures it, started by the launcher on both (rank 0's result)"
    doc = shutil.which('fastddp-doctor', path=str(Path(sys.executable).parent)) or shutil.which('fastddp-doctor')
    ps = hs.launch(doc, ['--bench', '--json', '--max-size', '4M'])
    outs = [p.communicate(timeout=1800)[0] for p in ps]
    o = outs[0]
    if '{' not in o: raise RuntimeError('\n'.join(o[-3000:] for o in outs))
    return json.JSONDecoder().raw_decode(o[o.index('{'):])[0]['bench'] # its exit code says whether a check failed: not ours

def table(rows):
    "The markdown table of `rows`: one a (workload, from, to, link) pair, forecast and measured as lists over repetitions"
    med = statistics.median
    ls = ["| workload | forecast from | to | link in the forecast | forecast (samples/s) | measured (samples/s) | error | gain forecast "
          "| gain measured |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f,m = med(r['forecast']),med(r['measured'])
        g = f"{med(r['gain_f']):.2f} | {med(r['gain_m']):.2f}" if r['gain_f'] else " | "
        ls.append(f"| {r['workload']} | {r['src']} | {r['dst']} | {r['link']} | {f:.1f} | {m:.1f} | {f/m-1:+.1%} | {g} |")
    for nm,ok in (("measured links (by the forecast here, by the doctor's benchmark across the hosts)",
                   lambda r: 'nominal' not in r['link']),
                  ('nominal rates', lambda r: 'nominal' in r['link'])):
        errs = sorted(abs(med(r['forecast'])/med(r['measured'])-1) for r in rows if ok(r))
        if errs: ls.append(f"\nAbsolute error with {nm}: median {med(errs):.1%}, worst {errs[-1]:.1%} over {len(errs)} pairs.")
    return '\n'.join(ls)

@call_parse
def main(workloads:str='resnet18,mlp,tabular', # `fastddp.bench` workloads
         rates:str='1gbit,100mbit', # links between the two hosts, as `tc` writes them ('' for no runs across hosts)
         whatifs:bool=True, # also accumulation 4 and fp16 over the slowest link, forecast from one rank
         reps:int=3, # repetitions, interleaved
         delay:float=0, # ms: also two hosts joined by a wire that long (`tools/delay_wire.py`), for the latency term; 0: none
         save:str=None): # write the result as JSON for `tools/bench_page.py`
    "Forecast samples/s against measured samples/s, from 1 rank to 2 and from 2 ranks to 1, on one host and across two"
    rates = [o for o in rates.split(',') if o]
    slow = rates[-1] if rates else None
    res,loads = {},[]
    def add(key, f, m, gf=None, gm=None):
        r = res.setdefault(key, dict(workload=key[0], src=key[1], dst=key[2], link=key[3], forecast=[], measured=[], gain_f=[], gain_m=[]))
        r['forecast'].append(f); r['measured'].append(m)
        if gf is not None: r['gain_f'].append(gf); r['gain_m'].append(gm)
    def save_now(done):
        ls = [f"{r} (tbf burst {burst(r)}): {lks[r]['rows'][-1]['busbw_GBps']*8e3:.0f} Mbit/s measured" for r in lks]
        if wl: ls.append(f"a {delay:g} ms wire (`tools/delay_wire.py`): {wl['rows'][-1]['busbw_GBps']*8e3:.0f} Mbit/s measured, "
                         f"{bench_link(wl)['lat']*1e3:.2f} ms a hop")
        t = table(list(res.values()))+(f"\n\nLoad average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f} "
                                       f"(median {statistics.median(loads):.1f}) on {os.cpu_count()} CPUs. Links between the hosts: "
                                       +', '.join(ls))
        part = '' if done==reps else f" ({done} of {reps} repetitions done)"
        if save: save_result(save, 'forecast', f"Forecast against measured samples/s: {', '.join(ws)}, 1 thread a rank, "
                             f"batch per rank fixed{f', a {delay:g} ms wire' if delay else ''}{part}",
                             'python tools/bench_forecast.py '+shlex.join(sys.argv[1:]), t, loads=loads,
                             runs=list(res.values()), links=lks)
        return t
    ws,lks,wl = workloads.split(','),{},None
    here = "measured by the forecast here (its default)"
    with tempfile.TemporaryDirectory() as d, Hosts() as hs, contextlib.ExitStack() as es:
        wh = es.enter_context(WireHosts(delay)) if delay else None
        script = Path(d)/'run.py'
        script.write_text(WORKER)
        for i in range(reps):
            for r in rates: # the links as a user measures them before a run: the doctor's benchmark across the two hosts
                hs.shape(r, burst(r)); lks[r] = link_across(hs)
            hs.shape(None)
            if wh: wl = link_across(wh)
            for w in ws:
                arch,size,bs,steps,warmup,few = _work[w]
                kw = dict(arch=arch, size=size, bs=bs, steps=steps, warmup=warmup)
                measured = {r+'@': ((1, 2), lks[r], {}) for r in rates} # 1 rank on each of 2 hosts, over each link as measured
                fc = {'2': ((2, 1), None, {}), **{r: ((1, 2), r, {}) for r in rates}, **measured}
                if whatifs and slow:
                    for k,o in (('acc4', dict(accum=4)), ('fp16', dict(comm_hook='fp16'))): fc[k] = ((1, 2), lks[slow], o)
                if wh: # over the wire as measured, and with its delay as the latency of a hop (the bandwidth measured)
                    nb = 4*sum(p.numel() for p in _model(arch).parameters())
                    fc.update({'wire@': ((1, 2), wl, {}), 'wire': ((1, 2), bench_link(wl, nb)['bw'], dict(latency=delay/1e3))})
                loads.append(os.getloadavg()[0]); one = on_one_host(script, 1, _args(**kw, forecasts=fc))
                fc2 = {'1': ((1, 1), None, {}), **measured} # and from two ranks on one host to two hosts
                loads.append(os.getloadavg()[0]); two = on_one_host(script, 2, _args(**kw, forecasts=fc2))
                f1,f2 = one['forecasts'],two['forecasts']
                add((w, '1 rank', '2 ranks, one host', here), f1['2']['samples_s'], two['samples_s'])
                add((w, '2 ranks', '1 rank', '-'), f2['1']['samples_s'], one['samples_s'])
                for r in rates:
                    hs.shape(r, burst(r))
                    kr = {**kw, 'steps': few} if r==slow else kw
                    loads.append(os.getloadavg()[0]); m = across(hs, script, _args(**kr))
                    for src,f in (('1 rank', f1), ('2 ranks', f2)):
                        add((w, src, f'2 hosts × 1 rank, {r}', "doctor's benchmark across the hosts"), f[r+'@']['samples_s'],
                            m['samples_s'])
                    add((w, '1 rank', f'2 hosts × 1 rank, {r}', f"{r}, nominal"), f1[r]['samples_s'], m['samples_s'])
                    if r==slow and whatifs:
                        for k,o in (('acc4', dict(accum=4)), ('fp16', dict(hook='fp16'))):
                            loads.append(os.getloadavg()[0]); mk = across(hs, script, _args(**{**kr, **o}))
                            add((w, '1 rank', f"2 hosts × 1 rank, {r}, {'Accumulate(4)' if k=='acc4' else 'fp16'}",
                                 "doctor's benchmark across the hosts"),
                                f1[k]['samples_s'], mk['samples_s'], f1[k]['samples_s']/f1[r+'@']['samples_s'],
                                mk['samples_s']/m['samples_s'])
                hs.shape(None)
                if wh:
                    loads.append(os.getloadavg()[0]); m = across(wh, script, _args(**{**kw, 'steps': few}))
                    dst = f'2 hosts × 1 rank, {delay:g} ms wire'
                    add((w, '1 rank', dst, "doctor's benchmark across the hosts"), f1['wire@']['samples_s'], m['samples_s'])
                    add((w, '1 rank', dst, f"the doctor's bandwidth, {delay:g} ms a hop, nominal"), f1['wire']['samples_s'], m['samples_s'])
                print(f"rep {i+1}/{reps} {w}: done", flush=True)
            t = save_now(i+1) # after each repetition: a run cut short keeps the ones done
    print(t)
