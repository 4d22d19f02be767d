#!/bin/sh
# The Python that `make` builds the venvs on: the first one found without CPython's fork deadlock (gh-112275: a DataLoader
# worker forked while a gloo or NCCL thread enters Python never starts; fixed in 3.10.15, 3.11.8 and 3.12.1), else python3 with a
# warning. The rule is `fastddp.core.fork_deadlocks`'s, repeated: no venv, so no fastddp, exists yet when make asks.
fixed='import sys; v = sys.version_info[:3]; sys.exit(v<(3,10,15) or (3,11)<=v<(3,11,8) or v==(3,12,0))'
for p in python3 python3.12 python3.13 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12.*/bin/python3.12; do
  "$p" -c "$fixed" 2>/dev/null && { command -v "$p"; exit 0; }
done
echo "tools/python.sh: no Python without it found; python3 can hang a DataLoader worker in the tests (CPython gh-112275)" >&2
echo python3
