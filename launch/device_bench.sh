#!/usr/bin/env bash
# The prepared device check of issue #9: launch/device_bench.sh [gpu|tpu] [extra --flags ...]
# On a machine with the accelerator: checks the Pallas kernels against the float64 reference on the
# device, times pallas vs chunked vs associative at Mamba-2-130M-like sizes (b=8 t=2048 h=24 p=64
# n=128, bf16) with the fraction of the measured roofline, then measures the `auto` classes with
# pallas among the candidates (chunk 64 only: ~100 compilations, most of the run). About 5-10
# minutes on one H200 (an estimate: not yet run on one).
# Uses the machine's own python3 and JAX (accelerator machines are often offline: nothing is
# installed), with the repository on PYTHONPATH. Writes to $OUT (default runs/device):
# device_bench.json, device_bench.md, and auto_table.json (ssmgate/cores/auto_table.json with the
# device's classes added: commit it so that `auto` picks pallas where it measured faster).
# DRY=1 prints the command without running it. Exit status: the benchmark's (1 if a check failed).
set -euo pipefail
cd "$(dirname "$0")/.."
backend=${1:-gpu}
[[ $# -gt 0 ]] && shift
if [[ $backend != gpu && $backend != tpu ]]; then
  echo "usage: launch/device_bench.sh [gpu|tpu] [extra --flags ...]   (got backend '$backend')" >&2
  exit 2
fi
py=${PYTHON:-python3}
out_dir=${OUT:-runs/device}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# ssmgate's CPU-side defaults (malloc tuning, an XLA:CPU scheduler flag) are for the 2-core CPU VMs.
export SSMGATE_MALLOC_TUNING=0 SSMGATE_XLA_DEFAULTS=0
cmd=("$py" -m ssmgate.bench cores --backend="$backend" --chunk_sizes=64 --reps=5 --max_seconds=5
     --write_auto_table --out "$out_dir/device_bench.json" --report "$out_dir/device_bench.md" "$@")
echo "[device_bench] ${cmd[*]}"
[[ ${DRY:-0} == 1 ]] && exit 0
mkdir -p "$out_dir"
"$py" -c 'import jax; print("[device_bench] jax", jax.__version__, jax.devices())'
status=0
"${cmd[@]}" || status=$?
cp ssmgate/cores/auto_table.json "$out_dir/auto_table.json"
exit "$status"
