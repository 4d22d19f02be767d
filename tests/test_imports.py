("Importing fastddp leaves torch alone and neither rebinds nor adds a module-level "
 "name of fastai: it extends fastai only through its classes")
import sys, json, subprocess
import pytest

SNAPSHOT = r'''
import sys, json, inspect, importlib, pkgutil
import torch, torch.distributed, torch.distributed.algorithms.ddp_comm_hooks.default_hooks, torch.nn.parallel
from fastai.vision.all import *
from fastai.text.all import *
from fastai.tabular.all import *
import fastai.distributed, fastai.callback.fp16, fastai.callback.progress, fastai.callback.schedule
def snap():
    "id of every module-level value of torch and fastai, and of every attribute of torch's classes"
    res = {}
    for n,m in list(sys.modules.items()):
        if not n.split('.')[0] in ('torch','fastai') or m is None: continue
        for k,v in list(vars(m).items()):
            res[f'{n}.{k}'] = id(v),inspect.ismodule(v),n
            if n.startswith('torch') and inspect.isclass(v) and v.__module__==n:
                for a,o in list(vars(v).items()): res[f'{n}.{k}.{a}'] = id(o),False,n
    return res
before = snap()
import fastddp
for o in pkgutil.iter_modules(fastddp.__path__): importlib.import_module(f'fastddp.{o.name}')
after = snap()
changed = sorted(k for k in before if k in after and before[k]!=after[k])
# names added to modules loaded before fastddp; importing a submodule binds it on its parent package: the one addition allowed
mods = {n for _,_,n in before.values()}
added = sorted(k for k,(_,is_mod,n) in after.items() if k not in before and n in mods and not is_mod)
print(json.dumps(dict(changed=changed, added=added)))
'''

@pytest.mark.smoke
def test_no_rebinding():
    ("After importing every fastddp module, every torch module attribute, torch class attribute "
     "and fastai module attribute is the same object, and none was added")
    p = subprocess.run([sys.executable, '-c', SNAPSHOT], capture_output=True, text=True, timeout=600)
    assert p.returncode==0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r['changed']==[], f"fastddp rebinds: {r['changed']}"
    assert r['added']==[], f"fastddp adds: {r['added']}"

def test_catches_additions():
    "The snapshot sees a method added to a torch class and a name added to a fastai module (the test above can fail)"
    code = SNAPSHOT.replace("import fastddp\n",
                            "import fastddp\ntorch.nn.Linear.extra_thing = lambda self: 1\nfastai.learner.added_name = 1\n")
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=600)
    assert p.returncode==0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert {'torch.nn.modules.linear.Linear.extra_thing', 'fastai.learner.added_name'} <= set(r['added']), r

# each file compiled by an older Python; prints `file:line: message` for each that does not parse
_COMPILE = '''
import sys
for f in sys.argv[1:]:
    try: compile(open(f, encoding='utf-8').read(), f, 'exec')
    except SyntaxError as e: print(f"{f}:{e.lineno}: {e.msg}")
'''

def older_pythons():
    "An interpreter for each minor version from requires-python's floor to below this one's: pyenv's, or one on PATH that runs"
    import os, re, glob, shutil
    from conftest import ROOT
    lo = int(re.search(r'requires-python\s*=\s*">=3\.(\d+)', (ROOT/'pyproject.toml').read_text())[1])
    res = {}
    for m in range(lo, sys.version_info.minor):
        pyenv = sorted(glob.glob(os.path.expanduser(f'~/.pyenv/versions/3.{m}.*/bin/python3.{m}')))
        for p in pyenv[::-1]+[shutil.which(f'python3.{m}')]: # pyenv's shim on PATH fails where that version is not selected
            if p and subprocess.run([p, '-c', ''], capture_output=True).returncode==0: res[f'3.{m}'] = p; break
    return res

def test_oldest_python_parses():
    ("The package, the scripts and the tools parse on every older Python that requires-python admits (3.10 and 3.11 where this is "
     "3.12): `python -m fastddp.bench` was a SyntaxError on 3.10 and 3.11, the machines' own python3 (an f-string nested in "
     "one with the same quotes: 3.12's syntax)")
    from conftest import ROOT
    ps = older_pythons()
    assert ps, "no Python older than this one found (on PATH or in pyenv): requires-python's floor cannot be checked"
    files = [str(f) for d in ('fastddp', 'scripts', 'tools') for f in sorted((ROOT/d).glob('*.py'))]
    for v,p in ps.items():
        r = subprocess.run([p, '-c', _COMPILE, *files], capture_output=True, text=True, timeout=300)
        assert r.returncode==0 and not r.stdout.strip(), f"Python {v} ({p}) cannot parse:\n{r.stdout}{r.stderr[-2000:]}"
