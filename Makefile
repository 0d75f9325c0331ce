# ucxpy developer entry points.  Everything installs into a local venv so a
# fresh machine needs only python3 (with venv) and a C compiler.
PYTHON ?= python3
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
NP ?= 4
PYTEST_ARGS ?=
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: install run test bench clean

$(VENV)/.installed: setup.cfg setup.py pyproject.toml $(wildcard native/*.c native/*.h native/*.py)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

## the main job: an SPMD example on the built-in launcher
run: install
	ucxpy-run -n $(NP) --timeout 300 python examples/pingpong.py

## the test suite (real multi-process runs, each with a hard timeout)
test: install
	$(PY) -m pytest -q -ra $(PYTEST_ARGS) tests

## latency / bandwidth against mpi4py on MPICH (not part of CI)
bench: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/run_bench.py

clean:
	rm -rf build *.egg-info ucxpy/_native*.so ucxpy/_native.c native/*.o .pytest_cache
