# Every target builds .venv from the pinned dev requirements when it is missing, so a fresh clone needs nothing else.
SHELL := /bin/bash
# A Python without CPython's fork deadlock (tools/python.sh says why): the suite forks thousands of DataLoader workers under DDP
PY ?= $(shell tools/python.sh)
UV := $(shell grep -o '^uv==[0-9.]*' requirements-dev.txt)
VENV := .venv
BIN := $(VENV)/bin
NPROC ?= 2

.PHONY: demo system test test-fast test-floor test-gpu gpu-wheels venv venv-floor check export docs chromium slurm bench clean

# A venv in folder $(1) from the pinned requirements $(2), with fastddp itself installed editable.
# uv (pinned in requirements-dev.txt) installs them: torch from the registry is a ~3 GB CUDA build, which uv fetches and unpacks
# in well under a minute where pip takes many. It compiles the bytecode as pip does: these machines set PYTHONDONTWRITEBYTECODE=1,
# so without it every process would compile torch and fastai from source as it imports them (3x slower).
define venv_rule
$(1)/bin/.ok: $(2) pyproject.toml
	test -x $(1)/bin/python || $(PY) -m venv $(1)
	$(1)/bin/pip install -q $(UV)
	$(1)/bin/uv pip install -q --compile-bytecode -p $(1)/bin/python -r $(2)
	$(1)/bin/uv pip install -q -p $(1)/bin/python --no-deps -e .
	touch $$@
endef

$(eval $(call venv_rule,$(VENV),requirements-dev.txt))
venv: $(BIN)/.ok

# The floor environment: the oldest releases pyproject.toml admits (requirements-floor.txt), in its own venv.
FLOOR := .venv-floor
FBIN := $(FLOOR)/bin
$(eval $(call venv_rule,$(FLOOR),requirements-floor.txt))
venv-floor: $(FBIN)/.ok

# The smoke subset (tests marked `smoke`: DDP at 2-3 ranks, sharding, DCP checkpoints, launch, the tabular script) at the floors.
# only the modules that hold smoke tests: the others need packages the floor set leaves out (they would report as skipped)
SMOKE = $(shell grep -l 'mark.smoke' tests/test_*.py)
test-floor: $(FBIN)/.ok
	$(FBIN)/python -m pytest -ra -m smoke --durations=10 -n 2 $(SMOKE)

# The main job: DDP training on 2 CPU processes (or on every GPU) on a small generated dataset, offline.
demo: $(BIN)/.ok
	$(BIN)/fastddp-launch --nproc $(NPROC) scripts/demo_ddp.py

# Notebooks are the source: fail when exporting or cleaning them would change a tracked file.
# The benchmarks page and the README are generated too (from nbs/bench_results/, and from nbs/index.ipynb); lines stay <= 140 characters.
check: $(BIN)/.ok
	@# nbdev-export rewrites pyproject.toml unchanged; keep its time, or every venv that depends on it would look stale after this
	cp -p pyproject.toml $(VENV)/.pyproject && $(BIN)/nbdev-export && \
	  { cmp -s pyproject.toml $(VENV)/.pyproject && touch -r $(VENV)/.pyproject pyproject.toml; rm -f $(VENV)/.pyproject; }
	$(BIN)/python tools/lines.py
	$(BIN)/python tools/nbvalid.py
	$(BIN)/python tools/bench_page.py >/dev/null
	$(BIN)/nbdev-clean
	$(BIN)/python tools/readme.py --check
	git diff --exit-code -- fastddp nbs README.md || (echo "notebooks and modules disagree, or a notebook is not clean, or a generated page is stale: run nbdev-export, python tools/bench_page.py and nbdev-clean, then commit" && exit 1)
	test -z "$$(git status --porcelain -- fastddp nbs)" || (git status --porcelain -- fastddp nbs; echo "untracked generated files: commit them" && exit 1)

# The installs first and at once (the venv, Chromium and SLURM: downloads and unpacking, little CPU; on a fresh machine, with the
# floor's venv beside them as .ci/run has it, 111 and 134 s where one after the other took 127 s: they share one disk), then the
# checks and the suite
test:
	$(MAKE) -j2 venv system
	$(MAKE) check
	@# fastddp is installed editable and these machines set PYTHONDONTWRITEBYTECODE=1: without its bytecode written here (after
	@# check's export, which rewrites the modules) every process of the suite compiles fastddp's modules as it imports them (0.16 s)
	$(BIN)/python -m compileall -q fastddp
	$(BIN)/python -m pytest -ra --durations=40 -n 2

# Chromium, then SLURM: one apt-get at a time (dpkg's lock), beside whatever else make runs
system:
	$(MAKE) chromium
	$(MAKE) slurm

# The fast tier for the edit-test loop (a few minutes): everything but the tests marked slow (see tests/conftest.py) and GPU tests.
test-fast: $(BIN)/.ok
	$(BIN)/python -m pytest -ra -m "not slow" --durations=10 -n 2

# Every GPU check in one command, one table at the end (tools/test_gpu.py): the `cuda` tests, ranks sharing the GPU over gloo, the
# notebooks' `cuda` cells, the three scripts on the GPU, the GPU benchmark. On a GPU machine whose Python has torch but not fastai
# it installs the wheels `make gpu-wheels` packed in gpu-wheels.tar.xz (carry that file); without CUDA it reports the GPU steps as not
# run.
GPU_PY ?= $(shell test -x $(BIN)/python && echo $(BIN)/python || echo python3)
test-gpu:
	$(GPU_PY) tools/test_gpu.py

# The wheels a GPU machine's image lacks (tools/gpu-requirements.in), into wheels/ (12 MiB) and wheels-text/ (spaCy, 58 MiB), then
# all of them in gpu-wheels.tar.xz (39 MiB: one file, under the 64 MiB a device call carries)
gpu-wheels: $(BIN)/.ok
	$(BIN)/python tools/gpu_wheels.py

# The docs site: `nbdev-docs` where Quarto is installed, otherwise nbdev's processed notebooks rendered by nbconvert (offline).
docs: $(BIN)/.ok
	$(BIN)/python tools/docs.py

# Headless Chromium and its driver for tests/test_docs.py, from Debian's packages: installed once per machine.
# As root apt-get runs directly; otherwise through `sudo -n` (fails at once, never prompts).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null \
	  || { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null; } \
	  || { echo "make chromium: apt-get could not install chromium and chromium-driver (it needs root or passwordless sudo)"; exit 1; }; }
	@chromium --version 2>/dev/null && chromedriver --version

# SLURM and munge for tests/test_slurm.py's one-node cluster (started in a temporary folder, never as a service), from Debian's packages: installed once per machine.
slurm:
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && command -v munged >/dev/null || { \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
	  || { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null; } \
	  || { echo "make slurm: apt-get could not install slurmctld, slurmd, slurm-client and munge (it needs root or passwordless sudo)"; exit 1; }; }
	@slurmctld -V

bench: $(BIN)/.ok
	$(BIN)/python -m fastddp.bench

clean:
	rm -rf _docs _proc build dist *.egg-info
