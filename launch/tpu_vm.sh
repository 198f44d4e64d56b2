#!/usr/bin/env bash
# A Cloud TPU VM (single or multi-host) for one experiment, in four steps:
#   launch/tpu_vm.sh create NAME ZONE [ACCELERATOR=v4-8] [VERSION=tpu-ubuntu2204-base]
#   launch/tpu_vm.sh copy   NAME ZONE            # this checkout -> ~/ssmgate on every worker, then installs it
#   launch/tpu_vm.sh run    NAME ZONE FLAGFILE RUN_DIR [extra --flags ...]
#   launch/tpu_vm.sh fetch  NAME ZONE RUN_DIR [LOCAL_DIR=runs/]
# `run` starts `python -m ssmgate.main --distributed` on --worker=all: every host calls
# jax.distributed.initialize() (the TPU runtime supplies coordinator and process ids). RUN_DIR
# must be one directory every worker sees (a GCS FUSE or NFS mount): orbax writes one checkpoint
# from all hosts and process 0 writes metrics and summary. DRY=1 prints the gcloud commands only.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,6p' "$0" | sed 's/^# //' >&2; exit 2; }
[[ $# -ge 3 ]] || usage
action=$1 name=$2 zone=$3; shift 3
say_run() { echo "[tpu_vm] $*"; [[ ${DRY:-0} == 1 ]] || "$@"; }
ssh_all() { say_run gcloud compute tpus tpu-vm ssh "$name" --zone="$zone" --worker=all --command="$1"; }
case $action in
  create)
    say_run gcloud compute tpus tpu-vm create "$name" --zone="$zone" \
      --accelerator-type="${1:-v4-8}" --version="${2:-tpu-ubuntu2204-base}" ;;
  copy)
    archive=$(mktemp -d)/ssmgate.tar.gz
    git archive --format=tar.gz -o "$archive" HEAD
    say_run gcloud compute tpus tpu-vm scp "$archive" "$name":~/ssmgate.tar.gz --zone="$zone" --worker=all
    ssh_all "mkdir -p ~/ssmgate && tar -xzf ~/ssmgate.tar.gz -C ~/ssmgate && cd ~/ssmgate && \
      python3 -m pip install -q -c constraints.txt -e . && python3 -m pip install -q 'jax[tpu]'" ;;
  run)
    [[ $# -ge 2 ]] || usage
    flagfile=$1 run_dir=$2; shift 2
    ssh_all "cd ~/ssmgate && python3 -m ssmgate.main --distributed --flagfile=$flagfile --run_dir=$run_dir $*" ;;
  fetch)
    [[ $# -ge 1 ]] || usage
    say_run gcloud compute tpus tpu-vm scp --recurse "$name:$1" "${2:-runs/}" --zone="$zone" --worker=0 ;;
  *) usage ;;
esac
