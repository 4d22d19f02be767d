"Importing fastddp leaves torch alone and rebinds no module-level name of fastai: it extends fastai only through its classes"
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
            res[f'{n}.{k}'] = id(v)
            if n.startswith('torch') and inspect.isclass(v) and v.__module__==n:
                for a,o in list(vars(v).items()): res[f'{n}.{k}.{a}'] = id(o)
    return res
before = snap()
import fastddp
for o in pkgutil.iter_modules(fastddp.__path__): importlib.import_module(f'fastddp.{o.name}')
after = snap()
print(json.dumps(sorted(k for k in before if k in after and before[k]!=after[k])))
'''

def test_no_rebinding():
    "After importing every fastddp module, every torch module attribute, torch class attribute and fastai module attribute is the same object"
    p = subprocess.run([sys.executable, '-c', SNAPSHOT], capture_output=True, text=True, timeout=600)
    assert p.returncode==0, p.stderr[-3000:]
    changed = json.loads(p.stdout.strip().splitlines()[-1])
    assert changed==[], f"fastddp rebinds: {changed}"
