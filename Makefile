# ssmgate: every target creates and uses the local virtual environment .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_OUT ?= runs/bench
SCALE ?= quick
ONLY ?=
BFCL_EVAL_VERSION := 2026.3.23

.PHONY: venv test test-slow bench bench-docs reproduce reproduce-docs clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# tpu: libtpu, for the tests that compile the kernels for TPU topologies (on CPU-only machines too;
	# ssmgate/platform_env.py keeps ordinary runs on the CPU platform there).
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,plot,tensorboard,tpu]'
	# BFCL's data files (ssmgate.tasks.bfcl); --no-deps: only its JSON is used, its pins would clash.
	$(PY) -m pip install --quiet --no-deps bfcl-eval==$(BFCL_EVAL_VERSION)
	touch $(STAMP)

# The test command of the README (and of .ci/run): the fast suite, one file per worker process
# (the suite is mostly XLA compilation, single-threaded, which tests/conftest.py makes cheaper: LLVM -O0 and a
# persistent compilation cache per worker; docs/benchmarks.md has its measured time on 2 cores).
TEST_WORKERS ?= 2
test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# Long reproductions and large-size checks.
test-slow: venv
	$(PY) -m pytest -q -m slow

# Core benchmark: prints the table, writes $(BENCH_OUT)/cores.json.
bench: venv
	$(PY) -m ssmgate.bench cores --out $(BENCH_OUT)/cores.json

# Regenerates docs/benchmarks.md (cores, the chunked form's ceiling, Fig 1 sweeps, training sweep per step and end to end, throughput) and the measured auto table (ssmgate/cores/auto_table.json).
bench-docs: venv
	$(PY) -m ssmgate.bench cores --out $(BENCH_OUT)/cores.json --reps 7 --write_auto_table --docs docs/benchmarks.md
	$(PY) -m ssmgate.bench ssd_ceiling --out $(BENCH_OUT)/ssd_ceiling.json --reps 9 --docs docs/benchmarks.md
	$(PY) -m ssmgate.bench fig1_sweeps --out $(BENCH_OUT)/sweeps.json --docs docs/benchmarks.md
	$(PY) -m ssmgate.bench sweep --out $(BENCH_OUT)/train.json --docs docs/benchmarks.md

# The main job: every experiment at SCALE (quick | cpu | paper), ONLY=name,... to select;
# writes runs/reproduce/report.md and runs/reproduce/summary.json.
reproduce: venv
	$(PY) -m ssmgate.reproduce --scale=$(SCALE) --only=$(ONLY) --out_dir=runs/reproduce

# Regenerates experiments of the committed cpu-scale report in docs/reproduction/ (on purpose; the others' sections
# are kept; docs/reproduction.md has each experiment's measured time). Runs resume from their checkpoints in
# runs/reproduce-cpu (a complete run keeps its earlier wall time, one resumed partway reports none): remove
# runs/reproduce-cpu/<experiment> first for a full rerun and a true wall time.
reproduce-docs: venv
	$(PY) -m ssmgate.reproduce --scale=cpu --only=$(ONLY) --out_dir=runs/reproduce-cpu --docs_dir=docs/reproduction

clean:
	rm -rf $(VENV) runs .pytest_cache
