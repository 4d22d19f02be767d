"""Loaded by every Python process the suite starts (tests/conftest.py puts this folder on PYTHONPATH): the ranks, the launchers, the
notebooks' kernels, the scripts. As one ends normally (not one killed by a signal), its objects go to the garbage collector's permanent
generation after every `atexit` function has run, so CPython's shutdown does not trace them again in its last collections: 1.3 s of CPU
less for each process that imported fastai and fastddp (5.3 s -> 4.0 s of wall time, `python -c "import fastddp.distrib"`, 2-core AMD
EPYC); about 550 processes a run end that way, and `pytest -n 2` took 1185 s where it had taken 1360 and 1375 s. What a process does
before it exits is unchanged: the `atexit` functions (multiprocessing stopping its workers, `weakref.finalize`, torch's and the
loggers' own) run first; and no check depends on an object that only CPython's last collection would finalize (no fastddp file or
process is left to one: checkpoints are renamed into place, workers stopped). Registered first, so it runs last"""
import atexit, gc
atexit.register(gc.freeze)
