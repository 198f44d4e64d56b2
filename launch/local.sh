#!/usr/bin/env bash
# Runs one experiment on this machine: launch/local.sh FLAGFILE [RUN_DIR] [extra --flags ...]
# RUN_DIR defaults to runs/<flag file name>; an existing RUN_DIR resumes from its last checkpoint.
# DRY=1 prints the command without running it. Uses the repository's .venv (make venv).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 || ! -f "$1" ]]; then
  echo "usage: launch/local.sh FLAGFILE [RUN_DIR] [extra --flags ...]   (FLAGFILE must exist; got '${1:-}')" >&2
  exit 2
fi
flagfile=$1; shift
run_dir="runs/$(basename "${flagfile%.flags}")"
if [[ $# -gt 0 && $1 != --* ]]; then run_dir=$1; shift; fi
py=.venv/bin/python
cmd=("$py" -m ssmgate.main --flagfile="$flagfile" --run_dir="$run_dir" "$@")
echo "[local] ${cmd[*]}"
[[ ${DRY:-0} == 1 ]] && exit 0  # before the venv: a dry run builds nothing
[[ -x $py ]] || { echo "[local] .venv missing: running 'make venv' first" >&2; make venv; }
exec "${cmd[@]}"
