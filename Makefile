# ssmgate: every target creates and uses the local virtual environment .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_OUT ?= runs/bench

.PHONY: venv test test-slow bench bench-docs reproduce clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,plot]'
	touch $(STAMP)

# The test command of the README (and of .ci/run): the fast suite.
test: venv
	$(PY) -m pytest -q

# Long reproductions and large-size checks.
test-slow: venv
	$(PY) -m pytest -q -m slow

# Core benchmark: prints the table, writes $(BENCH_OUT)/cores.json.
bench: venv
	$(PY) -m ssmgate.bench cores --out $(BENCH_OUT)/cores.json

# Regenerates docs/benchmarks.md and the measured auto table (ssmgate/cores/auto_table.json).
bench-docs: venv
	$(PY) -m ssmgate.bench cores --out $(BENCH_OUT)/cores.json --reps 7 --write_auto_table --docs docs/benchmarks.md

# The main job. Until the first reproduction lands (issue #3) it runs the core benchmark and writes
# runs/reproduce/report.md.
reproduce: venv
	$(PY) -m ssmgate.bench cores --out runs/reproduce/cores.json --report runs/reproduce/report.md

clean:
	rm -rf $(VENV) runs .pytest_cache
