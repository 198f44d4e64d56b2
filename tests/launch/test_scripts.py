"""The launch scripts with DRY=1: each prints the command it would run and checks its arguments."""
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FLAGS = "experiments/train/quick/mamba2_copy.flags"


def run(*args):
    return subprocess.run(["bash", *args], cwd=REPO, capture_output=True, text=True, env=dict(os.environ, DRY="1"))


def test_local_prints_the_main_command_with_a_default_run_dir():
    res = run("launch/local.sh", FLAGS, "--steps=5")
    assert res.returncode == 0, res.stderr
    assert f"-m ssmgate.main --flagfile={FLAGS} --run_dir=runs/mamba2_copy --steps=5" in res.stdout


def test_local_refuses_a_missing_flag_file():
    res = run("launch/local.sh", "experiments/nope.flags")
    assert res.returncode == 2 and "FLAGFILE must exist" in res.stderr


def test_slurm_writes_one_task_per_gpu_that_requeues_on_exit_75():
    res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, "/shared/run", "--mesh_data=32"], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, DRY="1", NODES="4", GPUS_PER_NODE="8"))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # one process per GPU, each seeing all GPUs of its node (JAX binds process i to GPU SLURM_LOCALID = i)
    assert "#SBATCH --nodes=4" in out and "#SBATCH --ntasks-per-node=8" in out and "#SBATCH --gpus-per-node=8" in out
    assert "gpus-per-task" not in out and "ntasks-per-node=1\n" not in out
    assert "#SBATCH --requeue" in out and "#SBATCH --signal=TERM@120" in out and "#SBATCH --open-mode=append" in out
    assert (f"srun --gpu-bind=none .venv/bin/python -m ssmgate.main --distributed --flagfile={FLAGS} "
            "--run_dir=/shared/run --mesh_data=32 || status=$?") in out
    assert re.search(r"^  75\).*\n\s+scontrol requeue \"\$SLURM_JOB_ID\"", out, re.MULTILINE), out
    res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, "/shared/run"], cwd=REPO, capture_output=True,
                         text=True, env=dict(os.environ, DRY="1", GPUS_PER_NODE="0"))
    assert res.returncode == 2 and "GPUS_PER_NODE=0: expected an integer >= 1" in res.stderr


def test_tpu_vm_runs_detached_on_every_worker_with_distributed():
    res = run("launch/tpu_vm.sh", "run", "vm", "zone-a", FLAGS, "/mnt/run", "--steps=9")
    assert res.returncode == 0, res.stderr
    assert ("tpu-vm ssh vm --zone=zone-a --worker=all --command=cd ~/ssmgate && bash launch/tpu_worker.sh start "
            f"/mnt/run {FLAGS} --steps=9") in res.stdout
    for action, worker_cmd in (("status", "status"), ("stop", "stop 300")):
        res = run("launch/tpu_vm.sh", action, "vm", "zone-a")
        assert res.returncode == 0 and f"--worker=all --command=cd ~/ssmgate && bash launch/tpu_worker.sh {worker_cmd}" \
            in res.stdout, res.stdout + res.stderr
    res = run("launch/tpu_vm.sh", "bogus", "vm", "zone-a")
    assert res.returncode == 2 and "create NAME ZONE" in res.stderr and "stop   NAME ZONE" in res.stderr


def test_tpu_vm_copy_builds_a_python_311_env_with_jax_tpu_pinned_to_the_constraints():
    res = run("launch/tpu_vm.sh", "copy", "vm", "zone-a")
    assert res.returncode == 0, res.stderr
    assert "tpu-vm scp" in res.stdout and "bash launch/tpu_worker.sh setup" in res.stdout
    jax_pin = re.search(r"^jax==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE).group(1)
    res = subprocess.run(["bash", "launch/tpu_worker.sh", "setup"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, DRY="1", TPU_WORKER_ID="3"))
    assert res.returncode == 0, res.stderr
    assert "[worker 3] environment: python3 -m pip install --user --quiet uv" in res.stdout
    assert "uv venv --quiet --allow-existing --python 3.11 .venv" in res.stdout
    assert f"uv pip install --quiet --python .venv/bin/python -c constraints.txt -e . 'jax[tpu]=={jax_pin}'" in res.stdout
    res = subprocess.run(["bash", "launch/tpu_worker.sh", "setup"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, DRY="1", TPU_WORKER_ID="3", TPU_ENV_SETUP="ln -s /opt/venv .venv"))
    assert "[worker 3] environment: ln -s /opt/venv .venv" in res.stdout


def test_device_bench_prints_the_device_benchmark_and_checks_its_backend():
    res = run("launch/device_bench.sh", "gpu", "--reps=3")
    assert res.returncode == 0, res.stderr
    assert ("-m ssmgate.bench cores --backend=gpu --chunk_sizes=64 --reps=5 --max_seconds=5 --write_auto_table "
            "--out runs/device/device_bench.json --report runs/device/device_bench.md --reps=3") in res.stdout
    res = run("launch/device_bench.sh", "cuda")
    assert res.returncode == 2 and "[gpu|tpu]" in res.stderr
