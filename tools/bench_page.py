"""Write the benchmarks page `nbs/benchmarks.ipynb` (its headline ratios first) and the step-cost table of the time-cost tutorial,
from the JSON results in `nbs/bench_results/`. The README is a front page: it links to this page and holds no figures.

Every table on the page comes from a result file that a benchmark command wrote with `--save` (`python -m fastddp.bench`,
`tools/bench_scripts.py`, `tools/bench_accuracy.py`), in file-name order, with its command, machine and date. Nothing on
the page is edited by hand: run the commands, then this script.
Usage: `python tools/bench_page.py [RESULTS_DIR] [PAGE]`"""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS,PAGE = ROOT/'nbs'/'bench_results',ROOT/'nbs'/'benchmarks.ipynb'
# a tutorial's code cell does not run when the docs are built (nbdev runs only notebooks that export), so its table is written here
TUTORIAL,STEP_COST = ROOT/'nbs'/'tutorials'/'03_time_cost.ipynb','21_step_cost.json'
START,END = '<!-- bench:start -->','<!-- bench:end -->'
D = 'nbs/bench_results'
# The commands that make the page, in its order; the first one's ratios are the page's headline table
COMMANDS = [
    f"python -m fastddp.bench --modes single,raw,ddp,nosync --world-sizes 1,2 --steps 25 --reps 6 --no-time-cost --no-hooks --png '' "
    f"--save {D}/01_resnet18.json",
    f"python tools/soak.py --n 100 --save {D}/10_soak_user.json",
    f"python tools/soak.py --n 50 --launcher fastddp --script scripts/tabular_ddp.py --args '--synthetic 2000 --epochs 2' "
    f"--save {D}/11_soak_scripts.json",
    f"python tools/bench_hosts.py --rates 1gbit,100mbit --modes ddp,fp16,powersgd,acc4 --reps 5 --save {D}/12_hosts.json",
    f"python -m fastddp.bench --model tabular --modes ddp,nowatchdog --world-sizes 2 --reps 5 --no-time-cost --save {D}/13_watchdog.json",
    f"python -m fastddp.bench --model tabular --steps 600 --modes ddp,tuned,t_one_bucket_view,t_one_bucket_static,t_one_bucket_view_static,"
    "t_25MiB,t_25MiB_view,t_25MiB_static,t_25MiB_view_static,t_5MiB,t_5MiB_view,t_5MiB_static,t_5MiB_view_static "
    f"--world-sizes 2 --reps 5 --no-time-cost --png '' --save {D}/14_tune.json",
    f"python -m fastddp.bench --modes ddp,shard,shard_grads --world-sizes 2 --reps 5 --no-time-cost --png '' --save {D}/15_shard.json",
    f"python -m fastddp.bench --model awd_lstm --steps 6 --warmup 2 --modes ddp,shard,shard_grads --world-sizes 2 --reps 5 --no-time-cost "
    f"--png '' --save {D}/16_shard_awd_lstm.json",
    f"python tools/bench_shard_width.py --budget-mib 64 --save {D}/17_shard_width.json",
    f"python -m fastddp.bench --model mlp --steps 1000 --warmup 50 --modes raw,fastai,single,ddp,nosync --world-sizes 1,2 --reps 5 "
    f"--no-time-cost --no-hooks --png '' --save {D}/18_short_steps.json",
    f"python tools/bench_workers.py --reps 5 --counts 0,1,2 --save {D}/19_pets_workers.json",
    f"python tools/step_cost.py --steps 300 --warmup 50 --reps 3 --save {D}/21_step_cost.json",
    f"python tools/short_steps.py --blocks 12 --steps 200 --save {D}/22_short_steps_paired.json",
    f"python tools/bench_stream.py --items 8000 --reps 5 --width 1024 --save {D}/21_stream.json",
    f"python -m fastddp.bench --model mlp --steps 1000 --warmup 50 --modes ddp,nopreempt,preempt1 --world-sizes 2 --reps 5 --no-time-cost "
    f"--no-hooks --png '' --save {D}/22_preempt.json",
    f"python tools/bench_preempt.py --reps 3 --save {D}/23_preempt_time.json",
    f"python -m fastddp.bench --model resnet18 --size 32 --bs 32 --steps 6 --warmup 3 --modes ddp,compiled --world-sizes 2 --reps 5 "
    f"--no-time-cost --png '' --save {D}/23_compile.json",
    f"python -m fastddp.bench --model tabular --steps 100 --warmup 5 --modes ddp,compiled --world-sizes 2 --reps 5 --no-time-cost "
    f"--png '' --save {D}/23b_compile_tabular.json",
    f"python tools/bench_foreach.py --reps 7 --save {D}/24_foreach.json",
    f"python tools/bench_foreach.py --device cuda --save {D}/24b_foreach_h200.json", # on an H200 (`make test-gpu`)
    f"python tools/bench_forecast.py --workloads resnet18,mlp,tabular --rates 1gbit,100mbit --reps 3 --save {D}/25_forecast.json",
    f"python tools/bench_forecast.py --workloads resnet18,mlp,tabular --rates '' --delay 2 --reps 3 --save {D}/25b_forecast_wire.json",
    # on a GPU only (a CPU machine cannot regenerate these); `make test-gpu` runs the default path on all three workloads
    f"python -m fastddp.bench --device cuda --model resnet18,resnet50 --save {D}/30_gpu_bench.json",
    f"python -m fastddp.bench --device cuda --no-prefetch --save {D}/30b_gpu_bench_no_prefetch.json",
    f"python -m fastddp.bench --device cuda --model mlp --compile reduce-overhead --no-prefetch --save {D}/30c_gpu_bench_mlp_graphs.json",
    f"python -m fastddp.bench --device cuda --save {D}/30d_gpu_bench_h200.json", # on an H200, prefetch on (before it was exact)
    f"python -m fastddp.bench --device cuda --save {D}/30e_gpu_bench_h200_foreach.json", # on an H200: exact prefetch, foreach SGD
]

def load(d=RESULTS):
    "The results in folder `d`, in file-name order"
    return [(p.name, json.loads(p.read_text())) for p in sorted(Path(d).glob('*.json'))]

def tables(r):
    "The markdown tables of result `r`: remade from the raw figures for the bench's own runs, as saved for the others"
    if r['kind']=='bench':
        from fastddp.bench import table
        return table(r)
    return r['table']

def machine(m):
    "The machine in one line"
    gpus = ', '.join(m.get('gpus') or []) or 'no GPU'
    return f"{m['cpu']}, {m['cores']} CPUs, {gpus}; torch {m['torch']}, fastai {m['fastai']}, Python {m['python']}"

def provenance(r):
    "What result `r` is, its command, machine and date, in one line (above a table placed outside the benchmarks page)"
    return f"{r['title']}; `{r['command']}`; {machine(r['machine'])}; {r['date']}."

def section(name, r):
    "One result as markdown: what, the command, the machine, the date, the tables"
    return (f"## {r['title']}\n`{r['command']}`\n\nMachine: {machine(r['machine'])}. Date: {r['date']}. File: `{D}/{name}`.\n\n"
            + tables(r))

def _cell(i, s): return dict(cell_type='markdown', id=f'bench{i:04d}', metadata={}, source=s.splitlines(keepends=True))

def page(rs):
    "The benchmarks notebook for results `rs` (markdown cells only)"
    head = ("# Benchmarks\n> Every figure fastddp quotes, each table with the command that measured it, the machine and the date; "
            "generated by `tools/bench_page.py` from the JSON results in `nbs/bench_results/`.")
    how = ("## How this page is made\nEach command saves its raw figures as JSON (`--save`); `python tools/bench_page.py` turns "
           "every file in `nbs/bench_results/` into this page, in file-name order, the first table's ratios on top. The runs of "
           "`python -m fastddp.bench` are fresh sets of processes, interleaved and repeated; each ratio is the "
           "median of the paired ratios within a repetition, with their spread (see [bench](bench.ipynb)). The commands:\n\n"
           "```sh\n"+'\n'.join(COMMANDS)+"\npython tools/bench_page.py\n```")
    body = [section(n, r) for n,r in rs] or [
        "**No results yet**: run the commands above on a quiet machine, then `python tools/bench_page.py`."]
    top = [f"## Headline ratios\n{summary(rs)}"] if any(r['kind']=='bench' for _,r in rs) else []
    cells = [_cell(i, s) for i,s in enumerate([head, *top, how, *body])]
    return dict(cells=cells,
                metadata={'jupytext': {'cell_metadata_filter': '-all', 'main_language': 'python', 'notebook_metadata_filter': '-all'}},
                nbformat=4, nbformat_minor=5)

def summary(rs):
    "The page's headline table: the ratios of the first bench result, with its command, machine and date"
    r = next(r for _,r in rs if r['kind']=='bench')
    from fastddp.bench import ratios
    ls = ["| ratio | median | spread |", "|---|---|---|"]
    ls += [f"| {k} | {md:.2f} | {lo:.2f}-{hi:.2f} |" for k,(md,lo,hi,_) in ratios(r['samples_per_s']).items()]
    def where(o): # a row from another machine or day than the first result says which
        w = f"{o['machine']['cpu']}, {o['date'][:10]}"
        return '' if w==f"{r['machine']['cpu']}, {r['date'][:10]}" else f" ({w})"
    short = [o for n,o in rs if n.startswith('18_short_steps')] # short steps (the MLP): fastddp against the hand-written loop
    if short: ls += [f"| short steps (mlp){where(short[0])}: {k} | {md:.2f} | {lo:.2f}-{hi:.2f} |"
                     for k,(md,lo,hi,_) in ratios(short[0]['samples_per_s']).items() if k.startswith('ddp@2 / raw@2')]
    paired = [o for n,o in rs if n.startswith('22_short_steps_paired')] # the same, blocks alternating within one launch
    if paired:
        from short_steps import summary as paired_summary # this folder's `tools/short_steps.py`
        (md,lo,hi),*_ = paired_summary(paired[0]['two']['res'])
        k = f"short steps (mlp), paired within one launch (`tools/short_steps.py`){where(paired[0])}: fastddp@2 / raw@2"
        ls += [f"| {k} | {md:.2f} | {lo:.2f}-{hi:.2f} |"]
    return provenance(r)+"\n\n"+'\n'.join(ls)

def step_cost(rs):
    "The time-cost tutorial's table: what each part of a short step costs, with its command, machine and date"
    r = dict(rs)[STEP_COST]
    return provenance(r)+"\n\n"+r['table']

def write_marked(fn, s):
    "Put `s` between the markers of the markdown cell of notebook `fn` that has them"
    nb = json.loads(Path(fn).read_text())
    c = next(c for c in nb['cells'] if START in ''.join(c['source']))
    t = ''.join(c['source'])
    a,b = t.index(START)+len(START),t.index(END)
    c['source'] = (t[:a]+'\n'+s+'\n'+t[b:]).splitlines(keepends=True)
    Path(fn).write_text(json.dumps(nb, indent=1, ensure_ascii=False)+'\n')

def _saved(c): return c.split('--save ')[-1].split()[0].split('/')[-1]

def check(rs):
    "The page lists exactly what it shows: one command in `COMMANDS` per result file, and a file for each command"
    names,cmds = {n for n,_ in rs},{_saved(c) for c in COMMANDS}
    if names!=cmds: raise SystemExit(f"bench_page: results without a command in COMMANDS: {sorted(names-cmds)}; "
                                     f"commands without results: {sorted(cmds-names)}")

def main(results=RESULTS, out=PAGE):
    rs = load(results)
    if Path(results)==RESULTS: # the project's own results: the commands match them, and the tutorial shows one
        check(rs)
        write_marked(TUTORIAL, step_cost(rs))
    Path(out).write_text(json.dumps(page(rs), indent=1, ensure_ascii=False)+'\n')
    print(f"{out}: {len(rs)} results from {results}")

if __name__=='__main__': main(*sys.argv[1:3])
