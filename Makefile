# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
TORCH  := torch==2.13.0
DATA   ?= $(abspath ../shared/data)

.PHONY: demo test test-all install install-test bench clean gpu-wheels

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first: the pinned CPU build; an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install $(TORCH)
	$(PIP) install -e .
	touch $@

$(VENV)/.test: $(VENV)/.core
	$(PIP) install -e ".[test,baselines,gpu]"
	touch $@

install: $(VENV)/.core
install-test: $(VENV)/.test

demo: $(VENV)/.core
	$(VENV)/bin/ngra train --model gcn --dataset sbm --epochs 100 --seed 0 --out demo_result.json

# --durations=25: list the 25 slowest tests; pytest's last line gives the total time.
test: $(VENV)/.test
	NGRA_DATA=$(DATA) $(PY) -m pytest -q -m "not slow" --durations=25

test-all: $(VENV)/.test
	NGRA_DATA=$(DATA) NGRA_HYPOTHESIS_PROFILE=thorough $(PY) -m pytest -q

# PyG for experiments/gpu_check.sh on a GPU machine without network: the wheel goes to .whl/
# (git-ignored locally: echo /.whl/ >> .git/info/exclude), carried to the machine beside the tree.
gpu-wheels:  # what the GPU machine lacks: the PyG the tests pin, pymetis for distributed rows
	python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform any -d .whl torch_geometric==2.8.1
	python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
	    --implementation cp --platform manylinux_2_28_x86_64 -d .whl pymetis==2025.2.2

clean:
	rm -rf $(VENV) .pytest_cache
