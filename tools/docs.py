"""Build the documentation site into `_docs/` (`make docs`).

With Quarto installed this is `nbdev-docs`. Without it (no network, so no Quarto) the same pages are made offline:
nbdev processes the notebooks into `_proc/` exactly as for Quarto (show_doc cells added and run, exported code hidden,
symbols linked), and nbconvert renders each one to HTML inside a page with the sidebar of `nbs/sidebar.yml`.
We call nbdev's Python functions, never `nbdev-proc-nbs`: that command downloads and sudo-installs Quarto when it is missing.
`FASTDDP_DOCS_OFFLINE=1` takes the offline path even where Quarto is installed (tests/test_docs.py does)."""
import os, re, sys, html, shutil, subprocess
from pathlib import Path, PurePosixPath

def _quarto_docs():
    "Build with Quarto through nbdev's own command"
    return subprocess.call([str(Path(sys.executable).parent/'nbdev-docs')])

# ---------- the pages and the sidebar ----------
def sidebar_items(nbs):
    "The entries of `nbs/sidebar.yml`: `('page', path)` and `('section', title, [entries])`"
    import yaml
    def _walk(cs):
        res = []
        for o in cs:
            if isinstance(o, str): res.append(('page', o))
            elif 'section' in o: res.append(('section', o['section'], _walk(o.get('contents', []))))
            elif 'href' in o: res.append(('page', o['href']))
        return res
    d = yaml.safe_load((nbs/'sidebar.yml').read_text())
    return _walk(d['website']['sidebar']['contents'])

def pages(items):
    "Every page path in sidebar order"
    return [p for o in items for p in ([o[1]] if o[0]=='page' else pages(o[2]))]

# ---------- turning a processed notebook into a page ----------
_re_dir = re.compile(r'^\s*#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')

def _directives(src):
    "`#| key: value` lines at the top of a code cell, and the source without them"
    lines,d = src.splitlines(),{}
    while lines and (m := _re_dir.match(lines[0])): d[m[1]] = m[2].lower(); lines.pop(0)
    return d, '\n'.join(lines)

def _frontmatter(nb):
    "The YAML front matter nbdev puts in the first (raw) cell, removed from `nb`"
    import yaml
    c = nb.cells[0] if nb.cells else None
    if c is None or c.cell_type!='raw' or not c.source.strip().startswith('---'): return {}
    nb.cells.pop(0)
    return yaml.safe_load(c.source.strip().strip('-')) or {}

# Pandoc attributes (`[source](url){target="_blank" ...}`) that show_doc writes for Quarto
_re_src = re.compile(r'\[source\]\(([^)\s]+)\)\{[^}]*\}')
_re_attrs = re.compile(r'(\]\([^)\s]+\))\{[^}]*\}')
def _md(s): return _re_attrs.sub(r'\1', _re_src.sub(r'<a class="source-link" href="\1">source</a>', s))

def clean_nb(nb):
    "Apply the Quarto cell options nbdev uses (`echo`, `output`, `include`), drop empty cells, fix Pandoc-only markdown"
    import nbformat
    cells = []
    for c in nb.cells:
        if c.cell_type=='code':
            d,src = _directives(c.source)
            if d.get('include')=='false' or (not src.strip() and not c.get('outputs')): continue
            outs = [] if d.get('output')=='false' else c.outputs
            for o in outs:
                if 'text/markdown' in o.get('data', {}): o.data['text/markdown'] = _md(o.data['text/markdown'])
            c = nbformat.v4.new_code_cell(src, outputs=outs,
                                          metadata={'transient': {'remove_source': True}} if d.get('echo')=='false' else {})
        elif c.cell_type=='markdown':
            if not c.source.strip() or c.source.strip().startswith('<!-- WARNING'): continue
            c = nbformat.v4.new_markdown_cell(_md(c.source))
        else: continue
        cells.append(c)
    nb.cells = cells
    return nb

def html_name(p):
    "Where Quarto puts the page of notebook `p` (nbdev drops the number prefix): `tutorials/01_x.ipynb` -> `tutorials/x.html`"
    from nbdev.doclinks import nbpath2html
    return str(PurePosixPath(p).parent/nbpath2html(Path(PurePosixPath(p).name)).name).lstrip('./') or 'index.html'

def _rel(target, page):
    "Link from the page at `page` to the site path `target` (both relative to the site root)"
    return os.path.relpath(target, str(PurePosixPath(page).parent) or '.').replace(os.sep, '/')

_re_href = re.compile(r'(href|src)="([^"]*)"')
_re_hid = re.compile(r'(<h[1-6][^>]*\bid=")([^"]+)(")')

def fix_links(body, page, src_dir, doc_url):
    "Links to the published site and to notebooks become relative links to the pages here; ids match Quarto's (lower case)"
    def _href(m):
        attr,u = m[1],html.unescape(m[2])
        path,_,frag = u.partition('#')
        frag = ('#'+frag.lower()) if frag else ''
        if doc_url and path.startswith(doc_url): path = _rel(path[len(doc_url):] or 'index.html', page)
        elif re.match(r'^[a-z][a-z0-9+.-]*:', path): return m[0] # another site
        elif path.endswith(('.ipynb', '.qmd', '.md')):
            tgt = os.path.normpath(os.path.join(src_dir, path)).replace(os.sep, '/')
            path = _rel(html_name(tgt), page)
        elif not path and frag: pass
        else: return m[0]
        return f'{attr}="{html.escape(path+frag)}"'
    body = _re_href.sub(_href, body)
    return _re_hid.sub(lambda m: m[1]+m[2].lower()+m[3], body)

# ---------- the HTML around a page ----------
def nav_html(items, titles, page):
    "The sidebar: every page, the current one marked"
    def _ul(its):
        res = []
        for o in its:
            if o[0]=='page':
                h = html_name(o[1])
                if h not in titles: continue
                cls = ' class="active" aria-current="page"' if h==page else ''
                res.append(f'<li><a href="{_rel(h, page)}"{cls}>{html.escape(titles[h])}</a></li>')
            else: res.append(f'<li class="section"><span>{html.escape(o[1])}</span>{_ul(o[2])}</li>')
        return '<ul>'+''.join(res)+'</ul>'
    return _ul(items)

_re_h2 = re.compile(r'<h2[^>]*\bid="([^"]+)"[^>]*>(.*?)</h2>', re.S)
def toc_html(body):
    "'On this page': the level-2 headings"
    hs = [(i, re.sub(r'<a class="anchor-link".*?</a>|<[^>]+>', '', t).strip()) for i,t in _re_h2.findall(body)]
    if len(hs)<2: return ''
    return '<nav class="toc"><h2>On this page</h2><ul>'+''.join(f'<li><a href="#{i}">{t}</a></li>' for i,t in hs)+'</ul></nav>'

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} – {site}</title>
<meta name="description" content="{desc_attr}">
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{root}styles.css">
</head>
<body>
<header class="navbar"><a class="brand" href="{root}index.html">{site}</a><span class="tagline">{site_desc}</span></header>
<div class="layout">
<nav class="sidebar" aria-label="Pages">{nav}</nav>
<main class="content">
<header class="page-title"><h1 class="title">{title}</h1>{desc}</header>
{body}
</main>
{toc}
</div>
<footer class="footer">Built from the notebooks in <code>nbs/</code> by <code>make docs</code> (nbdev + nbconvert).</footer>
</body>
</html>
"""

CSS = """
:root { --fg:#212529; --muted:#6c757d; --line:#dee2e6; --accent:#2780e3; --code:#f6f8fa; }
* { box-sizing: border-box; }
body { margin:0; font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color:var(--fg); line-height:1.5; }
a { color: var(--accent); text-decoration: none; } a:hover { text-decoration: underline; }
.navbar { background: var(--accent); color: #fff; padding: .6rem 1.2rem; display:flex; gap:1rem; align-items:baseline; }
.navbar .brand { color:#fff; font-weight:600; font-size:1.2rem; }
.navbar .tagline { opacity:.85; font-size:.9rem; white-space:nowrap; overflow:hidden; text-overflow:ellipsis; }
.layout { display:flex; align-items:flex-start; max-width: 1500px; margin: 0 auto; }
.sidebar { flex: 0 0 250px; position: sticky; top: 0; max-height: 100vh; overflow-y: auto; padding: 1rem; \
border-right: 1px solid var(--line); font-size: .92rem; }
.sidebar ul { list-style: none; margin: 0; padding-left: 0; } .sidebar ul ul { padding-left: .8rem; }
.sidebar li { margin: .15rem 0; } .sidebar li.section > span { display:block; margin-top:.8rem; font-weight:600; color:var(--muted); \
text-transform:uppercase; font-size:.78rem; letter-spacing:.04em; }
.sidebar a { color: var(--fg); } .sidebar a.active { color: var(--accent); font-weight: 600; }
.content { flex: 1 1 auto; min-width: 0; padding: 1rem 2rem 3rem; }
.toc { flex: 0 0 210px; position: sticky; top: 0; padding: 1rem; font-size: .85rem; }
.toc h2 { font-size: .85rem; margin: 0 0 .4rem; } .toc ul { list-style:none; padding:0; margin:0; } .toc li { margin:.2rem 0; }
.page-title .title { margin-bottom: .3rem; } .page-title .description { color: var(--muted); font-size: 1.1rem; margin-top: 0; }
h2 { border-bottom: 1px solid var(--line); padding-bottom: .2rem; margin-top: 2rem; }
h1 code, h2 code, h3 code { background: none; padding: 0; font-size: .95em; }
.anchor-link { visibility: hidden; margin-left: .3rem; } \
h1:hover .anchor-link, h2:hover .anchor-link, h3:hover .anchor-link { visibility: visible; }
table { border-collapse: collapse; margin: 1rem 0; font-size: .92rem; } \
th, td { border: 1px solid var(--line); padding: .3rem .6rem; text-align: left; vertical-align: top; }
th { background: var(--code); }
code { background: var(--code); padding: .05rem .25rem; border-radius: 3px; font-size: .9em; }
pre { background: var(--code); padding: .7rem .9rem; border-radius: 4px; overflow-x: auto; font-size: .86rem; line-height: 1.4; }
pre code { background: none; padding: 0; }
.cell { margin: .6rem 0; } .input_area, .output_area { overflow-x: auto; }
.output_area pre { background: #fff; border: 1px solid var(--line); } .output_stderr pre { background: #fff5f5; }
.output_markdown, .output_html { padding: 0; }
.prompt { display: none; }
.source-link { float: right; font-size: smaller; }
hr { border: 0; border-top: 1px solid var(--line); margin: 1.5rem 0 .5rem; }
blockquote { margin: 0; padding: 0 1rem; border-left: 3px solid var(--line); color: var(--muted); }
.footer { border-top: 1px solid var(--line); color: var(--muted); font-size: .8rem; padding: .8rem 1.2rem; text-align: center; }
@media (max-width: 900px) { .layout { display: block; } \
.sidebar { position: static; max-height: none; border-right: 0; border-bottom: 1px solid var(--line); } .toc { display:none; } }
"""

def _inline(s):
    "Escaped text with its `code` spans, as Quarto shows a description"
    return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(s))

def _offline_docs(n_workers=None):
    "Process the notebooks with nbdev and render them with nbconvert: no Quarto, no network"
    import nbformat, yaml
    from nbconvert import HTMLExporter
    from pygments.formatters import HtmlFormatter
    from nbdev.config import get_config
    from nbdev.quarto import refresh_quarto_yml
    from nbdev.serve import proc_nbs
    cfg = get_config()
    os.chdir(cfg.config_path)
    nbs,out = cfg.nbs_path,cfg.doc_path
    refresh_quarto_yml() # nbs/nbdev.yml from pyproject.toml, as `nbdev-docs` does (it writes only when it differs)
    proc = proc_nbs(nbs, n_workers=os.cpu_count() if n_workers is None else n_workers)
    items = sidebar_items(nbs)
    srcs = pages(items)
    gone = [p for p in srcs if not (proc/p).exists()]
    if gone: sys.exit(f"docs: nbs/sidebar.yml names {', '.join(gone)}, which nbs/ does not have: fix the sidebar")
    listed = set(srcs)
    for f in sorted(proc.rglob('*.ipynb')):
        p = f.relative_to(proc).as_posix()
        if p not in listed:
            print(f"docs: {p} is not in nbs/sidebar.yml: built, but only the index reaches it", file=sys.stderr); srcs.append(p)
    site = yaml.safe_load((nbs/'nbdev.yml').read_text()).get('website', {})
    doc_url = (cfg.get('doc_host', '')+cfg.get('doc_baseurl', '')).rstrip('/')+'/' if cfg.get('doc_host') else None
    exp = HTMLExporter(template_name='basic', exclude_input_prompt=True, exclude_output_prompt=True)
    nbs_ = {}
    for p in srcs:
        nb = nbformat.read(proc/p, as_version=4)
        fm = _frontmatter(nb)
        page = (str(PurePosixPath(p).parent/fm['output-file']).lstrip('./') if fm.get('output-file') else html_name(p))
        nbs_[p] = (page, fm, clean_nb(nb))
    titles = {page: fm.get('title', page) for page,fm,_ in nbs_.values()}
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out/'styles.css').write_text(CSS+HtmlFormatter().get_style_defs('.highlight'))
    for p,(page,fm,nb) in nbs_.items():
        body,_ = exp.from_notebook_node(nb)
        body = fix_links(body, page, str(PurePosixPath(p).parent), doc_url)
        desc = fm.get('description', '')
        root = _rel('.', page)+'/' if '/' in page else ''
        (out/page).parent.mkdir(parents=True, exist_ok=True)
        (out/page).write_text(PAGE.format(title=html.escape(str(fm.get('title', page))), site=html.escape(site.get('title', 'docs')),
            site_desc=html.escape(site.get('description', '')), desc_attr=html.escape(desc),
            desc=f'<p class="description">{_inline(desc)}</p>' if desc else '', root=root,
            nav=nav_html(items, titles, page), toc=toc_html(body), body=body))
    for f in nbs.rglob('*'): # images and other files the notebooks refer to
        rel = f.relative_to(nbs)
        if (f.is_file() and f.suffix.lower() in ('.png','.jpg','.jpeg','.gif','.svg')
            and not any(o.startswith(('_','.')) for o in rel.parts)):
            (out/rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(f, out/rel)
    print(f"docs: {len(nbs_)} pages in {out} (offline build: nbdev + nbconvert)")
    return out

def main():
    if shutil.which('quarto') and not os.environ.get('FASTDDP_DOCS_OFFLINE'): sys.exit(_quarto_docs())
    _offline_docs()

if __name__=='__main__': main()
