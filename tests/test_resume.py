("Exact resume of the example scripts: stopped mid-epoch by SIGTERM or SIGUSR1 (through fastddp-launch, `python -m fastai.launch` "
 "and torchrun) or at an epoch's end by a rank killed with SIGKILL (--max-restarts), the same command ends bit-equal to an "
 "uninterrupted run")
import os, re, signal, pytest, torch
from pathlib import Path
from fastddp.testing import run_ranks
from fastddp.preempt import PREEMPTED
from conftest import ROOT, wait_gone
from test_scripts import check_run, pretrained

# The real script, run with two test callbacks added to the ones it asks `fastddp.script.train_cbs` for: `Sig` stops the first run
# (AT='F.E.I': after training step I of epoch E of fit F, rank 0 sends SIG to the launcher; KILL='F.E': once the checkpoint at the
# end of epoch E of fit F is written, rank 1 kills itself with SIGKILL, on the launcher's first attempt; F counts the fits of every
# learner of the run, a fit skipped at a resume too), and every run reports each rank's model state and step count where the script
# finishes. argv: the script, its arguments, then a marker
WRAP = '''
import os, sys, time, signal, runpy, itertools
from pathlib import Path
from fastai.callback.core import Callback
import fastddp.script as S
from fastddp.core import rank
from fastddp.testing import report
from fastddp.preempt import Preempt
Preempt.budget = 0.01 # a check at every step (the default: every 0.5 s), so that the stop lands in the epoch it was sent in
script,args = sys.argv[1],[a for a in sys.argv[2:] if not a.startswith('mark-')]
ck = Path(args[args.index('--checkpoint')+1])
attempt0 = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')=='0' # the launcher's first attempt
first = not (ck/'sent').exists() and attempt0
at,kill,sig = os.environ.get('AT'),os.environ.get('KILL'),getattr(signal, os.environ.get('SIG', 'SIGTERM'))
fits = itertools.count()
class Sig(Callback):
    order = 80 # after `Checkpoint` (70)
    def before_fit(self): self.nf = next(fits) # this fit's number in the run, the fits of every learner counted
    def after_batch(self):
        if not self.training: return
        time.sleep(0.02) # slow enough for a signal to land in the epoch it was sent in
        if first and at==f'{self.nf}.{self.epoch}.{self.iter}' and rank()==0:
            ck.mkdir(parents=True, exist_ok=True); (ck/'sent').touch(); os.kill(os.getppid(), sig)
    def after_epoch(self): # on the launcher's first attempt, whether or not this run resumed
        if kill==f'{self.nf}.{self.epoch}' and rank()==1 and attempt0:
            os.kill(os.getpid(), signal.SIGKILL)
if os.environ.get('AWD'): # a smaller AWD-LSTM (IMDB): the same layers, tied embedding and WeightDropout, a fifth of the work
    from fastai.text.models.awdlstm import awd_lstm_clas_config, awd_lstm_lm_config # the classifier loads the language model's encoder
    for c in (awd_lstm_clas_config, awd_lstm_lm_config): c.update(zip(('emb_sz', 'n_hid'), map(int, os.environ['AWD'].split(','))))
_cbs,_fin = S.train_cbs,S.finish
S.train_cbs = lambda *a, **k: _cbs(*a, **k)+[Sig()]
def finish(learn, *a, **k):
    report(sd={k:v.detach().clone() for k,v in learn.model.state_dict().items()}, ti=learn.train_iter, hist=learn.recorder.values)
    return _fin(learn, *a, **k)
S.finish = finish
sys.argv = [script]+args
runpy.run_path(script, run_name='__main__')
'''

def _run(tmp_path, name, args, launcher='fastddp', env=None, **kw):
    return run_ranks(WRAP, n=2, launcher=launcher, args=[ROOT/'scripts'/f'{name}_ddp.py', *args, '--checkpoint', tmp_path/name],
                     env={'FASTDDP_DATA': str(tmp_path.parent/'data'), **(env or {})}, timeout=600, **kw)

def _diff(rs, ref, timed=False):
    ("How the ranks' weights and buffers, step count and recorder rows (less their last column where `timed`: the samples/s that "
     "--time-cost adds) differ from the uninterrupted run's; None where they are equal bit for bit")
    for i,(o,r) in enumerate(zip(rs, ref)):
        if o['ti']!=r['ti']: return f"rank {i}: step {o['ti']}, not {r['ti']}"
        h,hr = ([x[:-1] for x in o['hist']],[x[:-1] for x in r['hist']]) if timed else (o['hist'],r['hist'])
        if h!=hr: return f"rank {i}: recorder {h}, not {hr}" # train_loss (smoothed over the fit), valid_loss, metrics
        bad = [k for k in r['sd'] if not torch.equal(o['sd'][k], r['sd'][k])]
        if bad: return (f"rank {i}: {bad[:5]} differ, "
                        f"largest {max((o['sd'][k].float()-r['sd'][k].float()).abs().max().item() for k in bad):.3g}")

def _same(rs, ref, timed=False):
    d = _diff(rs, ref, timed)
    assert d is None, d

def _stopped(rs, code, ck, where, ext='pth'):
    ("The first run stopped with `code` (None: any but 0, as torchrun's), its checkpoint (`ext`: 'dcp' sharded) written mid-epoch "
     "`where` ('F.E': fit F, epoch E)")
    assert (rs.rc!=0 if code is None else rs.rc==code), rs.out[-3000:]
    m = re.search(r"every rank stopped at epoch (\d+), step (\d+)", rs.out)
    assert m and int(m[2])>0, rs.out[-3000:] # mid-epoch
    f,e = map(int, where.split('.'))
    assert m[1]==str(e) and (ck/f"ckpt_{f'f{f:02d}_' if f else ''}e{e:04d}_s{int(m[2]):06d}.{ext}").exists(), rs.out[-3000:]
    return int(m[2])

def _resumed(rs):
    assert "fastddp: resuming from" in rs.out, rs.out[-3000:]
    assert not re.search(r"(^|\s)0\s+00:00", rs.out), rs.out[-3000:] # no empty row for an epoch done before the restart
    assert "the items this run trains on differ" not in rs.out, rs.out[-3000:] # the scripts' seeded splits: the same items

def test_tabular(tmp_path, marker):
    ("tabular_ddp.py (fastai's tabular loader draws each epoch's order from np.random): SIGTERM to fastddp-launch mid-epoch; the same "
     "command under --max-restarts 1 resumes, and rank 1 is SIGKILLed after the last epoch's checkpoint: the restart resumes at the "
     "fit's end, trains nothing, and ends bit-equal. With --accum 4 the epochs end inside DDP's no_sync, after which DDP gives no "
     "rank rank 0's BatchNorm statistics: fastddp does before each validation, so the run's metrics are its exported model's")
    # 10 steps an epoch; with --accum 4 the fit ends 2 micro-batches after its last optimizer step
    args = ['--synthetic', '400', '--bs', '16', '--epochs', '3', '--accum', '4', marker]
    ref = _run(tmp_path/'ref', 'tabular', args+['--out', tmp_path/'out'])
    check_run('tabular', 2, ref, tmp_path/'out', tmp_path/'data') # what tests/test_scripts.py checks of a run, under fastddp-launch
    rs = _run(tmp_path/'a', 'tabular', args, env=dict(AT='0.1.3', SIG='SIGTERM'), check=False)
    it = _stopped(rs, PREEMPTED, tmp_path/'a'/'tabular', '0.1')
    assert not wait_gone(marker, 10)
    again = _run(tmp_path/'a', 'tabular', args, largs=['--max-restarts', '1'], env=dict(KILL='0.2'))
    _same(again, ref); _resumed(again)
    # first from the mid-epoch checkpoint, then, after the kill, from the one at the last epoch's end
    m = re.findall(r"resuming from \S+ckpt_(e\d+_s\d+)\.pth", again.out)
    assert m==[f'e0001_s{it:06d}', 'e0003_s000000'], (m, again.out[-3000:])
    assert not wait_gone(marker, 10)

def test_pets(tmp_path, marker):
    ("pets_ddp.py (generated images, a random crop drawn in a DataLoader worker, dropout, fine_tune's two fits, --accum 2, torchvision "
     "weights read from the cache with no network, rank 0 first): SIGUSR1 to `python -m fastai.launch` mid-epoch in the second fit; "
     "the same command skips the first fit, resumes, and ends bit-equal")
    args = ['--synthetic', '148', '--size', '32', '--bs', '6', '--arch', 'resnet18', '--weights', 'IMAGENET1K_V1', '--workers', '1',
            '--accum', '2', marker] # 10 steps an epoch: 5 optimizer steps
    env = dict(TORCH_HOME=str(pretrained(tmp_path/'th')))
    ref = _run(tmp_path/'ref', 'pets', args+['--out', tmp_path/'out'], launcher='fastai', env=env)
    check_run('pets', 2, ref, tmp_path/'out', tmp_path/'data') # what tests/test_scripts.py checks of a run, under fastai.launch
    from fastai.learner import load_learner
    import fastai.vision.all
    w = load_learner(tmp_path/'out'/'export.pkl').model[0][0].weight
    assert (w-0.5).abs().max()<0.05, (w-0.5).abs().max() # the cached file's first layer, barely moved by fine_tune
    rs = _run(tmp_path/'a', 'pets', args, launcher='fastai', env=dict(AT='1.0.1', SIG='SIGUSR1', **env), check=False)
    assert _stopped(rs, PREEMPTED, tmp_path/'a'/'pets', '1.0')%2==0 # at an optimizer step
    again = _run(tmp_path/'a', 'pets', args, launcher='fastai', env=env)
    _same(again, ref); _resumed(again)
    assert "fastddp: resuming: fit 1 was done before the restart" in again.out, again.out[-3000:]
    assert not wait_gone(marker, 10)

def test_imdb(tmp_path, marker):
    ("imdb_ddp.py (IMDB sample, generated: fastai's SortedDL shuffles with np.random; AWD-LSTM's dropouts) with --time-cost: a DDP run, "
     "and a sharded one (--shard) stopped by SIGTERM to torchrun mid-epoch in the first (frozen) fit; the same command resumes there "
     "from the shards and ends bit-equal to the DDP run")
    # --time-cost in every run: its `Throughput` times the AWD-LSTM's share of the forward on a copy, which a plain `deepcopy` refused
    # (fastai's `WeightDropout`); it adds a samples/s column, a timing, to the recorder's rows: `_same` compares them less that column
    args = ['--sample', '--synthetic', '100', '--bs', '8', '--no-pretrained', '--time-cost', marker]
    # embeddings of 128, LSTMs of 512 (fastai's: 400, 1152): two of the LSTMs still hold over a million parameters, a shard unit's
    # least, so that without the rule below they would be units inside the encoder
    run = lambda d, *a, env={}, **kw: _run(tmp_path/d, 'imdb', *a, launcher='torchrun', env={'AWD': '128,512', **env}, **kw)
    ref = run('ref', args+['--out', tmp_path/'out'])
    check_run('imdb', 2, ref, tmp_path/'out', tmp_path/'data') # what tests/test_scripts.py checks of a run, under torchrun
    assert ref.out.count("MFU unknown (LSTM: no FLOP count")==2, ref.out[-3000:] # the report of each of fine_tune's fits
    # --shard (FSDP2) ends where DDP does, bit for bit at 2 ranks: fastai's SentenceEncoder runs the AWD-LSTM once per bptt chunk,
    # a different number of times on each rank, so it is sharded whole (inner units' all-gathers would not match: it crashed).
    # Stopped and resumed, it ends there too: one run checks the shards' resume and the sharded numbers
    # (the time cost's report crashed on a sharded LSTM: no copy to time its share of the forward on)
    sh = args+['--shard']
    rs = run('a', sh, env=dict(AT='0.0.1', SIG='SIGTERM'), check=False)
    assert "fastddp: sharded over 2 ranks in 2 units" in rs.out, rs.out[-3000:]
    _stopped(rs, None, tmp_path/'a'/'imdb', '0.0', ext='dcp')
    again = run('a', sh)
    _resumed(again)
    assert again.out.count("MFU unknown (a sharded model: its FLOPs are not counted)")==2, again.out[-3000:] # each fit's report
    # (the runs differed twice in whole suites: a run that found no CPU peak in the cache shared by the suite's processes measured it
    # with torch's generator inside its first fit, and its dropout masks moved; the probe has a generator of its own now, tested in
    # tests/test_throughput.py)
    _same(again, ref, True)
    assert not wait_gone(marker, 10)

def test_imdb_lm(tmp_path, marker):
    ("imdb_ddp.py --lm-epochs 1 (ULMFiT: the language model fine-tuned on every review, unlabelled too, then the classifier from its "
     "encoder; fastddp.lm splits the LMDataLoader's rows): SIGTERM to fastddp-launch mid-epoch in the language model's second fit; "
     "the same command under --max-restarts 1 resumes there, and rank 1 is SIGKILLed after the first epoch of the classifier's "
     "second fit: the restart "
     "finds the language model done (its weights from its checkpoint, the encoder saved again), resumes the classifier, and ends "
     "bit-equal to an uninterrupted run")
    args = ['--synthetic', '40', '--bs', '4', '--no-pretrained', '--lm-epochs', '1', '--epochs', '2', marker]
    run = lambda d, *a, env={}, **kw: _run(tmp_path/d, 'imdb', *a, env={'AWD': '32,64', **env}, **kw)
    ref = run('ref', args)
    assert "accuracy  perplexity" in ref.out, ref.out[-3000:] # the language model's table
    rs = run('a', args, env=dict(AT='1.0.2', SIG='SIGTERM'), check=False)
    _stopped(rs, PREEMPTED, tmp_path/'a'/'imdb'/'lm', '1.0')
    assert not wait_gone(marker, 10)
    again = run('a', args, largs=['--max-restarts', '1'], env=dict(KILL='3.0')) # fits 0 and 1: the language model's
    _same(again, ref); _resumed(again)
    m = re.findall(r"resuming from \S+/(imdb/(?:lm/)?ckpt_\S+)\.pth", again.out)
    assert m[0].startswith('imdb/lm/ckpt_f01_e0000_s') and m[1:]==['imdb/lm/ckpt_f01_e0001_s000000', 'imdb/ckpt_f01_e0001_s000000'], (m,
        again.out[-3000:])
    assert not wait_gone(marker, 10)
