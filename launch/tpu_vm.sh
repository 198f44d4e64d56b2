#!/usr/bin/env bash
# A Cloud TPU VM (single or multi-host) for one experiment:
#   launch/tpu_vm.sh create NAME ZONE [ACCELERATOR=v4-8] [VERSION: the accelerator's runtime]   # SPOT=1: a spot VM
#   launch/tpu_vm.sh copy   NAME ZONE            # git HEAD -> ~/ssmgate on every worker, then a Python 3.11 .venv
#   launch/tpu_vm.sh run    NAME ZONE FLAGFILE RUN_DIR [extra --flags ...]   # detached on every worker
#   launch/tpu_vm.sh status NAME ZONE            # per worker: running / exited with status S, last log line
#   launch/tpu_vm.sh stop   NAME ZONE [GRACE_S=300]   # SIGTERM: the run saves and exits 75
#   launch/tpu_vm.sh fetch  NAME ZONE RUN_DIR [LOCAL_DIR=runs/]
#   launch/tpu_vm.sh restart NAME ZONE ACCELERATOR FLAGFILE RUN_DIR [extra --flags ...]   # after a spot preemption
# `copy` ships `git archive HEAD` (commit first) and runs launch/tpu_worker.sh setup on every worker:
# uv builds ~/ssmgate/.venv with Python 3.11 and installs ssmgate with constraints.txt and jax[tpu]
# pinned to its jax version (TPU_ENV_SETUP="..." replaces that command, e.g. for an offline image).
# `run` starts `python -m ssmgate.main --distributed` on --worker=all, detached from the ssh session
# (a dropped connection does not end it); every host calls jax.distributed.initialize() (the TPU
# runtime supplies coordinator and process ids) and logs to RUN_DIR/logs/worker-<i>.log. RUN_DIR
# must be one directory every worker sees (a GCS FUSE or NFS mount): orbax writes one checkpoint
# from all hosts and process 0 writes metrics and summary. `run` again with the same RUN_DIR resumes
# from the last checkpoint. The default runtime (VERSION) follows the accelerator, as Google's TPU
# software versions table says: v6e-* v2-alpha-tpuv6e, v5p-* v2-alpha-tpuv5, v5litepod-* (v5e)
# v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base. A spot VM (SPOT=1) that is preempted
# is gone, and nothing on it restarts the run: `restart` deletes it, creates it again, copies and
# runs the same command, which resumes from RUN_DIR (it must live outside the VM: a bucket or a
# shared mount). DRY=1 prints the gcloud commands only.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,9p' "$0" | sed 's/^# //' >&2; exit 2; }
runtime() {  # the TPU software version for an accelerator type
  case $1 in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*|v5e-*) echo v2-alpha-tpuv5-lite ;;
    *) echo tpu-ubuntu2204-base ;;
  esac
}
[[ $# -ge 3 ]] || usage
action=$1 name=$2 zone=$3; shift 3
say_run() { echo "[tpu_vm] $*"; [[ ${DRY:-0} == 1 ]] || "$@"; }
ssh_all() { say_run gcloud compute tpus tpu-vm ssh "$name" --zone="$zone" --worker=all --command="$1"; }
worker() { printf 'cd ~/ssmgate && bash launch/tpu_worker.sh'; printf ' %q' "$@"; }
case $action in
  create)
    accelerator=${1:-v4-8}
    spot=()
    [[ ${SPOT:-0} == 1 ]] && spot=(--spot)
    say_run gcloud compute tpus tpu-vm create "$name" --zone="$zone" \
      --accelerator-type="$accelerator" --version="${2:-$(runtime "$accelerator")}" "${spot[@]}" ;;
  restart)
    [[ $# -ge 3 ]] || usage
    accelerator=$1; shift
    say_run gcloud compute tpus tpu-vm delete "$name" --zone="$zone" --quiet \
      || echo "[tpu_vm] delete failed (no such VM?): creating it anyway" >&2
    "$0" create "$name" "$zone" "$accelerator"
    "$0" copy "$name" "$zone"
    "$0" run "$name" "$zone" "$@" ;;
  copy)
    if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
      echo "[tpu_vm] warning: uncommitted changes are not shipped (copy sends git HEAD, $(git rev-parse --short HEAD))" >&2
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    [[ ${DRY:-0} == 1 ]] || git archive --format=tar.gz -o "$tmp/ssmgate.tar.gz" HEAD
    say_run gcloud compute tpus tpu-vm scp "$tmp/ssmgate.tar.gz" "$name":~/ssmgate.tar.gz --zone="$zone" --worker=all
    # A fresh tree each time (files deleted since the last copy go), keeping .venv to save the install;
    # never under a running program.
    setup_env=
    [[ -n ${TPU_ENV_SETUP:-} ]] && setup_env="TPU_ENV_SETUP=$(printf '%q' "$TPU_ENV_SETUP") "
    ssh_all "r=~/.ssmgate-run; if [ -f \$r/pid ] && [ ! -f \$r/exit ] && kill -0 \$(cat \$r/pid) 2>/dev/null; then \
echo \"a run is going on this worker (pid \$(cat \$r/pid)): launch/tpu_vm.sh stop first\" >&2; exit 1; fi \
&& mkdir -p ~/ssmgate && find ~/ssmgate -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} + \
&& tar -xzf ~/ssmgate.tar.gz -C ~/ssmgate && cd ~/ssmgate && ${setup_env}bash launch/tpu_worker.sh setup" ;;
  run)
    [[ $# -ge 2 ]] || usage
    flagfile=$1 run_dir=$2; shift 2
    [[ -f $flagfile ]] || { echo "[tpu_vm] flag file $flagfile not found (expected a path relative to the repository)" >&2; exit 2; }
    ssh_all "$(worker start "$run_dir" "$flagfile" "$@")"
    echo "[tpu_vm] started; follow with: launch/tpu_vm.sh status $name $zone   (logs: $run_dir/logs/worker-<i>.log)" ;;
  status)
    ssh_all "$(worker status)" ;;
  stop)
    ssh_all "$(worker stop "${1:-300}")" ;;
  fetch)
    [[ $# -ge 1 ]] || usage
    say_run gcloud compute tpus tpu-vm scp --recurse "$name:$1" "${2:-runs/}" --zone="$zone" --worker=0 ;;
  *) usage ;;
esac
