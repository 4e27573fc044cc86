# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
#
#   VENV=path       use another virtual environment (default .venv)
#   TORCH_SPEC=...  the torch to install when none is installed (default: the CPU build 2.13.0)
#   TORCH_PIP_ARGS  extra pip arguments for that install, e.g.
#                   --index-url https://download.pytorch.org/whl/cpu on a machine without a local wheel
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ingest-installed
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: setup compile demo test lint typecheck unit unit-fast bench peers clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# Keep a torch that is already installed; otherwise take the CPU build before anything
	# else can pull the CUDA wheels in through the unpinned `torch>=` requirement.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,bench,hf,media,peers]"
	$(MAKE) --no-print-directory peers
	# Azurite, the Azure Blob server the tests run on 127.0.0.1 (npm; skipped without npm).
	command -v npm >/dev/null && npm install --silent --no-audit --no-fund \
		--prefix $(VENV)/azurite azurite@3 || echo "npm not found: the Azure tests will be skipped"
	touch $(STAMP)

# Byte-compile this project's own modules. pip compiles the packages it installs, but not an
# editable install's source, and where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) Python never caches it either: every Ray worker, `ingest` command and job then
# compiles ~100 modules from source, 0.2-0.45 CPU s a process. Quick when nothing changed.
compile: $(STAMP)
	$(PY) -m compileall -q ingest scripts benchmarks tests

demo: $(STAMP) compile
	$(PY) scripts/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# When pytest ends without its summary (a dead local Ray takes the driver with it), say why.
# --durations: the slowest tests in every log, to keep the suite well inside its time.
# XDIST: two pytest-xdist workers by default, the system tests one after the other on one of
# them, each other file on one worker (tests/conftest.py says why). Two cores are enough:
# most of a test's time is waiting (processes starting, Ray, loopback servers). On this
# 2-core machine the whole suite took 19.0 min so (2026-12-04), against 39.3 min in one
# process at the last fresh clone (2026-12-03). `make unit XDIST=` runs it in one process.
# --max-worker-restart=0: a worker that dies ends the run, its test named. Replaced, it could
# hang the run for ever (pytest-xdist 3.8.0, issues 1323 and 1327; tests/test_suite_runner.py).
XDIST ?= -n 2 --dist loadgroup --no-loadscope-reorder --max-worker-restart=0
unit: $(STAMP) compile
	$(PY) -m pytest -q --durations=30 $(XDIST) || { $(PY) scripts/why_tests_died.py; exit 1; }

# Everything but the system tests (job submit, multi-node cluster, notebook, Ray Train).
unit-fast: $(STAMP) compile
	$(PY) -m pytest -q -m "not system" $(XDIST)

test: lint typecheck unit

# Mosaic Streaming and LitData for ingest bench, without their dependencies (pyproject.toml's
# `peers` extra says why and lists what they need). Not fatal: the bench skips a peer that
# is missing and prints this command.
PEERS_SPEC := mosaicml-streaming==0.13.0 litdata==0.2.76
peers:
	$(PY) -m pip install -q -e ".[peers]" && $(PY) -m pip install -q --no-deps $(PEERS_SPEC) \
		|| echo "make peers: installing $(PEERS_SPEC) failed; ingest bench will skip them"

# ingest bench: this project against Ray Data, a torch DataLoader, HF datasets, Mosaic
# Streaming and LitData (over 25 min on 2 busy cores: the last two convert and read sample
# by sample; `ingest bench --contenders ...` runs a few).
bench: $(STAMP) compile peers
	$(VENV)/bin/ingest bench --json bench.json --plot bench.png
	$(PY) benchmarks/resume.py --json bench-out/resume.json --peers-json bench.json
	$(PY) benchmarks/tokenize_pack.py --docs 2000 --repeat 3 --no-loader
	$(PY) benchmarks/derived_cache.py
	$(PY) benchmarks/stream_vs_pyarrow.py
	$(PY) benchmarks/cold_start.py
	$(PY) benchmarks/shuffle_quality.py
	$(PY) benchmarks/shard_cache.py
	$(PY) benchmarks/dataloader.py
	$(PY) benchmarks/bad_input.py
	$(PY) benchmarks/index_start.py
	$(PY) benchmarks/listing_scale.py
	$(PY) benchmarks/store_latency.py
	$(PY) benchmarks/model_soak.py --minutes 1

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis

# Run notebooks/explore.ipynb and save it with its outputs (text and the throughput plot), so
# that it is committed executed and a reader on the web sees them; tests/test_notebook.py runs
# a copy of it. Timings and stderr (Ray's and tqdm's log lines: dates, local paths) are left
# out, so a rerun changes little beyond the plot.
.PHONY: notebook
notebook: $(STAMP)
	$(PY) -c "import nbclient, nbformat; p = 'notebooks/explore.ipynb'; \
	  nb = nbformat.read(p, as_version=4); \
	  nbclient.NotebookClient(nb, timeout=600, kernel_name='python3', record_timing=False, \
	    resources={'metadata': {'path': 'notebooks'}}).execute(); \
	  [c.update(outputs=[o for o in c.outputs if o.get('name') != 'stderr']) \
	    for c in nb.cells if c.cell_type == 'code']; \
	  nbformat.write(nb, p)"
