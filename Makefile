# mamba_edu — one-command setup, demo, tests and JupyterLab.
# Every target creates the local virtual environment (.venv) and installs the pinned set first.

VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1 || echo 0)

ifeq ($(HAS_GPU),0)
# No GPU: Triton kernels run in the interpreter, figures render off-screen.
export TRITON_INTERPRET ?= 1
export MPLBACKEND ?= Agg
endif

.PHONY: setup demo test test-fast lab notebooks clean help

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-pinned.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-pinned.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

demo: $(STAMP)
	$(PY) -m mamba_edu demo

# pytest exits 5 when it collects nothing; that is not a failure of the code.
test: $(STAMP)
	$(PY) -m pytest tests notebooks --nbval-lax --nbval-current-env -p no:cacheprovider -q || [ $$? -eq 5 ]

test-fast: $(STAMP)
	$(PY) -m pytest tests -q -m "not slow" -p no:cacheprovider || [ $$? -eq 5 ]

# The learner notebooks are made from notebooks/solutions/ (solution blocks become stubs);
# both versions are then executed so that their committed outputs are fresh.
notebooks: $(STAMP)
	$(PY) -m mamba_edu.exercises.stubs --execute

# JupyterLab on the notebooks. As root (containers, cloud machines) Jupyter refuses to start
# without --allow-root, so it is added when `id -u` is 0 and only then. The announcements plugin
# (its "Would you like to get notified about official Jupyter news?" pop-up and update checks)
# is disabled in this .venv, and news_url=None fetches no news feed: nothing asks, nothing is
# fetched from the internet at start. `jupyter labextension enable ...` undoes it.
LAB_AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(STAMP)
	-@$(VENV)/bin/jupyter labextension disable --level=sys_prefix \
		@jupyterlab/apputils-extension:announcements >/dev/null 2>&1
	$(VENV)/bin/jupyter lab --LabApp.news_url=None $(LAB_AS_ROOT) notebooks

clean:
	rm -rf $(VENV) .pytest_cache

help:
	@echo "make setup      create .venv and install the pinned set (every target does this first)"
	@echo "make demo       run the main job on the default device (python -m mamba_edu demo)"
	@echo "make test       pytest + nbval over every notebook, as CI runs it"
	@echo "make test-fast  pytest without the slow tests and without the notebooks"
	@echo "make lab        open JupyterLab on the notebooks (works as root, no news pop-up)"
	@echo "make notebooks  regenerate the learner notebooks from the solutions and execute both"
	@echo "make clean      remove .venv and the pytest cache"
	@echo "make help       this list"
