#!/usr/bin/env bash
# One experiment on a SLURM GPU cluster, one process per GPU:
#   NODES=4 GPUS_PER_NODE=8 launch/slurm_gpu.sh FLAGFILE RUN_DIR [extra --flags ...]
# Submits an sbatch job (extra sbatch options: SBATCH_ARGS="--partition=... --time=...") whose srun
# starts NODES x GPUS_PER_NODE tasks of `python -m ssmgate.main --distributed`. One task per GPU
# because that is the layout JAX's SLURM detection expects: jax.distributed.initialize() takes the
# coordinator from SLURM_STEP_NODELIST and SLURM_JOB_ID, the process from SLURM_PROCID, and binds
# each process to the one local GPU numbered SLURM_LOCALID (so every task must see all the GPUs of
# its node: no --gpus-per-task, srun --gpu-bind=none). One task per node would train on one GPU
# per node.
# Each task gets CPUS_PER_GPU cores (default 8: XLA compiles and the data loader reads on them; a
# site default of 1 CPU per task starves both) and each node MEM_PER_NODE memory (default 0: all of
# the node's, as whole nodes should be taken).
# Preemption and the time limit: SLURM sends SIGTERM to the tasks 120 s before the end
# (--signal=TERM@120; SIGNAL_S=seconds to change); the run finishes its step, saves a checkpoint
# and exits with status 75; the job then requeues itself (scontrol requeue, --requeue) and the
# requeued job resumes from RUN_DIR. Where the site's preemption requeues jobs itself, scontrol
# refuses a second requeue: the script then reads the job's state and says that the scheduler
# requeued it. Any other exit status ends the job. RUN_DIR must be on a filesystem all nodes share.
# The job uses the repository's .venv (make venv, plus a CUDA jax: pip install -U "jax[cuda12]").
# DRY=1 prints the job script instead of submitting it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 || ! -f "$1" ]]; then
  echo "usage: [NODES=n GPUS_PER_NODE=g] launch/slurm_gpu.sh FLAGFILE RUN_DIR [extra --flags ...]   (FLAGFILE must exist; got '${1:-}')" >&2
  exit 2
fi
flagfile=$1 run_dir=$2; shift 2
nodes=${NODES:-1} gpus=${GPUS_PER_NODE:-8} cpus=${CPUS_PER_GPU:-8} mem=${MEM_PER_NODE:-0}
for v in "NODES=$nodes" "GPUS_PER_NODE=$gpus" "SIGNAL_S=${SIGNAL_S:-120}" "CPUS_PER_GPU=$cpus"; do
  [[ ${v#*=} =~ ^[1-9][0-9]*$ ]] || { echo "[slurm_gpu] $v: expected an integer >= 1" >&2; exit 2; }
done
[[ $mem =~ ^[0-9]+[KMGT]?$ ]] || { echo "[slurm_gpu] MEM_PER_NODE=$mem: expected 0 (all of the node's) or a size such as 480G" >&2; exit 2; }
if [[ $run_dir =~ [[:space:]] ]]; then
  echo "[slurm_gpu] RUN_DIR '$run_dir' contains whitespace: expected a path without (#SBATCH --output cannot quote it)" >&2
  exit 2
fi
signal_s=${SIGNAL_S:-120}  # seconds before the time limit that SIGTERM arrives: enough for one step and a save
q() { printf '%q' "$1"; }
extra=$(printf ' %q' "$@")
[[ $# -gt 0 ]] || extra=
script=$(cat <<JOB
#!/usr/bin/env bash
#SBATCH --job-name=ssmgate-$(basename "${flagfile%.flags}")
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$gpus
#SBATCH --gpus-per-node=$gpus
#SBATCH --cpus-per-task=$cpus
#SBATCH --mem=$mem
#SBATCH --output=$run_dir/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=TERM@$signal_s
set -uo pipefail
cd $(q "$PWD")
echo "[slurm_gpu] job \$SLURM_JOB_ID, start \${SLURM_RESTART_COUNT:-0} (requeues so far), \$SLURM_NTASKS tasks on \$SLURM_JOB_NODELIST"
# SLURM signals the tasks themselves (--signal above); on preemption it signals this shell too:
# the trap keeps the shell alive until srun returns, to read the run's exit status.
trap 'echo "[slurm_gpu] SIGTERM: waiting for the run to save"' TERM
status=0
# srun takes --cpus-per-task from the job only when told (SLURM >= 22.05 no longer passes it on).
srun --gpu-bind=none --cpus-per-task=\${SLURM_CPUS_PER_TASK:-$cpus} .venv/bin/python -m ssmgate.main --distributed --flagfile=$(q "$flagfile") --run_dir=$(q "$run_dir")$extra || status=\$?
case \$status in
  0) echo "[slurm_gpu] the run finished: $run_dir/summary.json" ;;
  75) echo "[slurm_gpu] the run saved a checkpoint and stopped (exit 75): requeueing job \$SLURM_JOB_ID to resume"
      if ! err=\$(scontrol requeue "\$SLURM_JOB_ID" 2>&1); then
        # A site whose preemption requeues jobs itself has done so already: scontrol then refuses.
        state=\$(scontrol show job "\$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | head -n 1)
        case \${state#JobState=} in
          PREEMPTED|REQUEUED|REQUEUE_HOLD|REQUEUE_FED|PENDING)
            echo "[slurm_gpu] the scheduler has requeued job \$SLURM_JOB_ID itself (\$state): it resumes from the checkpoint when it starts again" ;;
          *) echo "[slurm_gpu] scontrol requeue failed (\$err; \${state:-job state unknown}): submit the same command again to resume from the checkpoint" >&2 ;;
        esac
        exit 75
      fi ;;
  *) echo "[slurm_gpu] the run failed with exit status \$status: not requeued" >&2; exit "\$status" ;;
esac
JOB
)
echo "[slurm_gpu] $nodes node(s) x $gpus GPU(s), one process per GPU: $flagfile -> $run_dir"
if [[ ${DRY:-0} == 1 ]]; then echo "$script"; exit 0; fi
mkdir -p "$run_dir"
# shellcheck disable=SC2086  # SBATCH_ARGS is a list of options
echo "$script" | sbatch ${SBATCH_ARGS:-}
