#!/usr/bin/env bash
# The prepared accelerator check of issue #39 (about 6 minutes on one H200):
#   launch/device_check.sh [extra --flags ...]      e.g. --parts=auto to rerun only a part a first run skipped
# Runs `python -m ssmgate.bench device_check` (ssmgate/bench/device_check.py) with the machine's own
# python3 and JAX, torch and triton (nothing is installed): the Pallas kernels checked against the
# float64 reference on the device, pallas vs chunked vs upstream mamba_ssm's Triton kernels (fill
# third_party/mamba first: launch/fetch_upstream.sh GIT_DIR; without it those rows are skipped with a
# note), one training step of the P2 187M Mamba-3, and the `auto` classes; one table at the end.
# BUDGET_S (default 300) is the check's own budget (no item starts that is not expected to fit);
# `timeout` stops it BUDGET_S + 45 s after the start (SIGTERM, SIGKILL 10 s later; 300 + 55 s fits the
# 6 minutes of issue #39), and what was done is already on disk.
# Writes to $OUT (default runs/device_check): device_check.json, device_check.md, auto_table.json
# (when a core's classes were all measured). DRY=1 prints the command without running it;
# `PYTHON=.venv/bin/python launch/device_check.sh --dry` runs it at toy sizes on a CPU.
# Exit status: the check's (1 if a correctness check failed, 124/137 if killed).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out_dir=${OUT:-runs/device_check}
budget=${BUDGET_S:-300}
if ! [[ $budget =~ ^[0-9]+$ ]]; then
  echo "launch/device_check.sh: BUDGET_S='$budget'; expected a whole number of seconds" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# ssmgate's CPU-side defaults (malloc tuning, an XLA:CPU scheduler flag) are for the 2-core CPU VMs.
export SSMGATE_MALLOC_TUNING=0 SSMGATE_XLA_DEFAULTS=0
# JAX takes 75% of the GPU's memory by default; leave torch (upstream's kernels) its share.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.55}
cmd=("$py" -m ssmgate.bench device_check --budget_s="$budget" --check_out_dir="$out_dir" "$@")
echo "[device_check] ${cmd[*]}"
[[ ${DRY:-0} == 1 ]] && exit 0
mkdir -p "$out_dir"
"$py" -c 'import jax; print("[device_check] jax", jax.__version__, jax.devices())'
exec timeout -k 10 $((budget + 45)) "${cmd[@]}"
