"fastddp-doctor: the report without a GPU, a busy MASTER_PORT, --json with the text's fields, and the all-reduce bench on 2 gloo ranks"
import os, sys, json, socket, subprocess, pytest
from pathlib import Path
from conftest import ROOT, has_cuda

_dist = ('MASTER_ADDR','MASTER_PORT','WORLD_SIZE','RANK','LOCAL_RANK')

def doctor(*args, env=None, cmd=(sys.executable, '-m', 'fastddp.doctor'), timeout=120):
    "Run the doctor in a clean distributed environment plus `env`"
    e = {k:v for k,v in os.environ.items() if k not in _dist}
    return subprocess.run([*cmd, *map(str, args)], env={**e, **(env or {})}, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          stdin=subprocess.DEVNULL)

@pytest.mark.skipif(has_cuda(), reason="checks the report of a machine without GPU")
def test_report_no_gpu():
    "The console script runs without a GPU, says so, chooses gloo, and exits 0 when nothing fails"
    p = doctor('--nproc', 2, '--workers', 0, cmd=[str(Path(sys.executable).parent/'fastddp-doctor')])
    assert p.returncode==0, p.stdout+p.stderr
    lines = p.stdout.splitlines()
    assert "  no GPU" in lines
    assert any(l.split()[:3]==['ok', 'gpus', 'no'] and 'CPU processes on gloo' in l for l in lines), p.stdout
    assert "default: gloo" in p.stdout
    assert lines[-1].startswith("status ")

def test_busy_port():
    "A MASTER_PORT something listens on fails the port check with its one-line fix, and the exit code is 1"
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); s.listen()
        port = s.getsockname()[1]
        p = doctor('--json', env={'MASTER_PORT': str(port)})
    assert p.returncode==1, p.stdout+p.stderr
    c = {o['name']:o for o in json.loads(p.stdout)['checks']}['master port']
    assert c['status']=='fail'
    assert c['fix']==f"MASTER_PORT {port} is busy: pick another port or leave it unset for fastddp-launch"

def test_json_same_fields():
    "--json is valid JSON, and the text report shows the same sections, versions and checks"
    env = {'NCCL_DEBUG': 'WARN'}
    j,t = doctor('--json', env=env),doctor(env=env)
    r = json.loads(j.stdout)
    assert j.returncode==t.returncode
    lines = t.stdout.splitlines()
    assert set(r)=={'versions','backends','gpus','peer','topo','env','checks','status'}
    for k in r:
        if k!='status': assert k in lines, k # each section has its heading
    for k,v in r['versions'].items(): assert f"{k:<11} {v}" in t.stdout or v is None, k
    for c in r['checks']: # the free space in /dev/shm may move between the two runs
        assert any(l.split()[:1]==[c['status']] and c['name'] in l and (l.endswith(c['value']) or c['name']=='shm') for l in lines), c
        if c['fix']: assert f"fix: {c['fix']}" in t.stdout
    assert r['env']['vars']['NCCL_DEBUG']=='WARN' and "    NCCL_DEBUG=WARN" in lines
    assert lines[-1].startswith(f"status {r['status']}:")

def test_bench():
    ("--bench on 2 gloo ranks: a row per size, positive bus bandwidth below the memory-copy bandwidth of the same run, "
     "and a model's gradients")
    p = doctor('--bench', '--json', '--nproc', 2, '--max-size', '1M', '--model', 'resnet18', timeout=90)
    assert p.returncode in (0,1), p.stdout+p.stderr
    b = json.loads(p.stdout)['bench']
    assert b['nproc']==2
    assert [o['size'] for o in b['rows']]==[2**10, 2**12, 2**14, 2**16, 2**18, 2**20]
    assert b['model']['name']=='resnet18' and b['model']['size']==4*11689512
    assert b['compute']['float32']>0 # the matmul peak that Throughput's MFU divides by
    for o in b['rows']+[b['model']]:
        assert o['time_s']>0 and o['busbw_GBps']>0
        assert o['busbw_GBps']==pytest.approx(o['algbw_GBps']) # 2(n-1)/n is 1 for 2 ranks
    if not has_cuda():
        assert b['backend']=='gloo'
        assert all(o['busbw_GBps']<b['copy_GBps'] and 0<o['of_copy']<1 for o in b['rows']+[b['model']])

def test_bad_max_size():
    "A bad --max-size: one line, exit code 2"
    p = doctor('--bench', '--max-size', '64X')
    assert p.returncode==2
    assert p.stderr.strip().splitlines()==["fastddp-doctor: --max-size size '64X': expected bytes or a number with K, M or G, such as 64M"]

def test_bad_counts():
    "--nproc below 1 or --workers below 0: one line, exit code 2 (--nproc 0 ran as 2, --nproc -3 reported -3 processes)"
    for a,v,least in (('--nproc', 0, 1), ('--nproc', -3, 1), ('--workers', -1, 0)):
        p = doctor(a, v)
        assert p.returncode==2, p
        assert p.stderr.strip().splitlines()==[f"fastddp-doctor: {a} {v}: expected {least} or more"], p.stderr

def test_light_import():
    "Importing the module imports neither torch nor fastai"
    p = subprocess.run([sys.executable, '-c', "import sys, fastddp.doctor; print('torch' in sys.modules, 'fastai' in sys.modules)"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.stdout.split()==['False', 'False'], p.stderr

def test_bench_failures():
    "An unknown --model fails its check before any rank starts; ranks that fail are named as such, with their own error shown"
    p = doctor('--bench', '--json', '--nproc', 2, '--max-size', '4K', '--model', 'resnet35')
    r = json.loads(p.stdout)
    assert p.returncode==1 and 'bench' not in r
    assert [c['value'] for c in r['checks'] if c['name']=='bench']==["--model resnet35: not a torchvision model"]
    # the ranks' `init_distrib` refuses it (the launcher does not read it on one node)
    p = doctor('--bench', '--json', '--nproc', 2, '--max-size', '4K', env={'GLOO_SOCKET_IFNAME': 'nope0'}, timeout=90)
    r = json.loads(p.stdout)
    assert p.returncode==1 and 'bench' not in r
    assert [c['value'] for c in r['checks'] if c['name']=='bench']==["the ranks failed (exit code 2)"] # bad input: the ranks' code
    assert "DistribError: GLOO_SOCKET_IFNAME=nope0: no interface nope0 on this host" in p.stderr, p.stderr[-2000:]
