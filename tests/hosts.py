"""Two hosts on one machine for the tests across hosts (test_hosts, test_slurm) and tools/bench_hosts.py: network namespaces
joined by a veth pair on a private subnet (root only: `ip netns`, `tc`). `launch` starts one `fastddp-launch --nnodes 2` in
each; `shape` limits the link with a token bucket on both ends; everything is removed on exit, also after an error.
Test code, so it lives with the tests, not in the package."""
import os, sys, subprocess
from fastcore.basics import patch
from fastddp.launch import free_port

def _sh(*cmd): return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

class Hosts:
    "Two network namespaces joined by a veth pair: `hosts` is `[(namespace, veth, address)]`; removed on exit"
    def __init__(self, tag:str=None): # a short suffix that makes the names unique (default: random)
        import uuid
        tag = tag or uuid.uuid4().hex[:6]
        net = f'10.{77+os.getpid()%100}.{os.getpid()%250}'
        self.hosts = [(f'fdh{i}{tag}', f'fdv{i}{tag}', f'{net}.{i}') for i in (1,2)]
    def __enter__(self):
        try:
            for n,_,_ in self.hosts: _sh('ip', 'netns', 'add', n)
            self.join()
            for n,v,a in self.hosts:
                _sh('ip', 'link', 'set', v, 'netns', n)
                _sh('ip', '-n', n, 'addr', 'add', f'{a}/24', 'dev', v)
                for o in (v, 'lo'): _sh('ip', '-n', n, 'link', 'set', o, 'up')
        except BaseException: self.__exit__(); raise
        return self
    def join(self):
        "The link's two ends, named `hosts[i][1]`, here (`__enter__` moves each into its host): a veth pair"
        _sh('ip', 'link', 'add', self.hosts[0][1], 'type', 'veth', 'peer', 'name', self.hosts[1][1])
    def __exit__(self, *exc):
        for n,_,_ in self.hosts: subprocess.run(['ip', 'netns', 'del', n], capture_output=True) # takes its end of the veth pair with it
    def __getitem__(self, i): return self.hosts[i]

@patch
def sent(self:Hosts, i:int): # which host
    "Bytes host `i` has sent over the link"
    n,v,_ = self[i]
    return int(_sh('ip', 'netns', 'exec', n, 'cat', f'/sys/class/net/{v}/statistics/tx_bytes'))

@patch
def shape(self:Hosts, rate:str=None, # such as '100mbit' or '1gbit'; None: no limit
          burst:str='64kb'): # the token bucket: bytes sent at once after a pause (a real link has none: keep it small)
    "Limit both ends of the link to `rate` with a token bucket"
    for n,v,_ in self.hosts:
        subprocess.run(['ip', 'netns', 'exec', n, 'tc', 'qdisc', 'del', 'dev', v, 'root'], capture_output=True)
        if rate: _sh('ip', 'netns', 'exec', n, 'tc', 'qdisc', 'add', 'dev', v, 'root', 'tbf', 'rate', rate, 'burst', burst,
                     'latency', '1s')

@patch
def launch(self:Hosts, script, # the script's path
           args=(), # its arguments
           env:dict=None, # extra environment variables
           port:int=None): # the master's port (default: a free one)
    "Start one `fastddp-launch --nnodes 2 --nproc 1` on each host, rank 0's host the master; return their `Popen`s"
    e = {**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})}
    port = port or free_port()
    return [subprocess.Popen(['ip', 'netns', 'exec', n, sys.executable, '-m', 'fastddp.launch', '--nnodes', '2', '--node-rank', str(i),
                              '--nproc', '1', '--master-addr', self[0][2], '--master-port', str(port), str(script), *map(str, args)],
                             env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i,(n,_,_) in enumerate(self.hosts)]
