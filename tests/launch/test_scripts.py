"""The launch scripts with DRY=1: each prints the command it would run and checks its arguments."""
import os
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


def test_slurm_writes_one_task_per_node_with_distributed():
    res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, "/shared/run"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, DRY="1", NODES="4", GPUS_PER_NODE="8"))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "#SBATCH --nodes=4" in out and "#SBATCH --ntasks-per-node=1" in out and "#SBATCH --gpus-per-node=8" in out
    assert f"srun .venv/bin/python -m ssmgate.main --distributed --flagfile={FLAGS} --run_dir=/shared/run" in out


def test_tpu_vm_runs_on_every_worker_with_distributed():
    res = run("launch/tpu_vm.sh", "run", "vm", "zone-a", FLAGS, "/mnt/run", "--steps=9")
    assert res.returncode == 0, res.stderr
    assert "tpu-vm ssh vm --zone=zone-a --worker=all" in res.stdout
    assert f"python3 -m ssmgate.main --distributed --flagfile={FLAGS} --run_dir=/mnt/run --steps=9" in res.stdout
    res = run("launch/tpu_vm.sh", "bogus", "vm", "zone-a")
    assert res.returncode == 2 and "create NAME ZONE" in res.stderr


def test_device_bench_prints_the_device_benchmark_and_checks_its_backend():
    res = run("launch/device_bench.sh", "gpu", "--reps=3")
    assert res.returncode == 0, res.stderr
    assert ("-m ssmgate.bench cores --backend=gpu --chunk_sizes=64 --reps=5 --max_seconds=5 --write_auto_table "
            "--out runs/device/device_bench.json --report runs/device/device_bench.md --reps=3") in res.stdout
    res = run("launch/device_bench.sh", "cuda")
    assert res.returncode == 2 and "[gpu|tpu]" in res.stderr
