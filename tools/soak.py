"Launch a script many times and report every launch that hung or failed, with the Python stacks of a hung launch's processes"
import os, sys, json, time, signal, shlex, subprocess, tempfile, platform
from pathlib import Path
import psutil
from fastcore.script import call_parse

HERE = Path(__file__).parent
LAUNCHERS = {'torchrun': [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '{n}'],
             'fastddp': [sys.executable, '-m', 'fastddp.launch', '--nproc', '{n}']}

def stacks(pid):
    "`py-spy dump` of `pid` and of every process under it"
    try: ps = [psutil.Process(pid)]+psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess: return {}
    res = {}
    for p in ps:
        try: cmd = ' '.join(p.cmdline())
        except psutil.Error: continue
        r = subprocess.run(['py-spy', 'dump', '--pid', str(p.pid)], capture_output=True, text=True, timeout=60)
        res[f"{p.pid} {cmd}"] = r.stdout or r.stderr
    return res

def kill_tree(p):
    "Kill the launcher's session: the launcher, its workers and their DataLoader workers"
    try: os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError: pass
    p.wait()

def once(cmd, timeout, env):
    "Run `cmd` once: exit code, seconds, output tail, and the stacks when it ran past `timeout`"
    t0 = time.time()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         stdin=subprocess.DEVNULL)
    try:
        out,_ = p.communicate(timeout=timeout)
        return dict(rc=p.returncode, secs=time.time()-t0, hung=False, tail=out[-2000:])
    except subprocess.TimeoutExpired:
        st = stacks(p.pid)
        kill_tree(p)
        out = p.stdout.read() if p.stdout else ''
        return dict(rc=None, secs=time.time()-t0, hung=True, tail=out[-2000:], stacks=st)

def _save(fn, cmd, runs, timeout, command=None):
    "The soak's summary as a result of the benchmark page"
    from fastddp.bench import save_result
    secs = sorted(r['secs'] for r in runs if not r['hung'])
    rcs = sorted({r['rc'] for r in runs if not r['hung'] and r['rc']!=0})
    hung,failed = sum(r['hung'] for r in runs),sum(not r['hung'] and r['rc']!=0 for r in runs)
    tbl = ("| launches | hung (no exit within the bound) | failed | exit codes of the failures | bound (s) | "
           "seconds per launch: median (min-max) |\n|---|---|---|---|---|---|\n"
           f"| {len(runs)} | {hung} | {failed} | {', '.join(map(str, rcs)) or '-'} | {timeout:g} | "
           f"{secs[len(secs)//2]:.0f} ({secs[0]:.0f}-{secs[-1]:.0f}) |\n\n"
           f"The launch: `{shlex.join(Path(o).name if o==sys.executable else o for o in cmd)}`, on Python {platform.python_version()}.")
    save_result(fn, 'soak', f"Soak: {len(runs)} launches of {Path(cmd[-1]).name} "
                f"under {'torchrun' if 'torch.distributed.run' in cmd else 'fastddp-launch'}",
                command or 'python tools/soak.py '+shlex.join(sys.argv[1:]), tbl,
                runs=[{k:v for k,v in r.items() if k!='tail'} for r in runs])

@call_parse
def main(n:int=100, # launches
         script:str=str(HERE/'soak_user.py'), # the script to launch
         launcher:str='torchrun', # 'torchrun' or 'fastddp'
         nproc:int=2, # processes per launch
         timeout:float=240, # seconds after which a launch counts as hung (a launch takes well under a minute)
         out:str='soak_runs.json', # every launch's exit code, time, output tail and, when it hung, stacks
         args:str='', # the script's arguments
         save:str=None): # the summary as a benchmark result for `tools/bench_page.py`
    "Launch `script` `n` times with `launcher`; count hangs and failures"
    cmd = [o.format(n=nproc) for o in LAUNCHERS[launcher]]+[script, *shlex.split(args)]
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
    runs = []
    for i in range(n):
        r = once(cmd, timeout, env)
        runs.append(r)
        state = 'HUNG' if r['hung'] else f"rc={r['rc']}"
        print(f"{i+1}/{n}: {state} in {r['secs']:.1f}s", flush=True)
        Path(out).write_text(json.dumps(dict(cmd=shlex.join(cmd), python=platform.python_version(), runs=runs), indent=1))
    hung,failed = sum(r['hung'] for r in runs),sum(not r['hung'] and r['rc']!=0 for r in runs)
    print(f"{n} launches of {shlex.join(cmd)}: {hung} hung, {failed} failed, {n-hung-failed} ok")
    if save: _save(save, cmd, runs, timeout)
