"The example scripts: one process, and 2 CPU ranks under `python -m fastai.launch` and `torchrun`, on generated data"
import json, sys, subprocess, pytest
from fastddp.testing import run_ranks
from conftest import ROOT

S = ROOT/'scripts'
CASES = {'tabular': ('tabular_ddp.py', ['--synthetic', '400', '--bs', '32', '--epochs', '1']),
         'pets': ('pets_ddp.py', ['--synthetic', '148', '--size', '32', '--bs', '16', '--arch', 'resnet18', '--no-pretrained'])}
KEYS = {'task','world_size','epochs','valid_loss','metrics','sec_per_epoch','samples_per_s','comm_mib','wrapper','precision','history'}
# the scripts as users run them: their processes exit as CPython does (the rest of the suite's skip its last garbage collections)
pytestmark = pytest.mark.usefixtures('natural_exit')

# a plain fastai environment: no `import fastddp`, and the tabular script's own validation set rebuilt
EVAL = '''
import sys, json
from fastai.tabular.all import *
l = load_learner(sys.argv[1])
assert not any(type(o).__module__.startswith('fastddp') for o in l.cbs)
if sys.argv[2]=='tabular':
    set_seed(42)
    path = Path(sys.argv[3])
    dls = TabularDataLoaders.from_df(pd.read_csv(path/'adult.csv'), path=path, y_names='salary', bs=32,
                                     procs=[Categorify, FillMissing, Normalize],
                                     cat_names=['workclass','education','marital-status','occupation','relationship','race'],
                                     cont_names=['age','fnlwgt','education-num'])
    l.dls = dls
    print(json.dumps([float(o) for o in l.validate()]))
else: print(json.dumps(None))
'''

def check_run(name, n, rs, out, data):
    "What a run of script `name` on `n` ranks wrote to `out` (--out) and printed; its exported model, evaluated in plain fastai"
    m = json.loads((out/'metrics.json').read_text())
    assert set(m)==KEYS and m['world_size']==n and m['task']==name and len(m['history'])>=1
    assert m['wrapper']==(None if n==1 else 'DistributedDataParallel') # what the model trained in
    assert set(m['metrics'])==set(m['history'][-1])-{'train_loss','valid_loss'}
    assert rs.out.count(f"{name}: {n} process(es)")==1 # rank 0's summary, once
    p = subprocess.run([sys.executable, '-c', EVAL, str(out/'export.pkl'), name, str(data/'adult_400'/'adult_sample')],
                       capture_output=True, text=True, cwd=out)
    assert p.returncode==0, p.stderr[-2000:]
    ev = json.loads(p.stdout.strip().splitlines()[-1])
    if ev is not None: # the run's own numbers = one process's evaluation of the exported model
        assert abs(ev[0]-m['valid_loss'])<1e-5 and abs(ev[1]-m['metrics']['accuracy'])<1e-5, (ev, m)

def test_natural_exit():
    "This module's processes load no tests/site/sitecustomize.py; the rest of the suite's do"
    import os
    from conftest import SITE
    code = 'import sys; print(getattr(sys.modules.get("sitecustomize"), "__file__", None))'
    run = lambda env: subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env).stdout.strip()
    assert run(None)=='None', run(None)
    assert run({**os.environ, 'PYTHONPATH': SITE})==f'{SITE}/sitecustomize.py'

@pytest.mark.smoke
def test_script(tmp_path):
    "The tabular script in one process: what `check_run` checks"
    # At 2 ranks the uninterrupted runs of tests/test_resume.py check the same: pets under `python -m fastai.launch` (pretrained weights
    # from the cache), imdb under torchrun (with --time-cost), tabular under fastddp-launch (tests/test_launch: every launcher)
    fn,args = CASES['tabular']
    rs = run_ranks(str(S/fn), n=1, launcher='python', args=args+['--out', tmp_path/'o'], timeout=600,
                   env={'FASTDDP_DATA': str(tmp_path/'data')})
    check_run('tabular', 1, rs, tmp_path/'o', tmp_path/'data')

def test_bad_input(tmp_path):
    "Offline with no --data, --data in the wrong layout, or too few generated pets for fastai's split: one message, exit code 2"
    p = subprocess.run([sys.executable, str(S/'tabular_ddp.py')], capture_output=True, text=True)
    assert p.returncode==2 and "pass --data PATH" in p.stderr and "--synthetic N" in p.stderr.splitlines()[-1]
    p = subprocess.run([sys.executable, str(S/'pets_ddp.py'), '--data', str(tmp_path)], capture_output=True, text=True)
    assert p.returncode==2 and f"--data {tmp_path}" in p.stderr.splitlines()[-1] and "images" in p.stderr.splitlines()[-1]
    p = subprocess.run([sys.executable, str(S/'pets_ddp.py'), '--synthetic', '74'], capture_output=True, text=True) # 2 images a breed
    assert p.returncode==2 and "--synthetic 74: at least 148 for pets" in p.stderr.splitlines()[-1], p.stderr[-2000:]
    env = {**__import__('os').environ, 'FASTDDP_DATA': str(tmp_path/'data')}
    # checked before any data is read (a set too small for one batch: `one_batch`'s example in nbs/08_script.ipynb)
    bad = {('--forecast', '3y'): "--forecast '3y': expected", ('--epochs', '0'): "--epochs 0: expected 1 or more"}
    for args,msg in bad.items():
        p = subprocess.run([sys.executable, str(S/'tabular_ddp.py'), '--synthetic', '20', *args], capture_output=True, text=True, env=env)
        assert p.returncode==2 and msg in p.stderr.splitlines()[-1] and 'Traceback' not in p.stderr, (args, p.stderr[-2000:])

def test_bad_input_two_ranks(tmp_path):
    ("Under 2 ranks, bad input is one line whichever rank ends first: offline with no --data (rank 0 fails in `rank0_first`, the other "
     "raises the same error instead of losing its peer) under fastddp-launch and torchrun, --data in the wrong layout, and offline "
     "without IMDB's pretrained WT103 weights (rank 0 fetches them, the others share its error)")
    env = {**__import__('os').environ, 'FASTDDP_DATA': str(tmp_path/'data'), 'FASTAI_HOME': str(tmp_path/'fastai')}
    launch = [sys.executable, '-m', 'fastddp.launch', '--nproc', '2']
    cmds = {'offline, fastddp-launch': (launch+[str(S/'tabular_ddp.py')], 'could not download'),
            'offline, torchrun': ([sys.executable, '-m', 'torch.distributed.run', '--nproc-per-node', '2', str(S/'tabular_ddp.py')],
                                  'could not download'),
            'wrong --data': (launch+[str(S/'pets_ddp.py'), '--data', str(tmp_path)], f"--data {tmp_path}: expected"),
            'no WT103 offline': (launch+[str(S/'imdb_ddp.py'), '--sample', '--synthetic', '100'], 'no pretrained WT103 weights')}
    for k,(cmd,msg) in cmds.items():
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        out = p.stdout+p.stderr
        assert p.returncode!=0 and f"ScriptError: {msg}" in out, (k, out[-3000:])
        assert 'Connection closed by peer' not in out and 'urllib' not in out, (k, out[-3000:]) # no lost peer, no traceback of the cause
        if 'fastddp' in cmd[2]: # the launcher's line: the cause, once (the other rank failed the same way, or was stopped first)
            assert sum(f"ScriptError: {msg}" in l for l in out.splitlines())==1, (k, out[-3000:])
            assert 'failed after it' not in out, (k, out[-3000:]) # the other rank is not a lost peer: the same error, or stopped
            assert p.returncode==2, (k, p.returncode) # bad input, as in one process (torchrun says 1)

def test_script_checkpoint(tmp_path):
    ("--checkpoint DIR saves every epoch and the next run resumes from it; --no-resume starts over (with --dp: DataParallel, under "
     "fastai's `parallel_ctx`, a pass-through on a CPU, says so)")
    base = [sys.executable, str(S/'tabular_ddp.py'), '--synthetic', '400', '--checkpoint', str(tmp_path/'ck')]
    env = {**__import__('os').environ, 'FASTDDP_DATA': str(tmp_path/'data')}
    p = subprocess.run(base+['--epochs', '2'], capture_output=True, text=True, env=env)
    assert p.returncode==0 and sorted(o.name for o in (tmp_path/'ck').iterdir())==['ckpt_e0001_s000000.pth', 'ckpt_e0002_s000000.pth']
    p = subprocess.run(base+['--epochs', '3'], capture_output=True, text=True, env=env)
    assert p.returncode==0 and "resuming from" in p.stdout+p.stderr and "ckpt_e0002_s000000.pth" in p.stdout+p.stderr
    assert "written by a fit of 2 epoch(s) and this one has 3" in p.stdout+p.stderr # one cycle of 3 epochs is not one of 2
    p = subprocess.run(base+['--epochs', '3'], capture_output=True, text=True, env=env) # the finished run again: its numbers, no speed
    assert p.returncode==0 and "no epoch left to train" in p.stdout+p.stderr, p.stderr[-2000:]
    p = subprocess.run(base+['--epochs', '3', '--lr', '0.05', '--bs', '32'], capture_output=True, text=True, env=env) # another run's
    assert "written by a fit that set lr otherwise (another learning rate?)" in p.stderr, p.stderr[-2000:]
    assert "written by a fit of 5 steps an epoch on each rank and this one has 10 (another batch size?)" in p.stderr, p.stderr[-2000:]
    p = subprocess.run(base+['--epochs', '1', '--no-resume', '--dp', '--out', str(tmp_path/'o')], capture_output=True, text=True, env=env)
    assert p.returncode==0 and "resuming from" not in p.stdout+p.stderr, p.stderr[-2000:]
    # the earlier run's checkpoints set aside, where they outrank none of this run's (it would have pruned its own, and the next run
    # resumed theirs)
    assert f"starting over (resume=False): the 2 checkpoint(s) in {tmp_path/'ck'} moved to {tmp_path/'ck'/'old-'}" in p.stdout+p.stderr
    assert sorted(o.name for o in (tmp_path/'ck').glob('ckpt_*'))==['ckpt_e0001_s000000.pth']
    old = [sorted(o.name for o in d.iterdir()) for d in (tmp_path/'ck').glob('old-*')]
    assert old==[['ckpt_e0002_s000000.pth', 'ckpt_e0003_s000000.pth']], old
    assert json.loads((tmp_path/'o'/'metrics.json').read_text())['wrapper']=='DataParallel'
    assert "DataParallel without a GPU is a pass-through" in p.stdout+p.stderr

def test_script_flags(tmp_path):
    "--fp16 (bfloat16 on CPU), --scale-lr, --accum, --comm-hook and --time-cost reach the training, under 2 ranks"
    rs = run_ranks(str(S/'tabular_ddp.py'), n=2, launcher='fastddp',
                   args=['--synthetic', '400', '--fp16', '--scale-lr', 'sqrt', '--accum', '2', '--bs', '16', '--out', tmp_path/'o',
                         '--time-cost', '--comm-hook', 'fp16'],
                   env={'FASTDDP_DATA': str(tmp_path/'data')})
    assert "lr x2 (sqrt rule); global batch 16x2x2 = 64" in rs.out
    m = json.loads((tmp_path/'o'/'metrics.json').read_text())
    assert m['world_size']==2
    # fp16 compression: every synchronised step sent 2 bytes per parameter (the gradients themselves are float32)
    from fastai.learner import load_learner
    import fastai.tabular.all
    n = sum(p.numel() for p in load_learner(tmp_path/'o'/'export.pkl').model.parameters())
    assert m['comm_mib']*2**20==2*n
    # the time-cost report, once, from rank 0, with both ranks' columns; its plot in --out
    assert rs.out.count("time cost: 2 ranks")==1 and "rank 1: mean" in rs.out and "throughput:" in rs.out and "model FLOPs: " in rs.out
    assert (tmp_path/'o'/'time_cost.png').read_bytes()[:8]==b'\x89PNG\r\n\x1a\n'


OFFLINE = {'https_proxy': 'http://127.0.0.1:9', 'HTTPS_PROXY': 'http://127.0.0.1:9'} # a closed port: no server, online or not

def _run(script, args, env):
    import os
    return subprocess.run([sys.executable, str(S/script), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **OFFLINE, **env})

def pretrained(home):
    "A TORCH_HOME holding resnet18's IMAGENET1K_V1 file where torchvision caches it, its first layer all 0.5 (recognisable after training)"
    import torch, torchvision
    ck = home/'hub'/'checkpoints'; ck.mkdir(parents=True)
    sd = torchvision.models.resnet18().state_dict()
    sd['conv1.weight'].fill_(0.5) # fine_tune barely moves the first layer
    torch.save(sd, ck/'resnet18-f37072fd.pth') # the file torchvision names for IMAGENET1K_V1
    return home

def test_pets_weights(tmp_path):
    ("--weights NAME that the architecture lacks, or a missing file offline: one line that names the weights, or every file that "
     "would do (a cached file loads with no network: tests/test_resume.py's pets runs)")
    env = {'TORCH_HOME': str(pretrained(tmp_path/'th')), 'FASTDDP_DATA': str(tmp_path/'data')}
    p = _run('pets_ddp.py', ['--synthetic', '148', '--size', '32', '--bs', '16', '--arch', 'resnet18', '--weights', 'IMAGENET1K_V9'], env)
    assert p.returncode==2 and "--weights IMAGENET1K_V9: resnet18 has IMAGENET1K_V1, DEFAULT" in p.stderr.splitlines()[-1]
    p = _run('pets_ddp.py', ['--synthetic', '148', '--arch', 'mobilenet_v2', '--weights', 'IMAGENET1K_V1'], env)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode==2 and ("mobilenet_v2-b0353104.pth (--weights IMAGENET1K_V1); "
                                "mobilenet_v2-7ebf99e0.pth (--weights IMAGENET1K_V2 or DEFAULT)") in last, p.stderr[-2000:]
    assert str(tmp_path/'th'/'hub'/'checkpoints') in last

def test_imdb_no_weights(tmp_path):
    "Offline, the missing WT103 weights give one line; another failure of the learner (here: fastai's folder cannot be made) shows as it is"
    args = ['--sample', '--synthetic', '100', '--bs', '8']
    env = {'FASTDDP_DATA': str(tmp_path/'data'), 'FASTAI_HOME': str(tmp_path/'fastai')}
    p = _run('imdb_ddp.py', args, env)
    assert (p.returncode==2
            and "no pretrained WT103 weights (could not download them: URLError" in p.stderr.splitlines()[-1]), p.stderr[-2000:]
    (tmp_path/'file').write_text('a file where a folder should be')
    p = _run('imdb_ddp.py', args, {**env, 'FASTAI_HOME': str(tmp_path/'file'/'fastai')})
    assert (p.returncode==1 and "WT103" not in p.stderr
            and ("NotADirectoryError" in p.stderr or "FileExistsError" in p.stderr)), p.stderr[-2000:]

def test_script_shard(tmp_path):
    "--shard: the pets script fine-tunes sharded (FSDP2) under 2 ranks, reports each rank's memory, and exports a plain learner"
    fn,args = CASES['pets']
    rs = run_ranks(str(S/fn), n=2, launcher='fastddp', args=args+['--shard', '--time-cost', '--out', tmp_path/'o'], timeout=600,
                   env={'FASTDDP_DATA': str(tmp_path/'data')})
    m = json.loads((tmp_path/'o'/'metrics.json').read_text())
    assert m['wrapper']=='FSDP' and m['world_size']==2
    assert 'samples_s' in m['metrics'] and 'mfu' not in m['metrics'] # a sharded model's FLOPs are not counted: no MFU of 0
    assert (tmp_path/'o'/'time_cost.png').read_bytes()[:8]==b'\x89PNG\r\n\x1a\n' # matplotlib drew the report
    # a report per fit
    assert ("fastddp: sharded over 2 ranks" in rs.out
            and rs.out.count("memory per rank (MiB, live tensors): rank 0: parameters")==2)
    # FSDP2's collectives are inside forward and backward: the report says so, where it would say 0 MiB all-reduced
    assert rs.out.count("communication: sharded (FSDP2)")==2 and "MiB all-reduced per step" not in rs.out, rs.out[-3000:]
    p = subprocess.run([sys.executable, '-c', EVAL, str(tmp_path/'o'/'export.pkl'), 'pets', ''], capture_output=True, text=True,
                       cwd=tmp_path)
    assert p.returncode==0, p.stderr[-2000:]
