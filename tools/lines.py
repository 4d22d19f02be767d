"""Check that no line is longer than 140 characters (fastai style): tracked `.py` files and the code cells of `nbs/**/*.ipynb`.

Prints `path:line: N characters` for a module and `path cell K line L: N characters` for a notebook (both 1-based), exits 1 if
any line is too long. Generated files are left out (`SKIP`). `make check` runs it.
Usage: `python tools/lines.py`"""
import sys, json, subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX = 140
# generated: by tools/bench_page.py, and by nbdev-export (its symbol index: a line per name and URL, however long)
SKIP = {'nbs/benchmarks.ipynb', 'fastddp/_modidx.py'}

def tracked(*pats):
    "The files git tracks that match `pats`, relative to the repository's root"
    return subprocess.run(['git', 'ls-files', *pats], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()

def long_lines(s:str, # text of a file or of a cell
               n:int=MAX): # the longest line allowed
    "(line number, length) of each line of `s` longer than `n` characters"
    ls = [l.removesuffix('\r') for l in s.split('\n')] # the lines git and Python see (`splitlines` also breaks at \f and \x1c)
    return [(i,len(l)) for i,l in enumerate(ls, 1) if len(l)>n]

def offenders(n:int=MAX): # the longest line allowed
    "A line of text for each line longer than `n` in tracked modules and notebooks' code cells"
    # a module's first line is nbdev's docstring from its notebook's `> summary`: prose, written in markdown, not code
    res = [f"{p}:{i}: {k} characters" for p in tracked('*.py') if p not in SKIP
           for i,k in long_lines((ROOT/p).read_text(encoding='utf-8'), n) if not (p.startswith('fastddp/') and i==1)]
    for p in tracked('nbs/*.ipynb'):
        if p in SKIP: continue
        for c,cell in enumerate(json.loads((ROOT/p).read_text(encoding='utf-8'))['cells'], 1):
            if cell['cell_type']!='code': continue
            src = cell['source'] if isinstance(cell['source'], str) else ''.join(cell['source'])
            res += [f"{p} cell {c} line {i}: {k} characters" for i,k in long_lines(src, n)]
    return res

if __name__=='__main__':
    bad = offenders()
    for o in bad: print(o)
    if bad: sys.exit(f"lines: {len(bad)} line(s) longer than {MAX} characters")
