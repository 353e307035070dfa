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

.PHONY: setup demo test test-fast lab notebooks clean

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

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks

clean:
	rm -rf $(VENV) .pytest_cache
