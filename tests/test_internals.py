"The private torch APIs in `fastddp.internals` still do what fastddp needs, on 2 real gloo ranks: fails the day one moves"
from fastddp.testing import run_ranks

CODE = '''
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
from fastddp.core import *; from fastddp.testing import report
from fastddp.internals import *
init_distrib('gloo')
out = {}
st = default_store()
st.set(f'k{rank()}', str(rank())); dist.barrier()
out['store'] = [st.get(f'k{r}').decode() for r in range(world_size())] # each rank reads the others' keys, no collective
m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
fully_shard(m, mesh=init_device_mesh('cpu', (world_size(),)))
out['sync'] = [grad_sync(m)]
m.set_requires_gradient_sync(False); out['sync'].append(grad_sync(m))
m.set_requires_gradient_sync(True); out['sync'].append(grad_sync(m))
d = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
remove_ddp_hooks(d)
d2 = nn.parallel.DistributedDataParallel(d.module)
d2(torch.ones(2, 4)).sum().backward() # the first wrapper's hooks no longer fire
out['grad'] = d.module.weight.grad.tolist()
report(**out)
'''

def test_internals():
    rs = run_ranks(CODE, n=2)
    for r in rs:
        assert r['store']==['0', '1'] and r['sync']==[True, False, True], r
        assert r['grad']==[[2.0]*4], r # the mean of the ranks' equal gradients (2 per weight), summed once, not twice
