"A real SLURM cluster of one node (munge, slurmctld, slurmd from Debian's packages, `make slurm`), in a temporary folder"
import os, sys, re, time, shutil, socket, signal, subprocess, tempfile, pytest, torch
from pathlib import Path
from fastddp.testing import read_reports
from fastddp.launch import free_port
from conftest import ROOT, wait_gone

CONF = '''ClusterName=fastddp
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={p1}
SlurmdPort={p2}
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
'''

def _pid(fn):
    try: return int(Path(fn).read_text())
    except (OSError, ValueError): return None

@pytest.fixture(scope='module')
def cluster():
    "The environment of a running one-node SLURM cluster; its daemons and folder are removed afterwards, whatever happens"
    if not shutil.which('slurmctld'): pytest.fail("SLURM is not installed: run `make slurm`")
    d = Path(tempfile.mkdtemp(prefix='fastddp-slurm-'))
    for o in ('state', 'spool'): (d/o).mkdir()
    (d/'slurm.conf').write_text(CONF.format(host=socket.gethostname().split('.')[0], p1=free_port(), p2=free_port(), d=d, cpus=os.cpu_count()))
    env = {**os.environ, 'SLURM_CONF': str(d/'slurm.conf'), 'PATH': f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        subprocess.run(['munged', '--force', f'--socket={d}/munge.sock', f'--pid-file={d}/munged.pid', f'--log-file={d}/munged.log', f'--seed-file={d}/munged.seed'], check=True, capture_output=True)
        for o in (['slurmctld', '-i'], ['slurmd']): subprocess.run(o, env=env, check=True, capture_output=True)
        for _ in range(60): # until the node is idle
            if 'idle' in subprocess.run(['sinfo', '-h', '-o', '%t'], env=env, capture_output=True, text=True).stdout: break
            time.sleep(0.5)
        else: pytest.fail(f"the SLURM node did not come up: {(d/'slurmctld.log').read_text()[-2000:]}")
        yield env
    finally:
        subprocess.run(['scancel', '--full', '-u', 'root'], env=env, capture_output=True)
        for o in ('slurmd', 'slurmctld', 'munged'):
            p = _pid(d/f'{o}.pid')
            if p:
                try: os.kill(p, signal.SIGTERM)
                except ProcessLookupError: pass
        time.sleep(1)
        shutil.rmtree(d, ignore_errors=True)

_train = '''
import os, sys
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
report(w=learn.model.weight.detach().clone(), ws=int(os.environ['WORLD_SIZE']), slurm=os.environ.get('SLURM_PROCID'))
'''

def _script(tmp_path):
    fn = tmp_path/'train.py'; fn.write_text(_train); return fn

def _sbatch(env, *args):
    "Submit, wait, and return the job's state, exit code and output"
    out = subprocess.run(['sbatch', '--parsable', '--wait', *args], env=env, capture_output=True, text=True, timeout=240)
    jid = out.stdout.strip().split(';')[0]
    info = subprocess.run(['scontrol', 'show', 'job', jid], env=env, capture_output=True, text=True).stdout
    state,code = re.search(r'JobState=(\S+)', info).group(1),re.search(r'ExitCode=(\S+)', info).group(1)
    return state,code,out

@pytest.mark.parametrize('recipe,opts', [('launcher_per_node', ['-N', '1']), ('task_per_gpu', ['-N', '1', '--ntasks-per-node', '2', '--gpus-per-task', '0'])])
def test_sbatch_recipes(cluster, tmp_path, recipe, opts):
    "The shipped sbatch scripts on the one-node cluster (one launcher per node; one srun task per rank, no launcher): two ranks, the same weights, COMPLETED"
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
    state,code,out = _sbatch({**cluster, 'FAIL_RANK': '1'}, '-n', '2', f'--output={tmp_path}/job.out', '--wrap', f'srun --kill-on-bad-exit=1 {sys.executable} {_script(tmp_path)} {marker}')
    log = (tmp_path/'job.out').read_text()
    assert state=='FAILED' and code!='0:0', (state, code, log[-3000:])
    assert 'ValueError: rank 1 was told to fail' in log, log[-3000:]
    assert wait_gone(marker, 20)==[]
