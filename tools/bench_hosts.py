"""The communication opt-ins across two hosts joined by a shaped link, against the same job on one host.

Two network namespaces joined by a veth pair (`Hosts` from tests/hosts.py; root only) are the hosts, `tc` limits the link.
For each repetition, every (link, mode) run is a fresh pair of `fastddp-launch --nnodes 2` (one rank per host), the runs
interleaved; "one host" is the same two ranks under one launcher, over loopback. The ratio is each run's samples/s over
the one-host run of the same mode in the same repetition (median of the paired ratios, min-max); "wire" is the time the
link alone needs per synchronised step: a ring all-reduce sends 2(N-1)/N times the payload, once per sync, at the rate.
The result is saved after each repetition, with the machine's load average at each run.
Usage: python tools/bench_hosts.py [--rates 1gbit,100mbit] [--modes ddp,fp16,powersgd,acc4] [--reps 5] [--save FILE.json]"""
import os, sys, shlex, statistics, tempfile
from pathlib import Path
from fastcore.script import call_parse
from fastddp.testing import read_reports
sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'tests'))
from hosts import Hosts # test code, kept with the tests
from fastddp.bench import run_mode, save_result

def _bits(rate): # '100mbit' -> bits per second
    n,u = rate[:-4],rate[-4:]
    return float(n)*{'kbit':1e3, 'mbit':1e6, 'gbit':1e9}[u]

def across(hs, mode, kw):
    "Run `mode` with one rank on each host; rank 0's report"
    with tempfile.TemporaryDirectory() as d:
        fn = Path(d)/'run.py'
        fn.write_text(f"from fastddp.bench import bench_worker; bench_worker({mode+'@2'!r}, **{kw!r})")
        ps = hs.launch(fn, env={'FASTDDP_REPORT_DIR': d, 'OMP_NUM_THREADS': '1'})
        outs = [p.communicate(timeout=1800)[0] for p in ps]
        if any(p.returncode for p in ps): raise RuntimeError('\n'.join(o[-3000:] for o in outs))
        return read_reports(d, 2)[0]

def table(res, rates, modes):
    "The markdown table of `res[(link, mode)] = [samples/s per rep]` and `res['bytes'][mode]`"
    med = lambda a: statistics.median(a)
    head = "| mode | one host (samples/s) | "+" | ".join(f"{r}: samples/s | {r}: vs one host | {r}: wire per sync (ms)" for r in rates)+" |"
    ls = [head, "|"+"---|"*(2+3*len(rates))]
    for m in modes:
        one = res[('one', m)]
        cells = [f"{med(one):.1f}"]
        for r in rates:
            a = res[(r, m)]
            rt = sorted(x/y for x,y in zip(a, one))
            cells += [f"{med(a):.1f}", f"{med(rt):.2f} ({rt[0]:.2f}-{rt[-1]:.2f})", f"{1e3*res['bytes'][m]*8/_bits(r):.0f}"]
        ls.append(f"| {m} | "+" | ".join(cells)+" |")
    return '\n'.join(ls)

@call_parse
def main(rates:str='1gbit,100mbit', # link rates, as `tc` writes them
         modes:str='ddp,fp16,powersgd,acc4', # bench modes (`python -m fastddp.bench`)
         model:str='resnet18', # the workload
         steps:int=6, # timed steps per run
         warmup:int=2, # untimed steps first
         reps:int=5, # repetitions, interleaved
         save:str=None): # also write the result as JSON for `tools/bench_page.py`
    "Samples/s of each mode on one host and across two hosts at each link rate"
    rates,modes = rates.split(','),modes.split(',')
    kw = dict(arch=model, steps=steps, warmup=warmup)
    res = {(l,m):[] for l in ['one',*rates] for m in modes}
    res['bytes'] = {}
    loads = [] # the machine's 1-minute load average at each run: other work on a shared machine shows here
    def save_now(done):
        t = table(res, rates, modes)+(f"\n\nLoad average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f} "
                                      f"(median {statistics.median(loads):.1f}) on {os.cpu_count()} CPUs.")
        part = '' if done==reps else f" ({done} of {reps} repetitions done)"
        if save: save_result(save, 'hosts',
                             f"Across two hosts: {model}, {', '.join(modes)} over {', '.join(rates)} links vs one host{part}",
                             'python tools/bench_hosts.py '+shlex.join(sys.argv[1:]), t, loads=loads,
                             samples_per_s={f'{k[0]}/{k[1]}':v for k,v in res.items() if k!='bytes'}, bytes_per_sync=res['bytes'])
        return t
    with Hosts() as hs:
        for i in range(reps):
            for m in modes:
                loads.append(os.getloadavg()[0])
                o = run_mode(f'{m}@2', **kw)
                res[('one', m)].append(o['samples_per_s'])
                res['bytes'][m] = o['bytes_per_sync']
                for r in rates:
                    hs.shape(r)
                    loads.append(os.getloadavg()[0])
                    res[(r, m)].append(across(hs, m, kw)['samples_per_s'])
                    print(f"rep {i+1}/{reps} {m}: one host {res[('one', m)][-1]:.1f}, {r} {res[(r, m)][-1]:.1f} samples/s", flush=True)
            hs.shape(None)
            t = save_now(i+1) # after each repetition: a run cut short keeps the ones done
    print(t)
