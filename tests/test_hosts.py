"Two hosts on one machine: network namespaces joined by a veth pair, each with its own address and `fastddp-launch`"
import os, sys, time, subprocess, tempfile, pytest, torch
from pathlib import Path
from fastddp.testing import read_reports
from fastddp.launch import peer_lost
from conftest import wait_gone

def launch(hs, code, marker, env=None):
    "Start one `fastddp-launch --nnodes 2` on each host; return the Popens and the report folder"
    d = tempfile.mkdtemp()
    (Path(d)/'script.py').write_text(code)
    return hs.launch(Path(d)/'script.py', [marker], env={'FASTDDP_REPORT_DIR': d, 'FASTDDP_TIMEOUT': '30', **(env or {})}),d

_train = '''
import os
from fastai.basics import *
from fastai.distributed import *
import fastddp
from fastddp.testing import report
from fastddp.timecost import TimeCost, recommend
from fastddp.distrib import setup_distrib
import time, torch.distributed as dist
torch.manual_seed(0)
x = torch.randn(256,512); ds = list(zip(x, x[:,:1]))
learn = Learner(DataLoaders(DataLoader(ds, bs=16), DataLoader(ds[:32], bs=16), device='cpu'),
                nn.Sequential(nn.Linear(512,512), nn.Linear(512,1)), loss_func=MSELossFlat())
tc = TimeCost(show=False)
with learn.distrib_ctx(): learn.fit(1, cbs=[tc])
st = tc.stats(); ph = {p:v[0][0] for p,v in st['phases'].items()}
setup_distrib(); t = torch.ones(2**20) # 4 MiB
dist.all_reduce(t); dist.barrier(); t0 = time.perf_counter()
for _ in range(3): dist.all_reduce(t)
report(w=[p.detach().clone() for p in learn.model.parameters()], iface=os.environ.get('GLOO_SOCKET_IFNAME'),
       valid=learn.recorder.values[-1][1], comm=ph['comm']/sum(ph.values()), mbit=st['comm_mbit'], advice=dict(recommend(st)).get('comm'),
       Bps=3*4*2**20/(time.perf_counter()-t0))
'''

def run_pair(hosts, marker):
    "Train on both hosts; the reports, outputs and bytes each host sent"
    t0 = [hosts.sent(i) for i in (0,1)]
    ps,d = launch(hosts, _train, marker)
    outs = [p.communicate(timeout=180)[0] for p in ps]
    assert [p.returncode for p in ps]==[0, 0], '\n'.join(o[-2000:] for o in outs)
    return read_reports(d, 2),outs,[hosts.sent(i)-t for i,t in enumerate(t0)]

def test_two_hosts_train(hosts, marker):
    ("No interface given: each node picks the veth that reaches the master, the job trains, the gradients cross the link; "
     "then over a 100 Mbit/s link, which TimeCost measures and advises on")
    rs,outs,sent = run_pair(hosts, marker)
    assert [r['iface'] for r in rs]==[h[1] for h in hosts.hosts]
    assert all(f"network interface {h[1]} ({h[2]}), which reaches the master {hosts[0][2]}" in o
               for h,o in zip(hosts.hosts, outs)), outs[0][-2000:]
    for a,b in zip(*[r['w'] for r in rs]): assert torch.equal(a, b)
    assert rs[0]['valid']==rs[1]['valid']
    # 8 steps, each all-reducing 1 MiB of gradients: a ring all-reduce sends about the payload each way
    assert min(sent)>8*(512*513*4), sent
    assert wait_gone(marker, 20)==[]
    hosts.shape('100mbit')
    try: slow,_,_ = run_pair(hosts, marker)
    finally: hosts.shape(None)
    for a,b in zip(rs[0]['w'], slow[0]['w']): assert torch.equal(a, b) # the link changes the time, not the numbers
    assert max(o['Bps'] for o in slow)<=1.1*100e6/8, [o['Bps'] for o in slow] # the shaping is in effect
    # the report sees it
    assert min(o['comm'] for o in slow)>max(o['comm'] for o in rs), ([o['comm'] for o in rs], [o['comm'] for o in slow])
    # TimeCost measures the link's rate in the training steps, and its advice quotes it, compression first,
    # then the accumulation that meets the limit
    assert max(o['mbit'] for o in slow)<=1.1*100<min(o['mbit'] for o in rs), ([o['mbit'] for o in rs], [o['mbit'] for o in slow])
    for o in slow:
        assert (f"an effective {o['mbit']:,.0f} Mbit/s, a slow link (below 1,000 Mbit/s); compress: comm_hook='fp16'" in o['advice']
                and '`Accumulate(' in o['advice']), o['advice']

def test_master_unreachable(hosts, marker):
    "Node rank 1 alone: the master never comes; it ends within the timeout, naming the address and port"
    d = tempfile.mkdtemp(); (Path(d)/'s.py').write_text('print("never")')
    t0 = time.time()
    r = subprocess.run(['ip', 'netns', 'exec', hosts[1][0], sys.executable, '-m', 'fastddp.launch', '--nnodes', '2', '--node-rank', '1',
                        '--nproc', '1', '--master-addr', hosts[0][2], '--master-port', '29999', str(Path(d)/'s.py'), marker],
                       env={**os.environ, 'FASTDDP_TIMEOUT': '10'}, capture_output=True, text=True, timeout=120)
    assert r.returncode==1 and time.time()-t0<10+20, (r.returncode, time.time()-t0) # the bounded wait, plus starting Python and torch
    at = f"{hosts[0][2]}:29999"
    ls = [l for l in r.stderr.splitlines() if l.strip() and 'Warning' not in l and 'warnings.warn' not in l]
    assert f"waiting for the master at {at}, for up to 10 s (FASTDDP_TIMEOUT)" in ls[-2], ls # said up front
    # one line at the end
    assert ls[-1].startswith(f"fastddp-launch: nothing answered at {at} within 10 s: start node rank 0 there first"), ls
    assert 'frame #' not in r.stderr and 'Traceback' not in r.stderr, r.stderr[-2000:] # no C++ or Python stack
    assert 'never' not in r.stdout

_slow = _train.replace('cbs=[tc]', 'cbs=[tc, Slow()]').replace('torch.manual_seed(0)', '''torch.manual_seed(0)
import time
class Slow(Callback):
    def after_batch(self): report(step=self.iter); time.sleep(1)''')

def training(hosts, marker):
    "Start the slow job on both hosts (`FASTDDP_TIMEOUT=15`) and return its Popens once both ranks train"
    ps,d = launch(hosts, _slow, marker, env={'FASTDDP_TIMEOUT': '15'})
    while not all(o and 'step' in o for o in read_reports(d, 2)):
        assert all(p.poll() is None for p in ps), [p.communicate()[0][-2000:] for p in ps]
        time.sleep(0.5)
    return ps

def test_link_down(hosts, marker):
    "The link goes down mid-run: both hosts end within the timeout with the lost peer named, and no process is left"
    ps = training(hosts, marker)
    subprocess.run(['ip', '-n', hosts[0][0], 'link', 'set', hosts[0][1], 'down'], check=True)
    t0 = time.time()
    try: outs = [p.communicate(timeout=120)[0] for p in ps]
    finally: subprocess.run(['ip', '-n', hosts[0][0], 'link', 'set', hosts[0][1], 'up'], check=True)
    assert time.time()-t0<2*15+20, time.time()-t0
    assert [p.returncode for p in ps]==[1, 1], '\n'.join(o[-2000:] for o in outs)
    # the launcher's line names the lost peer
    for o in outs: assert peer_lost([l for l in o.splitlines() if ') failed: ' in l][0]), o[-2000:]
    assert wait_gone(marker, 20)==[]

def test_host_killed(hosts, marker):
    ("One host's launcher and its workers are killed mid-run (the machine is gone): the other ends within the timeout, "
     "naming the lost rank, and no process is left")
    import psutil, signal
    ps = training(hosts, marker)
    # torch's agent starts each worker in its own session: the tree by parent PIDs, not the process group
    tree = [psutil.Process(ps[1].pid)]; tree += tree[0].children(recursive=True)
    for p in tree: p.send_signal(signal.SIGKILL)
    t0 = time.time()
    out = ps[0].communicate(timeout=120)[0]; ps[1].communicate()
    assert time.time()-t0<2*15, time.time()-t0
    assert ps[0].returncode==1, out[-2000:]
    assert f"fastddp-launch: no rank on this node failed by itself: it lost its peer at {hosts[1][2]} on another node" in out, out[-2000:]
    assert wait_gone(marker, 20)==[]

def test_hosts_removed():
    "`Hosts` removes its namespaces on exit, also after an error inside"
    from hosts import Hosts, _sh
    try:
        with Hosts() as hs:
            names = [n for n,_,_ in hs.hosts]
            assert all(n in _sh('ip', 'netns', 'list') for n in names)
            raise KeyError('boom')
    except KeyError: pass
    assert not any(n in _sh('ip', 'netns', 'list') for n in names)

def test_doctor_across_hosts(hosts, tmp_path):
    ("`fastddp-doctor --bench --json` started by the launcher on both hosts measures the link between them (rank 0 prints it, "
     "rank 1 nothing), and a forecast takes the saved file as its link")
    import json, shutil
    from fastai.basics import Learner, DataLoaders, DataLoader, nn, MSELossFlat
    from fastddp.timecost import TimeCost
    import fastddp.forecast
    doc = shutil.which('fastddp-doctor', path=str(Path(sys.executable).parent))
    ps = hosts.launch(doc, ['--bench', '--json', '--max-size', '1M'])
    outs = [p.communicate(timeout=300)[0] for p in ps]
    o = outs[0]
    r = json.JSONDecoder().raw_decode(o[o.index('{'):])[0]
    assert '"bench"' not in outs[1], outs[1][-2000:]
    b = r['bench']
    assert (b['nproc'], b['nodes'], [x['size'] for x in b['rows']][-1]) == (2, 2, 2**20), b
    (tmp_path/'link.json').write_text(json.dumps(r))
    x = torch.randn(64, 8); ds = list(zip(x, x[:, :1]))
    learn = Learner(DataLoaders(DataLoader(ds, bs=16), DataLoader(ds[:16], bs=16), device='cpu'), nn.Linear(8, 1), loss_func=MSELossFlat())
    learn.add_cb(TimeCost(show=False, skip=0))
    learn.fit(1)
    f = learn.time_cost.forecast(1, hosts=2, link=tmp_path/'link.json')
    assert 'across 2 hosts' in f['assumptions']['link'], f['assumptions']
    assert f['ms']['comm'] > 0 and f['world'] == 2

_echo = '''
import socket, sys, time, statistics
if sys.argv[1]=='serve':
    s = socket.create_server(('0.0.0.0', 5999)); c,_ = s.accept()
    while (b := c.recv(64)): c.sendall(b)
else:
    for _ in range(100):
        try: c = socket.create_connection((sys.argv[2], 5999)); break
        except OSError: time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ts = []
    for _ in range(10):
        t = time.perf_counter(); c.sendall(b'x'); c.recv(64); ts.append(time.perf_counter()-t)
    print(statistics.median(ts))
'''

def test_delay_wire():
    "`tools/delay_wire.py`'s hosts (the forecast's latency check): a round trip over a 5 ms wire takes 10 ms and a bit; all removed on exit"
    sys.path.insert(0, str(Path(__file__).parents[1]/'tools'))
    from delay_wire import WireHosts
    from hosts import _sh
    with WireHosts(5) as hs:
        (n1,_,_),(n2,_,a2) = hs.hosts
        srv = subprocess.Popen(['ip', 'netns', 'exec', n2, sys.executable, '-c', _echo, 'serve'])
        p = subprocess.run(['ip', 'netns', 'exec', n1, sys.executable, '-c', _echo, 'ping', a2], capture_output=True, text=True, timeout=60)
        srv.wait(timeout=10)
        names,wire = [n for n,_,_ in hs.hosts],hs.proc
    rtt = float(p.stdout)
    assert 0.010<=rtt<0.030, rtt # twice the wire's 5 ms, plus the Python on each end
    assert not any(n in _sh('ip', 'netns', 'list') for n in names) and wire.poll() is not None
