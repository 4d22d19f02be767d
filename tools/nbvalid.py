"""Check that every tracked notebook under `nbs/` is a valid notebook for nbformat (the schema Jupyter and nbconvert read).

A cell whose `id` is not a string (a null one, written by a script that edited the JSON) makes Jupyter warn and rewrite the file when
it opens it, and nbformat's validation fail; `nbdev-clean` leaves it. Prints `path: what is wrong (at cells/K/key)` for each notebook
that fails and exits 1 if any does. `make check` runs it.
Usage: `python tools/nbvalid.py [NOTEBOOK ...]` (no argument: the tracked notebooks)"""
import sys
from pathlib import Path
import nbformat

ROOT = Path(__file__).resolve().parents[1]

def invalid(paths): # notebook files
    "`path: the first error` for each notebook in `paths` that nbformat finds invalid"
    res = []
    for p in paths:
        try: nbformat.validate(nbformat.read(p, as_version=4))
        except nbformat.ValidationError as e: res.append(f"{Path(p).relative_to(ROOT) if Path(p).is_relative_to(ROOT) else p}: "
                                                         f"{e.message} (at {'/'.join(map(str, e.absolute_path))})")
    return res

if __name__=='__main__':
    from lines import tracked # tools/lines.py's list of the files git tracks (this folder is on the path of a script run from it)
    ps = sys.argv[1:] or [ROOT/p for p in tracked('nbs/*.ipynb')]
    bad = invalid(ps)
    for o in bad: print(o)
    if bad: sys.exit(f"nbvalid: {len(bad)} notebook(s) that nbformat finds invalid")
