"""Download the wheels `make test-gpu` installs offline on a GPU machine whose Python has torch but not fastai (see gpu-requirements.in),
and pack them all in `gpu-wheels.tar.xz`: the one file to carry (about 39 MiB, where the wheels are 71)."""
import os, subprocess, sys, shutil, tempfile, zipfile
from pathlib import Path

ROOT = Path(__file__).parent.parent
# on the lent image already (../shared/DESIGN.md), or pulled in by torch: resolved, never downloaded
IMAGE = ('torch torchvision triton accelerate numpy pandas matplotlib scikit-learn scipy psutil pytest pytest-xdist pillow setuptools '
         'pip wheel packaging pyyaml requests urllib3 idna certifi charset-normalizer filelock fsspec jinja2 markupsafe networkx sympy '
         'mpmath typing-extensions safetensors huggingface-hub hf-xet tqdm python-dateutil pytz tzdata six kiwisolver fonttools cycler '
         'contourpy pyparsing threadpoolctl joblib').split()
# spaCy and what only it needs (plum-dispatch needs rich): the IMDB script's tokeniser, ~58 MiB of the wheels
TEXT = ('spacy spacy-legacy spacy-loggers thinc blis srsly preshed cymem murmurhash catalogue confection wasabi weasel typer '
        'cloudpathlib smart-open pydantic pydantic-core annotated-types typing-inspection shellingham '
        'click annotated-doc wrapt').split()
PLATFORM = ['--python-version', '3.12', '--implementation', 'cp', '--abi', 'cp312', '--only-binary=:all:', '--platform', 'any',
            *[o for p in ('manylinux_2_28_x86_64', 'manylinux_2_17_x86_64', 'manylinux2014_x86_64') for o in ('--platform', p)]]

def pins():
    "The packages to carry, `name==version`, resolved for Python 3.12 on x86_64 Linux"
    bin = Path(sys.executable).parent
    cmd = [str(bin/'uv'), 'pip', 'compile', str(ROOT/'tools/gpu-requirements.in'), '--python-version', '3.12', '--python-platform',
           'x86_64-manylinux_2_28', '-q', '--no-header', '--no-annotate', *[o for p in IMAGE for o in ('--no-emit-package', p)]]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [l.strip() for l in out.splitlines() if '==' in l and not l.startswith(('nvidia', 'cuda-'))]

def download(reqs, dest):
    "Download `reqs` (no dependencies: `pins` resolved them) into `dest`, replacing what it held; its size in MiB"
    shutil.rmtree(dest, ignore_errors=True); dest.mkdir()
    with tempfile.NamedTemporaryFile('w', suffix='.txt') as f:
        f.write('\n'.join(reqs)); f.flush()
        subprocess.run([sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', *PLATFORM, '-d', str(dest), '-r', f.name], check=True)
    return sum(o.stat().st_size for o in dest.iterdir())/2**20

ARCHIVE = ROOT/'gpu-wheels.tar.xz'

def pack(dirs, dest=ARCHIVE):
    "Every wheel in `dirs` unzipped into a folder of its file name, all in one xz stream at `dest`; its size in MiB"
    # a wheel is a zip of files compressed one by one: unpacked, xz compresses across them all (71 MiB of wheels -> 39 MiB), under
    # the 64 MiB the device tool carries in one call, so that one `make test-gpu` runs the IMDB script with the rest
    with tempfile.TemporaryDirectory() as d:
        for w in (w for o in dirs for w in sorted(o.glob('*.whl'))):
            with zipfile.ZipFile(w) as z: z.extractall(Path(d)/w.stem)
        tmp = dest.with_name(dest.name+'.part') # never a half-written archive under the name `make test-gpu` reads
        if shutil.which('xz') and shutil.which('tar'): # on every core: a minute, where Python's lzma takes several on one
            subprocess.run(['tar', '-C', d, '-cJf', str(tmp), '.'], check=True, env={**os.environ, 'XZ_OPT': '-9 -T0'})
        else:
            import tarfile
            with tarfile.open(tmp, 'w:xz', preset=9) as t: t.add(d, arcname='.')
        tmp.replace(dest)
    return dest.stat().st_size/2**20

def unpack(src, dest):
    "The wheels packed in `src` by `pack`, zipped again (stored: pip reads them once) into `dest`; their paths"
    import tarfile
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(src) as t: t.extractall(d, filter='data')
        ws = []
        for o in sorted(p for p in Path(d).iterdir() if p.is_dir()):
            ws.append(Path(dest)/(o.name+'.whl'))
            with zipfile.ZipFile(ws[-1], 'w', zipfile.ZIP_STORED) as z:
                for f in sorted(f for f in o.rglob('*') if f.is_file()): z.write(f, f.relative_to(o).as_posix())
    return ws

if __name__=='__main__':
    ps = pins()
    text = [o for o in ps if o.split('==')[0].lower() in TEXT]
    ds = (ROOT/'wheels', ROOT/'wheels-text')
    for reqs,d in zip((sorted(set(ps)-set(text)), text), ds): print(f"{d.name}/: {len(reqs)} wheels, {download(reqs, d):.1f} MiB")
    print(f"{ARCHIVE.name}: all of them, {pack(ds):.1f} MiB (carry this one file)")
