"The notebooks are the docs and the source: every example in them runs and asserts (nbdev-test), and they agree with the modules"
import sys, subprocess
from pathlib import Path
from conftest import ROOT, has_cuda

def test_notebooks_run():
    "`nbdev-test` runs every notebook; GPU cells (`#| cuda`, `#| multigpu`) run only where there is a GPU"
    cmd = [str(Path(sys.executable).parent/'nbdev-test')]+(['--flags', 'cuda'] if has_cuda() else [])
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode==0, (p.stdout+p.stderr)[-5000:]
