# mamba_edu — one-command setup, demo, tests and JupyterLab.
# Every target creates the local virtual environment (.venv) and installs the pinned set first.
# Platforms, sizes and the other ways in (conda, a container, no make): docs/install.md.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The interpreter that creates .venv: Python 3.11 or newer (make setup PYTHON=python3.12).
PYTHON ?= python3
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)
OS      := $(shell uname -s)
# Without a GPU on Linux, torch comes from PyTorch's CPU-only index (about 0.2 GB instead of the
# 2.7 GB of CUDA wheels PyPI serves for Linux); where that index cannot be reached, from the
# default one. make setup TORCH_INDEX= skips this step. torch alone (--no-deps): its dependencies
# come from the pinned set in the next step.
TORCH_INDEX   ?= $(if $(and $(filter 0,$(HAS_GPU)),$(filter Linux,$(OS))),https://download.pytorch.org/whl/cpu)
TORCH_VERSION := $(shell sed -n 's/^torch==\([0-9.]*\).*/\1/p' requirements-pinned.txt)
PYTEST_ARGS ?=

ifeq ($(HAS_GPU),0)
# No GPU: Triton kernels run in the interpreter, figures render off-screen.
export TRITON_INTERPRET ?= 1
export MPLBACKEND ?= Agg
endif

.PHONY: setup check-python demo test test-extra test-triton-newest test-all lab lab-solutions lab-quiet notebooks lock clean help

setup: $(STAMP)

# Before anything is downloaded: Python >= 3.11 (the package, numpy 2.4 and the lock need it).
check-python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "mamba_edu needs Python >= 3.11, but '$(PYTHON)' is $$($(PYTHON) --version 2>&1 || echo 'not found')." >&2; \
	  echo "Install Python 3.11+ (python.org, pyenv, uv python install 3.11, conda, or deadsnakes on" >&2; \
	  echo "Ubuntu 22.04) and run: make setup PYTHON=python3.11   (see docs/install.md)" >&2; \
	  exit 1; }
	@test ! -x $(PY) || $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "$(VENV) was made with $$($(PY) --version 2>&1); mamba_edu needs Python >= 3.11: make clean, then make setup PYTHON=python3.11" >&2; \
	  exit 1; }

# Each phase says what it does, also in a pipe or a log (no terminal): pip's own progress bar is
# on (--progress-bar on) and the phases are numbered; pip lists what it collects as it goes.
PIP     := $(PY) -m pip install --progress-bar on
N_PINNED = $(shell grep -c '^[A-Za-z0-9]' requirements-pinned.txt)

$(STAMP): pyproject.toml requirements-pinned.txt constraints-cuda.txt | check-python
	@echo "==> setup 1/4: creating the virtual environment $(VENV) with $(PYTHON)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -q --upgrade pip
ifneq ($(TORCH_INDEX),)
	@echo "==> setup 2/4: torch $(TORCH_VERSION), CPU-only, from $(TORCH_INDEX) (about 0.2 GB)"
	$(PIP) --retries 1 --timeout 30 --no-deps --index-url $(TORCH_INDEX) "torch==$(TORCH_VERSION)" \
	  || echo "note: $(TORCH_INDEX) was not reachable; torch comes from the default index instead"
else
	@echo "==> setup 2/4: torch comes with the pinned set (PyPI's build)"
endif
	@echo "==> setup 3/4: the pinned set, $(N_PINNED) packages (requirements-pinned.txt; already installed ones are kept)"
	$(PIP) -r requirements-pinned.txt
	@echo "==> setup 4/4: mamba_edu itself, editable"
	$(PIP) -q --no-deps -e .
	@echo "==> setup done: $(VENV) is ready"
	touch $@

demo: $(STAMP)
	@echo "==> demo: python -m mamba_edu demo (the math, the four strategies, a timeline)"
	$(PY) -m mamba_edu demo

# make test: every unit test of the package and nbval over the learner notebooks, in about 3 min
# on 2 cores, with no network, no second install and no multi-process test (tests marked `extra`):
# two pytest processes side by side, one core each (scripts/run_tests.py).
# make test-extra: the rest (nbval over notebooks/solutions, the no-Triton venv, the hostile-grader
# corpus, 2-rank tensor parallelism, PyPI resolution, the learner copy's own make test, browser,
# HTA, and the kernels under the newest Triton: test-triton-newest); make test-all runs both. One torch thread per process: tiny tensors gain nothing from more,
# and on a loaded machine they oversubscribe the cores. pytest exits 5 when it collects nothing;
# that is not a failure of the code. -rs (pyproject's addopts) lists every skip with its reason.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -p no:cacheprovider -q
NBVAL  := --nbval-lax --nbval-current-env

test: $(STAMP)
	@echo "==> test: unit tests and nbval over the learner notebooks, two pytest processes (about 3 min on 2 cores)"
	$(PY) scripts/run_tests.py $(PYTEST_ARGS)

test-extra: $(STAMP)
	$(PYTEST) notebooks/solutions $(NBVAL) $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PYTEST) tests -m extra $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(MAKE) --no-print-directory test-triton-newest

# The kernels under the newest Triton that pyproject.toml allows (a CPU-only torch requires no
# triton, so `pip install -e .` there picks it), in the interpreter, GPUs hidden: that triton alone
# (it has no dependencies) in a folder of .venv, ahead of the lock's on PYTHONPATH; .venv keeps the
# lock's. About 1 GB on disk, a minute. tests/project/test_packaging.py keeps TRITON_NEWEST inside
# pyproject's range.
TRITON_NEWEST     ?= 3.9.0
TRITON_NEWEST_DIR := $(VENV)/triton-$(TRITON_NEWEST)

test-triton-newest: $(STAMP)
	@echo "==> test-triton-newest: tests/kernels and tests/gdn in the interpreter under triton $(TRITON_NEWEST) ($(TRITON_NEWEST_DIR))"
	test -d $(TRITON_NEWEST_DIR) || { rm -rf $(TRITON_NEWEST_DIR).part && \
	  $(PIP) -q --no-deps --target $(TRITON_NEWEST_DIR).part "triton==$(TRITON_NEWEST)" && \
	  mv $(TRITON_NEWEST_DIR).part $(TRITON_NEWEST_DIR); }
	PYTHONPATH=$(abspath $(TRITON_NEWEST_DIR)) $(PY) -c 'import triton; assert triton.__version__ == "$(TRITON_NEWEST)", triton.__file__'
	CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 PYTHONPATH=$(abspath $(TRITON_NEWEST_DIR)) \
	  $(PYTEST) tests/kernels tests/gdn $(PYTEST_ARGS)

test-all: test test-extra

# The learner notebooks are made from notebooks/solutions/ (solution blocks become stubs);
# both versions are then executed so that their committed outputs are fresh.
notebooks: $(STAMP)
	$(PY) -m mamba_edu.exercises.stubs --execute

# JupyterLab on the notebooks: `make lab` is the learner's view, the notebooks and docs/ with
# notebooks/solutions/ hidden from the file browser (hide_globs); `make lab-solutions` is the
# instructor's, everything shown. As root (containers, cloud machines) Jupyter refuses to start
# without --allow-root, so it is added when `id -u` is 0 and only then. The announcements plugin
# (its "Would you like to get notified about official Jupyter news?" pop-up and update checks)
# is disabled in this .venv, and news_url=None fetches no news feed: nothing asks, nothing is
# fetched from the internet at start. `jupyter labextension enable ...` undoes it.
LAB_AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

LAB := $(VENV)/bin/jupyter lab --LabApp.news_url=None $(LAB_AS_ROOT)
# jupyter_server's own hidden names, plus solutions: the learner does not see the answers.
LEARNER_HIDE := --ContentsManager.hide_globs="['__pycache__', '*.pyc', '*.pyo', '.DS_Store', '*~', 'solutions']"

lab: lab-quiet
	@echo "==> lab: JupyterLab on the learner notebooks and docs/ (notebooks/solutions/ hidden; make lab-solutions shows them)"
	$(LAB) $(LEARNER_HIDE) --ServerApp.default_url=/lab/tree/notebooks/00_start_here.ipynb

lab-solutions: lab-quiet
	@echo "==> lab-solutions: JupyterLab on everything, notebooks/solutions/ included (for instructors)"
	$(LAB) --ServerApp.default_url=/lab/tree/notebooks/solutions/00_start_here.ipynb

lab-quiet: $(STAMP)
	-@$(VENV)/bin/jupyter labextension disable --level=sys_prefix \
		@jupyterlab/apputils-extension:announcements >/dev/null 2>&1

# Recompile requirements-pinned.txt, constraints-cuda.txt and requirements-ci.txt from
# requirements.in and requirements-ci.in against PyPI (needs the network; uv comes from the CI set).
lock: $(STAMP)
	$(PY) -m pip install -q "$$(grep '^uv==' requirements-ci.in)"
	$(PY) .ci/lock.py

clean:
	rm -rf $(VENV) .pytest_cache

help:
	@echo "make setup      create .venv (Python >= 3.11) and install the pinned set; CPU-only torch without a GPU"
	@echo "make demo       run the main job on the default device (python -m mamba_edu demo)"
	@echo "make test       unit tests + nbval over the learner notebooks, about 3 min on 2 cores (skips listed with reasons)"
	@echo "make test-extra the slower rest: solutions, no-Triton venv, hostile grading, 2-rank TP, PyPI, learner copy, newest Triton"
	@echo "make test-all   both, as CI (.ci/run) runs them"
	@echo "make test-triton-newest  the kernel tests in the interpreter under the newest Triton allowed (part of test-extra)"
	@echo "make lab        open JupyterLab on the learner notebooks and docs/ (solutions hidden; works as root, no news pop-up)"
	@echo "make lab-solutions  the same with notebooks/solutions/ shown (for instructors)"
	@echo "make notebooks  regenerate the learner notebooks from the solutions and execute both"
	@echo "make lock       recompile the pinned set from requirements.in (needs PyPI)"
	@echo "make clean      remove .venv and the pytest cache"
	@echo "make help       this list"
