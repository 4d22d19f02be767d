"Download the wheels `make test-gpu` installs offline on a GPU machine whose Python has torch but not fastai (see gpu-requirements.in)"
import subprocess, sys, shutil, tempfile
from pathlib import Path

ROOT = Path(__file__).parent.parent
# on the lent image already (../shared/DESIGN.md), or pulled in by torch: resolved, never downloaded
IMAGE = ('torch torchvision triton accelerate numpy pandas matplotlib scikit-learn scipy psutil pytest pytest-xdist pillow setuptools '
         'pip wheel packaging pyyaml requests urllib3 idna certifi charset-normalizer filelock fsspec jinja2 markupsafe networkx sympy '
         'mpmath typing-extensions safetensors huggingface-hub hf-xet tqdm python-dateutil pytz tzdata six kiwisolver fonttools cycler '
         'contourpy pyparsing threadpoolctl joblib').split()
# spaCy and what only it needs (plum-dispatch needs rich): the IMDB script's tokeniser, ~58 MiB, carried in a call of its own
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

if __name__=='__main__':
    ps = pins()
    text = [o for o in ps if o.split('==')[0].lower() in TEXT]
    for reqs,d in ((sorted(set(ps)-set(text)), ROOT/'wheels'), (text, ROOT/'wheels-text')):
        print(f"{d.name}/: {len(reqs)} wheels, {download(reqs, d):.1f} MiB")
