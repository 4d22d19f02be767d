"IMDB (text): ULMFiT data-parallel (with --lm-epochs, the AWD-LSTM language model fine-tuned first), the same script under every launcher"
import time
import fastddp
from fastai.text.all import *
from fastai.distributed import *
from fastai.text.learner import _model_meta
from fastddp.core import *
from fastddp.distrib import rank0_first # fastddp's: the others wait for rank 0 up to FASTDDP_FIRST_TIMEOUT, and share its error
from fastddp.script import script_flags, positive, get_data, train_cbs, run_ctx, finish, run_main, ScriptError, offline_errors

def _wt103():
    "Fetch the AWD-LSTM's pretrained weights as fastai's learners do (`untar_data`: a no-op once ~/.fastai/models has them)"
    try: return untar_data(_model_meta[AWD_LSTM]['url'], c_key='model')
    # only the download failing means "no weights": any other error (fastai's folder cannot be made) shows as it is
    except offline_errors as e: raise ScriptError(f"no pretrained WT103 weights (could not download them: {type(e).__name__}: {e}): "
                                                  "they download into ~/.fastai/models once online; or pass --no-pretrained") from e

def _train(make, train, o):
    "Make a learner with `make` and train it with `train` in the flags' context: `(learner, seconds trained)`"
    learn = make()
    # Every trainable parameter gets a gradient in each step, frozen or not (a frozen one is left out of DDP's buckets, as DDP
    # wraps the model again for each fit): no `find_unused_parameters`, whose graph walk each step would only cost time
    t0 = time.time()
    with run_ctx(learn, o.dp, o.fp16, o.shard, o.shard_grads, comm_hook=o.comm_hook): train(learn)
    return learn,time.time()-t0

@call_parse
@delegates(script_flags)
def main(data:str=None, # `imdb_sample` (with --sample) or `imdb` folder in fastai's layout (default: download)
         sample:bool=False, # the 1,000-review `texts.csv` instead of the full `imdb/` folder
         synthetic:int=0, # train on this many generated reviews in the real layout instead (offline)
         pretrained:bool=True, # with --no-pretrained, start from random weights instead of WT103
         epochs:int=1, # epochs after the frozen one (fine_tune)
         bs:int=32, # batch size per process
         lr:float=2e-2, # the single-process learning rate
         lm_epochs:int=0, # first fine-tune the language model on every review (unlabelled too) for this many epochs after a frozen one
         lm_lr:float=1e-2, # the language model's single-process learning rate
         **kwargs): # the common flags (`fastddp.script.script_flags`)
    "Fine-tune an AWD-LSTM classifier on movie reviews (with --lm-epochs, its language model first); rank 0 tokenises first"
    def _run():
        o = script_flags(**kwargs) # checked here: bad input is one line
        positive(epochs=epochs, bs=bs)
        if lm_epochs<0: raise ScriptError(f"--lm-epochs {lm_epochs}: expected 0 (no language model stage) or more")
        set_seed(o.seed)
        kind = 'imdb_sample' if sample else 'imdb'
        path = get_data(kind, data, synthetic)
        if pretrained: rank0_first(_wt103) # rank 0 downloads them, the others find them cached (or share rank 0's error)
        vocab = None
        if lm_epochs: # ULMFiT's second step: the language model learns these reviews' words; the classifier starts from its encoder
            def _lm_dls(): # every review, labelled or not, 10% kept to validate the language model
                if sample: return TextDataLoaders.from_csv(path, 'texts.csv', text_col='text', is_lm=True, valid_pct=0.1, bs=bs,
                                                           seed=o.seed, num_workers=n_workers())
                return TextDataLoaders.from_folder(path, is_lm=True, valid_pct=0.1, bs=bs, seed=o.seed, num_workers=n_workers())
            dls_lm = rank0_first(_lm_dls)
            ck = Path(o.checkpoint)/'lm' if o.checkpoint else None # its own folder: the classifier's fits are other fits
            cbs = train_cbs(o.scale_lr, o.accum, ck, o.resume, o.time_cost, None, o.forecast)
            make = lambda: language_model_learner(dls_lm, AWD_LSTM, pretrained=pretrained, drop_mult=0.3, metrics=[accuracy, Perplexity()],
                                                  cbs=cbs)
            lm,_ = _train(make, lambda l: l.fine_tune(lm_epochs, lm_lr), o)
            rank0_first(lambda: lm.save_encoder('finetuned')) # rank 0 writes it (fastai's saves are rank 0's); the others wait for it
            vocab = dls_lm.vocab
        def _dls(): # tokenised once by rank 0 (fastai caches it next to the data), then read by the others
            if sample: return TextDataLoaders.from_csv(path, 'texts.csv', text_col='text', label_col='label', valid_col='is_valid',
                                                       bs=bs, seed=o.seed, num_workers=n_workers(), text_vocab=vocab)
            return TextDataLoaders.from_folder(path, valid='test', bs=bs, seed=o.seed, num_workers=n_workers(), text_vocab=vocab)
        dls = rank0_first(_dls)
        def _clas():
            learn = text_classifier_learner(dls, AWD_LSTM, pretrained=pretrained, drop_mult=0.5, metrics=accuracy,
                                            cbs=train_cbs(o.scale_lr, o.accum, o.checkpoint, o.resume, o.time_cost, o.out, o.forecast))
            return learn.load_encoder('finetuned') if lm_epochs else learn
        learn,secs = _train(_clas, lambda l: l.fine_tune(epochs, lr), o)
        finish(learn, 'imdb', epochs, secs, len(dls.train_ds), o.out)
    run_main(_run)

