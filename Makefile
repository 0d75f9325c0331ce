# ucxpy developer entry points.  Everything installs into a local venv so a
# fresh machine needs only python3 (with venv) and a C compiler.
PYTHON ?= python3
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
NP ?= 4
PYTEST_ARGS ?=
# The editable install puts the checkout on sys.path by a .pth line
# (setuptools' "compat" mode): the default mode's import hook costs every
# interpreter start 10-17 ms (pathlib & co.), which a 16-rank job on 2 cores
# pays 16 times over (issue 44).  setuptools warns that the mode is deprecated.
PIP_E = $(PY) -m pip install -q --config-settings editable_mode=compat -e
export PATH := $(abspath $(VENV))/bin:$(PATH)

# Debian packages: libfabric/libibverbs for the RDMA transports (ofi runs here on
# libfabric's tcp and shm providers; verbs needs a device) and Open MPI, the
# second real launcher the tests use, and libpmix (the PMIx bootstrap's client
# library, ucxpy._pmix; Open MPI's mpirun and srun --mpi=pmix serve it), and
# Python's own documentation (its inventory resolves the docs' references offline).
# Installed when missing and possible.
SYSTEM_PKGS ?= libfabric-dev libfabric-bin libibverbs-dev rdma-core openmpi-bin libopenmpi-dev libucx-dev slurmctld slurmd slurm-client munge libpmix2 libpmix-dev python3.11-doc

.PHONY: install deps run test docs test-c test-c-san test-c-tsan test-hosts test-scale test-verbs mutation mutation-ratchet bench bench-ucp bench-capi bench-oshmem bench-scale bench-tcp bench-torch bench-nixl conformance-mpi conformance-mpi4py-ucp conformance-mpich conformance-shmem conformance-openmpi clean

## system packages (root + apt only; without them ofi/verbs report themselves unavailable)
deps:
	@missing=""; for p in $(SYSTEM_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	$(PYTHON) -c "import ensurepip" 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian packages:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null) \
	    || echo "warning: apt-get failed; ofi/verbs transports will be unavailable"; \
	else echo "note: missing Debian packages:$$missing (ofi/verbs transports will be unavailable)"; fi

$(VENV)/.installed: setup.cfg setup.py pyproject.toml $(wildcard native/*.c native/*.h native/*.py native/ucp/* native/dp/* native/proto/*)
	$(MAKE) --no-print-directory deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP_E) '.[test]'
	@# shmem4py builds against Open MPI's OSHMEM (oshcc from `make deps`): the
	@# tests and the bench compare with it; without oshcc those comparisons skip
	@if command -v oshcc >/dev/null; then OSHCC=oshcc $(PY) -m pip install -q shmem4py \
	  || echo "warning: shmem4py did not build; its comparisons skip"; \
	else echo "note: no oshcc (Open MPI's OSHMEM): the shmem4py comparisons skip"; fi
	touch $@

# Bytecode for the project's own modules, written here because this machine's
# environment sets PYTHONDONTWRITEBYTECODE=1: without it every rank of every
# job compiles every module it imports from source (a 16-rank job that
# imports MPI and calls Barrier: 3.6-3.8 s without, 1.8-1.9 s with;
# `from mpi_shim import MPI` alone 0.52 -> 0.25 s).  Only changed files are
# compiled again (0.2 s when none changed).
PYC_DIRS = ucxpy mpi_shim shmem tests examples bench conformance
install: $(VENV)/.installed
	@$(PY) -m compileall -q -j0 $(PYC_DIRS) >/dev/null

## the main job: an SPMD example on the built-in launcher
run: install
	ucxpy-run -n $(NP) --timeout 300 python examples/pingpong.py

## the test suite (real multi-process runs, each with a hard timeout); the
## 15 slowest tests are listed at the end.  Two pytest workers run whole
## files side by side (xdist's loadfile, longest files first: conftest.py's
## LONGEST_FIRST): one test alone leaves a core idle about a third of the
## time (waiting for a peer, a timeout, a launcher).  PYTEST_WORKERS=0 runs
## it in one process.
PYTEST_WORKERS ?= 2
test: install
	@# one-time setup of an external suite, before the workers start: MPICH's
	@# test suite (Debian's source package) configured and its CI subset
	@# built into the user's cache (about 30 s on a fresh machine, 2-4x that
	@# beside a pytest worker; nothing once cached).  A failure here is the
	@# test's to report (a failed download skips it).
	@$(PY) conformance/mpich/run.py --subset ci --build-only 2>&1 | tail -1 || true
	$(PY) -m pytest -q -ra --durations=15 -n $(PYTEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder $(PYTEST_ARGS) tests

## the documentation site (docs/, Sphinx + myst-parser, offline): warnings are
## errors and every reference must resolve; `make test` builds it too
## (tests/test_docs.py), and runs the programs its pages include
## (tests/test_docs_examples.py)
docs: install
	$(PY) -m sphinx -q -W --keep-going -n -b html docs docs/_build/html
	@echo "built docs/_build/html/index.html"

## the native data plane's C tests (tests/c/: plain C, no Python), built with
## -Wall -Wextra -Werror; -san under ASan/UBSan, -tsan under ThreadSanitizer
## (`make test` runs every C test in all three: tests/test_dp_c.py)
test-c:
	$(PYTHON) tests/c/ctests.py --variant plain
test-c-san:
	$(PYTHON) tests/c/ctests.py --variant san
test-c-tsan:
	$(PYTHON) tests/c/ctests.py --variant tsan

## multi-host tests on network namespaces (root + CAP_NET_ADMIN; they skip otherwise;
## `make test` runs them too)
test-hosts: install
	$(PY) -m pytest -q -ra $(PYTEST_ARGS) tests/hosts

## the big jobs (issue 31): 64 ranks over 16 namespace hosts and 128 ranks on
## one host, all-to-all + Allreduce + shmem ring checked (`make test` runs
## 16 ranks over 4 hosts and 32 on one host)
test-scale: install
	$(PY) -m pytest -q -ra --scale -m scale $(PYTEST_ARGS) tests

## the verbs transport on a real device: an HCA, or Soft-RoCE created here
## (root + the rdma_rxe kernel module; tests/conftest.py rdma_device()):
## its own tests plus the whole tag / AM / RMA suite over verbs (docs/guide/rdma.md)
test-verbs: install
	$(PY) -m pytest -q -ra $(PYTEST_ARGS) tests/test_transport_verbs.py \
	  tests/test_tag_matching.py tests/test_am.py tests/test_rma.py -k "verbs"

## mutation testing of the pure-logic modules (setup.cfg [mutmut]): per-module
## kill rates against tests/mutation-baseline.json (>= 90 %); not part of CI
MUTMUT ?= mutmut==3.8.1
RATCHET ?= ucxpy.tag ucxpy.transports.tcp_frames
mutation: install
	$(PY) -m pip install -q '$(MUTMUT)'
	$(PY) tests/mutation_run.py

## CI's ratchet: the two fastest modules (about two minutes) must stay at
## their baseline kill rate
mutation-ratchet: install
	$(PY) -m pip install -q '$(MUTMUT)'
	$(PY) tests/mutation_run.py --only $(RATCHET)

## latency / bandwidth / RMA / allreduce / shmem against mpi4py on MPICH and
## shmem4py on Open MPI's OSHMEM, measured in the same run (not part of CI)
bench: install
	$(PIP_E) '.[bench]'
	@command -v oshcc >/dev/null && OSHCC=oshcc $(PY) -m pip install -q shmem4py \
	  || echo "note: shmem4py not installed; the bench skips its column"
	@# UCX in C (ucx_perftest), the physical limit column of the tag tables
	@command -v ucx_perftest >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ucx-utils >/dev/null; } \
	  || echo "note: ucx_perftest not installed (apt-get install ucx-utils); the bench skips its column"
	$(PY) bench/run_bench.py --tls shm,tcp,tcp+tls,ofi --rma-tls shm,tcp --suites tag,rma,coll,shmem --snapshot
	$(PY) bench/fabtests_ref.py
	$(PY) bench/ucp_bench.py --json bench/results/ucp.json --snapshot
	$(PY) bench/capi_bench.py --repeat 5 --json bench/results/capi.json --snapshot
	$(PY) bench/gil_bench.py --json bench/results/gil.json --snapshot
	$(PY) bench/oshmem_bench.py --json bench/results/oshmem.json --snapshot
	$(PY) bench/scale.py --json bench/results/scale.json --snapshot
	$(PY) bench/tcp_bench.py --json bench/results/tcp.json --snapshot
	$(PY) bench/torch_bench.py --json bench/results/torch.json --snapshot
	$(PY) bench/nixl_bench.py --json bench/results/nixl.json --snapshot

## NIXL over ucxpy's libucp against NIXL over its bundled UCX: WRITE bandwidth
## 1-64 MiB and a 64 x 16 KiB KV transfer, two processes (part of bench; alone here)
bench-nixl: install
	mkdir -p bench/results
	$(PY) bench/nixl_bench.py --json bench/results/nixl.json --snapshot

## torch.distributed on ucxpy against gloo: collectives 8 B - 64 MiB at 2 and 4
## ranks, an expert-parallel dispatch/combine, a DDP step (part of bench; alone here)
bench-torch: install
	mkdir -p bench/results
	$(PY) bench/torch_bench.py --json bench/results/torch.json --snapshot

## tcp, the multi-host path: ucxpy against MPICH over UCX's tcp transport and
## ucx_perftest over tcp (part of bench; alone here)
bench-tcp: install
	@command -v ucx_perftest >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ucx-utils >/dev/null; } || true
	$(PY) bench/tcp_bench.py --json bench/results/tcp.json --snapshot

## MPICH over ucxpy's libucp.so.0 beside MPICH over the real UCX and ucxpy's
## own API (part of bench; alone here)
bench-ucp: install
	$(PIP_E) '.[bench]'
	mkdir -p bench/results
	$(PY) bench/ucp_bench.py --json bench/results/ucp.json --snapshot

## issue 43's targets through the C ABI: MPICH and Open MPI on ucxpy's libucp
## beside each on the real UCX (latency, message rate, Allreduce, bandwidth),
## and a C ping-pong beside a Python thread holding the GIL (part of bench)
bench-capi: install
	$(PIP_E) '.[bench]'
	mkdir -p bench/results
	$(PY) bench/capi_bench.py --repeat 5 --json bench/results/capi.json --snapshot
	$(PY) bench/gil_bench.py --json bench/results/gil.json --snapshot

## Open MPI's OSHMEM over ucxpy's libucp.so.0 beside OSHMEM over the system
## UCX and ucxpy's own shmem (part of bench; alone here)
bench-oshmem: install
	mkdir -p bench/results
	$(PY) bench/oshmem_bench.py --json bench/results/oshmem.json --snapshot

## mpi_shim under ucxpy-run against mpi4py + MPICH at 8-64 ranks on this host:
## all-to-all, launch and exit, ping-pong beside waiting ranks, memory (part
## of bench; alone here; SCALE_ARGS=--quick for 8 and 16 ranks)
SCALE_ARGS ?=
bench-scale: install
	$(PIP_E) '.[bench]'
	mkdir -p bench/results
	$(PY) bench/scale.py --json bench/results/scale.json --snapshot $(SCALE_ARGS)

## mpi4py's released test suite against mpi_shim (sdist fetched at run time, never committed)
conformance-mpi: install
	mkdir -p conformance/mpi/results
	@# both launchers run whatever the first one found; the exit status is theirs together
	rc=0; $(PY) conformance/mpi/run.py --np 1,2,3,4 -v --launcher ucxpy-run \
	  --json conformance/mpi/results/ucxpy-run.json --snapshot conformance-mpi || rc=1; \
	$(PY) conformance/mpi/run.py --np 1,2,3,4 -v --launcher mpiexec \
	  --json conformance/mpi/results/mpiexec.json --snapshot conformance-mpi-mpiexec || rc=1; exit $$rc

## the same suite on the real mpi4py wheel + MPICH (ch4:ucx) over ucxpy's libucp.so.0
## (ucxpy-ucx's environment, every rank's report checked), beside MPICH over the
## bundled real UCX with the same variables, measured in the same run
conformance-mpi4py-ucp: install
	mkdir -p conformance/mpi/results
	$(PY) conformance/mpi/run.py --impl ucp,ref-ucx --np 1,2,3,4 -v --timeout 480 \
	  --json conformance/mpi/results/ucp.json --snapshot conformance-mpi4py-ucp

## MPICH's own C test suite (test/mpi of Debian 12's mpich 4.0.2 source package,
## fetched with apt-get at run time into ~/.cache, never committed) on the mpich
## wheel over ucxpy's libucp.so.0 (ucxpy-ucx --check), beside the bundled real UCX;
## per-directory results in conformance/mpich/results/ (MPICH_TESTS_ARGS=--resume
## continues an interrupted run)
MPICH_TESTS_ARGS ?=
conformance-mpich: install
	$(PY) conformance/mpich/run.py --snapshot $(MPICH_TESTS_ARGS)

## shmem4py's released test suite against our shmem (sdist fetched at run time, never committed)
conformance-shmem: install
	$(PY) conformance/shmem/run.py --launcher both --np 1,2,4 --snapshot

## Open MPI and OSHMEM (the system's, 4.1.4) over ucxpy's libucp.so.0 (ucxpy-ucx --check)
## beside the system UCX (--reference), measured in the same run, at 2 and 4 ranks:
## Open MPI's examples/ (Debian's openmpi source package, fetched with apt-get at run
## time into ~/.cache, never committed; output checked against their printf formats)
## and the real shmem4py's own tests and demos (sdist fetched at run time); then
## mpi4py's suite on Open MPI over libucp; results in conformance/openmpi/results/
conformance-openmpi: install
	mkdir -p conformance/openmpi/results
	rc=0; $(PY) conformance/openmpi/run.py --np 2,4 --timeout 60 \
	  --json conformance/openmpi/results/openmpi.json --snapshot || rc=1; \
	$(PY) conformance/mpi/run.py --impl ompi-ucp,ompi-ref --np 2 \
	  --snapshot conformance-mpi4py-ompi || rc=1; exit $$rc

clean:
	rm -rf build *.egg-info ucxpy/_*.so ucxpy/_*.c native/*.o .pytest_cache
