"The documentation site: built offline by `make docs`'s builder, served on localhost, and opened in headless Chromium"
import os, re, sys, json, shutil, socket, struct, subprocess, time, importlib, importlib.util
from pathlib import Path
from urllib.parse import urldefrag
import pytest, yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS,NBS = ROOT/'_docs',ROOT/'nbs'
# without the background-networking flags Chromium keeps trying to reach Google's hosts, which this closed network refuses
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync', '--window-size=1400,1000']

def notebooks():
    "Every notebook that becomes a page, relative to `nbs/`"
    return sorted(p.relative_to(NBS).as_posix() for p in NBS.rglob('*.ipynb')
                  if not any(o.startswith(('_','.')) for o in p.relative_to(NBS).parts))

def sidebar_pages():
    def _walk(cs): return [p for o in cs for p in ([o] if isinstance(o, str) else _walk(o.get('contents', [])))]
    return _walk(yaml.safe_load((NBS/'sidebar.yml').read_text())['website']['sidebar']['contents'])

def test_quarto_config():
    "`_quarto.yml`, `nbdev.yml` and `sidebar.yml` are what `nbdev-docs` needs, and the sidebar lists every notebook"
    q = yaml.safe_load((NBS/'_quarto.yml').read_text())
    assert q['project']['type']=='website' and q['metadata-files']==['nbdev.yml', 'sidebar.yml']
    assert yaml.safe_load((NBS/'nbdev.yml').read_text())['project']['output-dir']=='_docs'
    missing = set(notebooks())-set(sidebar_pages())
    assert not missing, f"add {sorted(missing)} to nbs/sidebar.yml (custom_sidebar = true: Quarto shows only what it lists)"
    stale = set(sidebar_pages())-set(notebooks())
    assert not stale, f"nbs/sidebar.yml names {sorted(stale)}, which nbs/ does not have"

def test_notebooks_valid(tmp_path):
    "Every notebook is one nbformat (Jupyter, nbconvert) reads without complaint; `tools/nbvalid.py` (`make check`) finds one that is not"
    spec = importlib.util.spec_from_file_location('nbvalid', ROOT/'tools'/'nbvalid.py')
    nv = importlib.util.module_from_spec(spec); spec.loader.exec_module(nv)
    assert nv.invalid([NBS/p for p in notebooks()])==[]
    nb = json.loads((NBS/'00_init.ipynb').read_text())
    nb['cells'][1]['id'] = None # as a script that edits the JSON may leave a new cell
    (tmp_path/'bad.ipynb').write_text(json.dumps(nb))
    assert nv.invalid([tmp_path/'bad.ipynb'])==[f"{tmp_path/'bad.ipynb'}: None is not of type 'string' (at cells/1/id)"]

BUILD = {} # what the `site` fixture's build printed

def _free_port():
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

@pytest.fixture(scope='module')
def site():
    "Build `_docs/` as `make docs` does without Quarto, and serve it on a free local port"
    t = time.time()
    p = subprocess.run([sys.executable, 'tools/docs.py'], cwd=ROOT, env={**os.environ, 'FASTDDP_DOCS_OFFLINE': '1'},
                       capture_output=True, text=True, timeout=600)
    assert p.returncode==0, p.stdout[-2000:]+p.stderr[-4000:]
    print(f"docs built in {time.time()-t:.1f} s")
    BUILD['log'] = p.stdout+p.stderr
    port = _free_port()
    srv = subprocess.Popen([sys.executable, '-m', 'http.server', str(port), '--bind', '127.0.0.1', '--directory', str(DOCS)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try: socket.create_connection(('127.0.0.1', port), timeout=1).close(); break
            except OSError: time.sleep(0.1)
        yield f'http://127.0.0.1:{port}/'
    finally:
        srv.terminate(); srv.wait(10)

@pytest.fixture(scope='module')
def browser(tmp_path_factory):
    "Headless Chromium driven by chromedriver (Debian's packages: `make chromium` installs them)"
    exe,drv = shutil.which('chromium'),shutil.which('chromedriver')
    if not (exe and drv): pytest.fail("chromium or chromedriver is missing: run `make chromium` (Debian's chromium and chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    o = webdriver.ChromeOptions()
    o.binary_location = exe
    for a in FLAGS+[f'--user-data-dir={tmp_path_factory.mktemp("chromium")}']: o.add_argument(a)
    o.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    d = webdriver.Chrome(options=o, service=Service(drv))
    d.set_page_load_timeout(30)
    try: yield d
    finally: d.quit()

_JS = """return {title: document.title, text: document.body.innerText,
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  nav: Array.from(document.querySelectorAll('nav.sidebar a[href]')).map(a => a.href),
  ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id), complete: !!document.querySelector('footer.footer')}"""

def _page(u):
    "The page a same-site URL names (`.../` is its index.html), without the fragment"
    u = urldefrag(u)[0]
    return u+'index.html' if u.endswith('/') else u

@pytest.fixture(scope='module')
def crawl(site, browser):
    "Every page reachable from the index through links, with what the browser saw on it"
    seen,todo = {},[site+'index.html']
    while todo:
        u = todo.pop(0)
        if u in seen or not (DOCS/u[len(site):]).is_file(): continue
        for _ in range(3): # a page cut short in transit (the footer is its last element) is fetched again
            browser.get(u)
            info = browser.execute_script(_JS)
            if info['complete']: break
        info['errors'] = [e['message'] for e in browser.get_log('browser') if e['level'] in ('SEVERE', 'ERROR')]
        seen[u] = info
        todo += [_page(l) for l in info['links'] if l.startswith(site)]
    return seen

def _html_files(): return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob('*.html'))

def test_every_page_built_and_reached(site, crawl):
    "Exactly one page per notebook of the sidebar, each where Quarto puts it, and the index reaches every page"
    sys.path.insert(0, str(ROOT/'tools'))
    from docs import html_name
    assert _html_files()==sorted(html_name(p) for p in sidebar_pages())
    assert sorted(u[len(site):] for u in crawl)==_html_files()

def test_pages_load_cleanly(site, crawl):
    "Every page has a title, no console errors, and the sidebar links to every page"
    allp = {site+p for p in _html_files()}
    for u,o in crawl.items():
        assert o['title'] and o['complete'] and not o['errors'], (u, o['complete'], o['errors'])
        assert {_page(l) for l in o['nav']}==allp, (u, allp-{_page(l) for l in o['nav']})

def test_build_runs_no_examples(site):
    "nbdev runs every cell that imports while it builds the docs: an example's imports sit in a cell of their own, so only they run"
    cells = re.findall(r'Found cells containing imports and other code.*?\n---\n(.*?)\n---', BUILD['log'], re.S)
    assert not cells, "put the imports of these cells in a cell above them:\n\n"+'\n\n'.join(cells)

def test_internal_links_resolve(site, crawl):
    "Links between pages (notebook links and nbdev's symbol links) reach a page, and the anchor on it"
    bad = []
    for u,o in crawl.items():
        for l in o['links']:
            if not l.startswith(site): continue
            frag = urldefrag(l)[1]
            tgt = crawl.get(_page(l))
            if tgt is None or (frag and frag not in tgt['ids']):
                f = DOCS/_page(l)[len(site):]
                on_disk = f.is_file() and f'id="{frag}"' in f.read_text()
                bad.append(f"{u[len(site):]} -> {l[len(site):]}" + (" (in the file, not in what the browser got)" if on_disk else ""))
    assert not bad, '\n'.join(bad)

def test_api_pages_show_exports(site, crawl):
    "Each module's page shows every name in its `__all__`"
    from fastddp._modidx import d
    missing = {}
    for mod,syms in d['syms'].items():
        names = getattr(importlib.import_module(mod), '__all__', [])
        if not names or not syms: continue
        page = site+next(iter(syms.values()))[0].split('#')[0]
        assert page in crawl, f"{mod}: no page {page}"
        txt = crawl[page]['text']
        miss = [n for n in names if not re.search(rf'(?<!\w){re.escape(n)}(?!\w)', txt)]
        if miss: missing[mod] = miss
    assert not missing, missing

def test_index_screenshot(site, crawl, browser):
    "A screenshot of the index page is a real, non-empty PNG"
    browser.get(site+'index.html')
    fn = DOCS/'index.png'
    assert browser.save_screenshot(str(fn))
    b = fn.read_bytes()
    assert b[:8]==b'\x89PNG\r\n\x1a\n' and b[12:16]==b'IHDR'
    w,h = struct.unpack('>II', b[16:24])
    assert w>=800 and h>=600 and len(b)>20_000, (w, h, len(b))
