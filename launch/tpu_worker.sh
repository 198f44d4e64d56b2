#!/usr/bin/env bash
# The worker side of launch/tpu_vm.sh: runs on every host of a TPU VM, in ~/ssmgate (the copy), over
# `gcloud ... ssh --worker=all`. Not meant to be called by hand, though it can be (on a worker):
#   bash launch/tpu_worker.sh setup                          # Python >= 3.11 env in .venv, pinned installs (DRY=1: print it)
#   bash launch/tpu_worker.sh start RUN_DIR FLAGFILE [extra --flags ...]   # detached run, log, pid file
#   bash launch/tpu_worker.sh status                         # running / exited with status S, last log line
#   bash launch/tpu_worker.sh stop [GRACE_S=300]             # SIGTERM (save, exit 75); SIGKILL after GRACE_S
# The worker index names the log (RUN_DIR/logs/worker-<i>.log): TPU_WORKER_ID if set, else the GCE
# metadata server's agent-worker-number (what JAX's TPU detection reads), else the host name.
# A run's pid, exit status and log path are kept in ~/.ssmgate-run/ on the worker.
# TPU_ENV_SETUP replaces the environment-building command of `setup` (run in ~/ssmgate; it must
# leave a .venv/bin/python): the simulated pods of tests/launch/ link an existing venv with it.
set -euo pipefail
cd "$(dirname "$0")/.."
state=$HOME/.ssmgate-run

worker_id() {
  if [[ -n ${TPU_WORKER_ID:-} ]]; then echo "$TPU_WORKER_ID"; return; fi
  curl -sf -m 5 -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number 2>/dev/null \
    || hostname
}
id=$(worker_id)
say() { echo "[worker $id] $*"; }
die() { echo "[worker $id] $*" >&2; exit 1; }

running() { [[ -f $state/pid && ! -f $state/exit ]] && kill -0 "$(cat "$state/pid")" 2>/dev/null; }

setup() {
  local jax_version
  jax_version=$(sed -n 's/^jax==\([^ ;#]*\).*/\1/p' constraints.txt)
  [[ -n $jax_version ]] || die "constraints.txt pins no jax version (expected a line jax==X.Y.Z)"
  # uv (from PyPI, into the user site of the image's python3) fetches a Python 3.11 build when the
  # image has none (tpu-ubuntu2204-base ships 3.10, below ssmgate's python_requires >= 3.11).
  local default="python3 -m pip install --user --quiet uv && python3 -m uv venv --quiet --allow-existing --python 3.11 .venv \
&& python3 -m uv pip install --quiet --python .venv/bin/python -c constraints.txt -e . 'jax[tpu]==$jax_version'"
  local cmd=${TPU_ENV_SETUP:-$default}
  say "environment: $cmd"
  [[ ${DRY:-0} == 1 ]] && return
  bash -c "$cmd"
  [[ -x .venv/bin/python ]] || die "the environment step left no .venv/bin/python (expected a virtual environment in ~/ssmgate/.venv)"
  .venv/bin/python -c 'import sys, jax, ssmgate
assert sys.version_info >= (3, 11), f"Python {sys.version.split()[0]}: ssmgate needs >= 3.11"
print(f"[worker '"$id"'] ready: Python {sys.version.split()[0]}, jax {jax.__version__}, ssmgate from {ssmgate.__path__[0]}")'
}

start() {
  [[ $# -ge 2 ]] || die "start: expected RUN_DIR FLAGFILE [extra --flags ...]"
  local run_dir=$1 flagfile=$2; shift 2
  [[ -x .venv/bin/python ]] || die "no ~/ssmgate/.venv: run launch/tpu_vm.sh copy first"
  [[ -f $flagfile ]] || die "flag file $flagfile is not in the copy (expected a path relative to the repository; commit it and copy again)"
  if running; then die "a run is still going (pid $(cat "$state/pid"), log $(cat "$state/log")): launch/tpu_vm.sh stop first"; fi
  mkdir -p "$state" "$run_dir/logs"
  local log=$run_dir/logs/worker-$id.log
  rm -f "$state/pid" "$state/exit"
  echo "$log" > "$state/log"
  local cmd=(.venv/bin/python -m ssmgate.main --distributed --flagfile="$flagfile" --run_dir="$run_dir" "$@")
  echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) worker $id: ${cmd[*]}" >> "$log"
  # setsid + nohup: the run belongs to no ssh session, so a dropped connection leaves it running;
  # the wrapper shell records the program's exit status when it ends.
  setsid nohup bash -c '"${@:3}" >> "$1" 2>&1 & echo $! > "$2/pid"; wait $!; echo $? > "$2/exit"' \
    wrapper "$log" "$state" "${cmd[@]}" > /dev/null 2>&1 < /dev/null &
  for _ in $(seq 100); do [[ -s $state/pid ]] && break; sleep 0.1; done
  [[ -s $state/pid ]] || die "the run did not start (no pid after 10 s); see $log"
  say "started pid $(cat "$state/pid"): ${cmd[*]}"
  say "log: $log"
}

status() {
  if [[ ! -f $state/log ]]; then say "no run started here"; return; fi
  local log
  log=$(cat "$state/log")
  if running; then
    say "running (pid $(cat "$state/pid"))"
  elif [[ -f $state/exit ]]; then
    local s
    s=$(cat "$state/exit")
    case $s in
      0) say "exited with status 0 (finished)" ;;
      75) say "exited with status 75 (saved a checkpoint and stopped on request: run again to resume)" ;;
      *) say "exited with status $s (failed or killed: see the log; run again to resume from the last checkpoint)" ;;
    esac
  else
    say "not running, exit status unknown (the worker restarted?)"
  fi
  say "last log line: $(grep -v '^\s*$' "$log" 2>/dev/null | tail -n 1 | cut -c1-300)"
}

stop() {
  local grace=${1:-300}
  [[ $grace =~ ^[0-9]+$ ]] || die "stop: GRACE_S=$grace: expected whole seconds"
  if ! running; then status; return; fi
  local pid
  pid=$(cat "$state/pid")
  kill -TERM "$pid"
  say "SIGTERM sent to pid $pid: the run saves after its current step and exits with status 75 (waiting up to ${grace}s)"
  for _ in $(seq $((grace * 10))); do running || break; sleep 0.1; done
  if running; then
    # A process whose peer is gone waits in a collective and never reaches the step boundary.
    say "still running after ${grace}s (a peer gone?): SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do [[ -f $state/exit ]] && break; sleep 0.1; done
  fi
  status
}

action=${1:-}
[[ $# -gt 0 ]] && shift
case $action in
  setup) setup ;;
  start) start "$@" ;;
  status) status ;;
  stop) stop "$@" ;;
  *) die "unknown action '$action': expected setup, start, status or stop" ;;
esac
