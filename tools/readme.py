"""Write `README.md` from `nbs/index.ipynb`: one source for the front page, as nbdev projects have.

`nbdev-readme` does this with Quarto, which cannot be installed on a machine without internet; here the index's markdown
cells are joined and its links to pages of the site become absolute links to the docs. `make check` runs it with `--check`.
Usage: `python tools/readme.py [--check]`"""
import re, sys, json, tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX,README = ROOT/'nbs'/'index.ipynb',ROOT/'README.md'
HEAD = "<!-- generated from nbs/index.ipynb by tools/readme.py: edit the notebook, then run `python tools/readme.py` -->\n"

def doc_url():
    "The docs site, from pyproject's `[project.urls] Documentation`"
    return tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['urls']['Documentation'].rstrip('/')+'/'

_link = re.compile(r'\]\((?!https?:|#|mailto:)([^)\s#]+?)(\.ipynb|\.html)(#[^)\s]*)?\)')

def page(p):
    "The page of the site for a notebook or page path: `tutorials/01_x.ipynb` -> `tutorials/x.html` (nbdev drops number prefixes)"
    d,_,f = p.rpartition('/')
    f = re.sub(r'^\d+[a-z]?_', '', f)
    return (d+'/' if d else '')+f+'.html'

def readme(nb=INDEX):
    "The README's text: the index's markdown cells, with links to the site made absolute"
    cells = json.loads(Path(nb).read_text())['cells']
    md = '\n\n'.join(''.join(c['source']).strip() for c in cells if c['cell_type']=='markdown' and ''.join(c['source']).strip())
    url = doc_url()
    return HEAD+_link.sub(lambda m: f"]({url}{page(m[1])}{m[3] or ''})", md)+'\n'

def main(args=()):
    s = readme()
    if '--check' in args:
        if README.read_text()!=s:
            sys.exit("README.md does not match nbs/index.ipynb: run `python tools/readme.py` (edit the notebook, not the README)")
        return
    README.write_text(s)
    print(f"{README}: written from {INDEX}")

if __name__=='__main__': main(sys.argv[1:])
