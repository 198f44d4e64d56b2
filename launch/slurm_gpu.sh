#!/usr/bin/env bash
# One experiment on a SLURM GPU cluster, one task per host (each task drives all its GPUs):
#   NODES=4 GPUS_PER_NODE=8 launch/slurm_gpu.sh FLAGFILE RUN_DIR [extra --flags ...]
# Submits an sbatch job (extra sbatch options: SBATCH_ARGS="--partition=... --time=...") that
# runs `python -m ssmgate.main --distributed` with srun; jax.distributed.initialize() reads the
# coordinator and process ids from SLURM. RUN_DIR must be on a filesystem all nodes share.
# The job uses the repository's .venv (make venv, plus a CUDA jax: pip install -U "jax[cuda12]").
# DRY=1 prints the job script instead of submitting it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 || ! -f "$1" ]]; then
  echo "usage: [NODES=n GPUS_PER_NODE=g] launch/slurm_gpu.sh FLAGFILE RUN_DIR [extra --flags ...]" >&2
  exit 2
fi
flagfile=$1 run_dir=$2; shift 2
nodes=${NODES:-1} gpus=${GPUS_PER_NODE:-8}
script=$(cat <<JOB
#!/usr/bin/env bash
#SBATCH --job-name=ssmgate-$(basename "${flagfile%.flags}")
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$gpus
#SBATCH --output=$run_dir/slurm-%j.out
set -euo pipefail
cd $(pwd)
srun .venv/bin/python -m ssmgate.main --distributed --flagfile=$flagfile --run_dir=$run_dir $*
JOB
)
echo "[slurm_gpu] $nodes node(s) x $gpus GPU(s): $flagfile -> $run_dir"
if [[ ${DRY:-0} == 1 ]]; then echo "$script"; exit 0; fi
mkdir -p "$run_dir"
echo "$script" | sbatch ${SBATCH_ARGS:-}
