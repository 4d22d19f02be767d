("Real SLURM clusters (munge, slurmctld, slurmd from Debian's packages, `make slurm`) in a temporary folder: one "
 "node on this host, and two nodes, one slurmd in each of the `hosts` network namespaces")
import os, sys, re, time, shutil, socket, signal, subprocess, tempfile, pytest, torch
from contextlib import contextmanager
from pathlib import Path
from fastddp.testing import read_reports
from fastddp.launch import free_port
from conftest import ROOT, wait_gone

CONF = '''ClusterName=fastddp
SlurmctldHost={n0}({a0})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={p1}
SlurmdPort={p2}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock,cred_expire=5
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
'''

def _pid(fn):
    try: return int(Path(fn).read_text())
    except (OSError, ValueError): return None

@contextmanager
def slurm(nodes, # [(name, address)]; node 0 runs slurmctld too
          on=lambda i: []): # the command prefix that puts a process on node `i`
    ("The clients' environment of a running SLURM cluster and the prefix that runs a client on "
     "node 0; its daemons and folder are removed afterwards, whatever happens")
    if not shutil.which('slurmctld'): pytest.fail("SLURM is not installed: run `make slurm`")
    d = Path(tempfile.mkdtemp(prefix='fastddp-slurm-'))
    for o in ('state', *(f'spool-{n}' for n,_ in nodes)): (d/o).mkdir()
    (d/'hosts').write_text('127.0.0.1 localhost\n'+''.join(f'{a} {n}\n' for n,a in nodes))
    (d/'slurm.conf').write_text(CONF.format(n0=nodes[0][0], a0=nodes[0][1], p1=free_port(), p2=free_port(), d=d,
                                            names=','.join(n for n,_ in nodes),
                                            nodes='\n'.join(f'NodeName={n} NodeAddr={a} CPUs={os.cpu_count()} State=UNKNOWN'
                                                            for n,a in nodes)))
    env = {**os.environ, 'SLURM_CONF': str(d/'slurm.conf'), 'PATH': f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    on_ = lambda i: [o.format(d=d) for o in on(i)]
    try:
        subprocess.run(['munged', '--force', f'--socket={d}/munge.sock', f'--pid-file={d}/munged.pid', f'--log-file={d}/munged.log',
                        f'--seed-file={d}/munged.seed'], check=True, capture_output=True)
        subprocess.run(on_(0)+['slurmctld', '-i'], env=env, check=True, capture_output=True)
        for i,(n,_) in enumerate(nodes): subprocess.run(on_(i)+['slurmd', '-N', n], env=env, check=True, capture_output=True)
        for _ in range(60): # until every node is idle
            if subprocess.run(on_(0)+['sinfo', '-h', '-N', '-o', '%t'], env=env, capture_output=True,
                              text=True).stdout.split().count('idle')==len(nodes): break
            time.sleep(0.5)
        else: pytest.fail(f"the SLURM nodes did not come up: {(d/'slurmctld.log').read_text()[-2000:]}")
        yield env,on_(0)
    finally:
        subprocess.run(on_(0)+['scancel', '--full', '-u', 'root'], env=env, capture_output=True, timeout=30)
        for f in [d/'slurmctld.pid', *d.glob('slurmd-*.pid'), d/'munged.pid']:
            p = _pid(f)
            if p:
                try: os.kill(p, signal.SIGTERM)
                except ProcessLookupError: pass
        time.sleep(1)
        shutil.rmtree(d, ignore_errors=True)

@pytest.fixture(scope='module')
def cluster():
    "One node, this host"
    n = socket.gethostname().split('.')[0]
    with slurm([(n, n)]) as (env,_): yield env

def on_host(hs, names):
    ("The prefix that runs a command on host `i` of `hs` named `names[i]`: its "
     "network, its own host name, and a hosts file naming every node")
    # not `ip netns exec`: it mounts a fresh /sys, without the cgroup hierarchy slurmd needs
    return lambda i: ['nsenter', f'--net=/run/netns/{hs[i][0]}', 'unshare', '--uts', '--mount', 'sh', '-c',
                      f'hostname {names[i]} && mount --bind {{d}}/hosts /etc/hosts && exec "$0" "$@"']

@pytest.fixture(scope='module')
def cluster2(hosts):
    "Two nodes, one slurmd on each of the two `hosts`; commands for the cluster run on node 0: `(env, prefix)`"
    names = [f'fdnode{i}' for i in (1,2)]
    with slurm([(n,h[2]) for n,h in zip(names, hosts.hosts)], on_host(hosts, names)) as res: yield res

_train = '''
import os, sys, socket
from fastai.basics import *
from fastai.distributed import *
import fastddp
from fastddp.core import rank
from fastddp.testing import report
torch.manual_seed(0)
x = torch.randn(64,3); ds = list(zip(x, x@tensor([1.,-2.,3.])[:,None]))
learn = Learner(DataLoaders(DataLoader(ds, bs=8), DataLoader(ds[:16], bs=8), device='cpu'), nn.Linear(3,1), loss_func=MSELossFlat())
if os.environ.get('FAIL_RANK')==os.environ.get('RANK'): raise ValueError(f"rank {rank()} was told to fail")
with learn.distrib_ctx(): learn.fit(1)
report(w=learn.model.weight.detach().clone(), ws=int(os.environ['WORLD_SIZE']), slurm=os.environ.get('SLURM_PROCID'),
       host=socket.gethostname())
'''

def _script(tmp_path):
    fn = tmp_path/'train.py'; fn.write_text(_train); return fn

def _sbatch(env, *args, pre=()):
    "Submit (with the command prefix `pre`), wait, and return the job's state, exit code and output"
    out = subprocess.run([*pre, 'sbatch', '--parsable', *args], env=env, capture_output=True, text=True, timeout=60)
    jid = out.stdout.strip().split(';')[0]
    assert jid, out.stderr
    end = time.time()+240
    while time.time()<end: # `sbatch --wait` polls at growing intervals (a 12 s job returned after 42 s): poll ourselves
        info = subprocess.run([*pre, 'scontrol', 'show', 'job', jid], env=env, capture_output=True, text=True).stdout
        state,code = re.search(r'JobState=(\S+)', info).group(1),re.search(r'ExitCode=(\S+)', info).group(1)
        if state not in ('PENDING', 'CONFIGURING', 'RUNNING', 'COMPLETING'): break
        time.sleep(0.5)
    return state,code,out

# the launcher's recipe: on two nodes, below
@pytest.mark.parametrize('recipe,opts', [('task_per_gpu', ['-N', '1', '--ntasks-per-node', '2', '--gpus-per-task', '0'])])
def test_sbatch_recipes(cluster, tmp_path, recipe, opts):
    ("The shipped sbatch scripts on the one-node cluster (one launcher per node; one srun "
     "task per rank, no launcher): two ranks, the same weights, COMPLETED")
    state,code,out = _sbatch({**cluster, 'FASTDDP_REPORT_DIR': str(tmp_path)}, *opts, f'--output={tmp_path}/job.out', '--chdir', str(ROOT),
                             str(ROOT/'scripts'/'slurm'/f'{recipe}.sbatch'), str(_script(tmp_path)))
    log = (tmp_path/'job.out').read_text()
    assert (state,code)==('COMPLETED', '0:0'), log[-3000:]
    rs = read_reports(tmp_path, 2)
    assert torch.equal(rs[0]['w'], rs[1]['w']), log[-3000:]
    if recipe=='task_per_gpu': # `srun python train.py`: no launcher, the ranks come from SLURM's variables
        assert [o['slurm'] for o in rs]==['0', '1'] and [o['ws'] for o in rs]==[2, 2]
        assert "fastddp: srun step without a launcher: 2 ranks, 2 on this node, master" in log, log[-3000:]

def test_failing_task(cluster, tmp_path, marker):
    "A rank that raises: the job ends FAILED, its output names the rank, and no process is left"
    state,code,out = _sbatch({**cluster, 'FAIL_RANK': '1'}, '-n', '2', f'--output={tmp_path}/job.out', '--wrap',
                             f'srun --kill-on-bad-exit=1 {sys.executable} {_script(tmp_path)} {marker}')
    log = (tmp_path/'job.out').read_text()
    assert state=='FAILED' and code!='0:0', (state, code, log[-3000:])
    assert 'ValueError: rank 1 was told to fail' in log, log[-3000:]
    assert wait_gone(marker, 20)==[]

@pytest.mark.parametrize('recipe,opts,n', [('launcher_per_node', [], 2),
                                           ('task_per_gpu', ['--ntasks-per-node', '1', '--gpus-per-task', '0'], 1)])
def test_two_nodes(cluster2, tmp_path, recipe, opts, n):
    ("The shipped sbatch scripts on two nodes, each its own host (network, address, "
     "host name): `n` ranks per node, the same weights, COMPLETED")
    env,pre = cluster2
    state,code,out = _sbatch({**env, 'FASTDDP_REPORT_DIR': str(tmp_path)}, '-N', '2', *opts, f'--output={tmp_path}/job.out',
                             '--chdir', str(ROOT), str(ROOT/'scripts'/'slurm'/f'{recipe}.sbatch'), str(_script(tmp_path)), pre=pre)
    log = (tmp_path/'job.out').read_text()
    assert (state,code)==('COMPLETED', '0:0'), log[-3000:]
    rs = read_reports(tmp_path, 2*n)
    assert [o['host'] for o in rs]==['fdnode1']*n+['fdnode2']*n and [o['ws'] for o in rs]==[2*n]*2*n, log[-3000:]
    for o in rs[1:]: assert torch.equal(rs[0]['w'], o['w']), log[-3000:]
    assert "which reaches the master" in log, log[-3000:] # each node picked the interface to the other
    if recipe=='task_per_gpu': assert "fastddp: srun step without a launcher: 2 ranks, 1 on this node, master fdnode1:" in log, log[-3000:]

def test_requeue(cluster, tmp_path, marker):
    ("The requeue recipe, 2 srun tasks: SIGUSR1 from SLURM mid-epoch (scancel --signal, as --signal=USR1@T sends it) checkpoints every "
     "rank at one step, rank 0 requeues the job, which resumes and ends with the uninterrupted weights, bit for bit")
    from test_preempt import PRE, _flat
    from fastddp.testing import run_ranks
    ref = _flat(run_ranks(PRE, n=2, args=[tmp_path/'ref'])[0]['w'])
    (tmp_path/'pre.py').write_text(PRE)
    env = {**cluster, 'FASTDDP_REPORT_DIR': str(tmp_path), 'OMP_NUM_THREADS': '1'}
    out = subprocess.run(['sbatch', '--parsable', '--ntasks-per-node', '2', f'--output={tmp_path}/job.out', '--chdir', str(tmp_path),
                          str(ROOT/'scripts'/'slurm'/'requeue.sbatch'), str(tmp_path/'pre.py'), str(tmp_path/'run'), 'at=train@1.3',
                          'to=slurm', 'sig=SIGUSR1', marker],
                         env=env, capture_output=True, text=True, timeout=60)
    jid = out.stdout.strip().split(';')[0]; assert jid, out.stderr
    end,states = time.time()+300,[]
    while time.time()<end:
        info = subprocess.run(['scontrol', 'show', 'job', jid], env=env, capture_output=True, text=True).stdout
        state = re.search(r'JobState=(\S+)', info).group(1)
        if not states or states[-1]!=state: states.append(state)
        if state in ('COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY'): break
        time.sleep(0.5)
    log = (tmp_path/'job.out').read_text()
    if not (state=='COMPLETED' and re.search(r'Restarts=1\b', info)): # what SLURM itself said, in full
        d = Path(env['SLURM_CONF']).parent
        daemons = '\n'.join(f"--- {f.name}:\n{f.read_text()[-2500:]}" for f in sorted(d.glob('slurm*.log')))
        pytest.fail(f"job states {states}\n{info}\n--- job.out:\n{log[-3000:]}\n{daemons}")
    rs = read_reports(tmp_path, 2)
    m = re.search(r"fastddp: SIGUSR1: every rank stopped at epoch (\d+), step (\d+); checkpoint (\S+) written", log)
    assert m and m[1]=='1' and int(m[2])>3, log[-3000:]
    # SLURM stops the job step as soon as rank 0 has requeued the job: a rank may be gone before its own report of the stop
    for o in rs:
        st = o.get('stop')
        if st: assert (st['code'],st['sig'],st['epoch'],st['it'])==(75,'SIGUSR1',1,int(m[2])), st
    assert f"SLURM job {jid} requeued" in log and f"resuming from {m[3]}" in log, log[-3000:]
    assert "start 1 on" in log and "start 2 on" in log, log[-3000:]
    for o in rs: assert torch.equal(_flat(o['w']), ref), log[-3000:]
    assert wait_gone(marker, 20)==[]
