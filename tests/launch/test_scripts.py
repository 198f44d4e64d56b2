"""The launch scripts with DRY=1: each prints the command it would run and checks its arguments."""
import os
import re
import subprocess
import sys
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
    # cores and memory of their own: a site default of 1 CPU per task starves XLA's compilation
    assert "#SBATCH --cpus-per-task=8\n#SBATCH --mem=0\n" in out
    assert (f"srun --gpu-bind=none --cpus-per-task=${{SLURM_CPUS_PER_TASK:-8}} .venv/bin/python -m ssmgate.main "
            f"--distributed --flagfile={FLAGS} --run_dir=/shared/run --mesh_data=32 || status=$?") in out
    assert re.search(r"^  75\).*\n\s+if ! err=\$\(scontrol requeue \"\$SLURM_JOB_ID\" 2>&1\); then", out, re.MULTILINE), out
    res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, "/shared/run"], cwd=REPO, capture_output=True,
                         text=True, env=dict(os.environ, DRY="1", GPUS_PER_NODE="0"))
    assert res.returncode == 2 and "GPUS_PER_NODE=0: expected an integer >= 1" in res.stderr
    res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, "/shared/run"], cwd=REPO, capture_output=True,
                         text=True, env=dict(os.environ, DRY="1", CPUS_PER_GPU="16", MEM_PER_NODE="480G"))
    assert "#SBATCH --cpus-per-task=16\n#SBATCH --mem=480G\n" in res.stdout, res.stderr
    res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, "/shared/run"], cwd=REPO, capture_output=True,
                         text=True, env=dict(os.environ, DRY="1", MEM_PER_NODE="lots"))
    assert res.returncode == 2 and "MEM_PER_NODE=lots: expected 0" in res.stderr


def test_slurm_says_when_the_sites_preemption_has_requeued_the_job_already(tmp_path):
    """On the shims: the run exits 75 (SIM_SRUN_EXIT), scontrol refuses the requeue; the job's state
    tells a site that requeued it (PREEMPTED) from a failure that needs a new submission."""
    shims = Path(__file__).resolve().parent / "shims"
    outputs = {}
    for state in ("PREEMPTED", "RUNNING"):
        run_dir = tmp_path / state
        env = dict(os.environ, PATH=f"{shims}{os.pathsep}{os.environ['PATH']}", SSMGATE_SIM_ROOT=str(tmp_path / "sim"),
                   SSMGATE_SIM_PYTHON=sys.executable, SIM_SRUN_EXIT="75", SIM_REQUEUE_REFUSED="1",
                   SIM_JOB_STATE=state, NODES="1", GPUS_PER_NODE="1")
        res = subprocess.run(["bash", "launch/slurm_gpu.sh", FLAGS, str(run_dir)], cwd=REPO, capture_output=True,
                             text=True, env=env, timeout=60)
        assert res.returncode == 0, res.stderr
        (log,) = run_dir.glob("slurm-*.out")
        outputs[state] = log.read_text()
    job = outputs["PREEMPTED"].split("[slurm_gpu] job ")[1].split(",")[0]
    assert (f"[slurm_gpu] the scheduler has requeued job {job} itself (JobState=PREEMPTED): it resumes from the "
            "checkpoint when it starts again") in outputs["PREEMPTED"]
    assert "scontrol requeue failed" not in outputs["PREEMPTED"]
    assert ("scontrol requeue failed (scontrol (simulated): error: Requested operation is presently disabled for job "
            in outputs["RUNNING"] and "JobState=RUNNING): submit the same command again to resume from the checkpoint"
            in outputs["RUNNING"]), outputs["RUNNING"]


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


def test_tpu_vm_creates_each_accelerator_with_its_runtime_and_restarts_a_preempted_spot_vm():
    for accelerator, runtime in [("v4-32", "tpu-ubuntu2204-base"), ("v5litepod-16", "v2-alpha-tpuv5-lite"),
                                 ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")]:
        res = run("launch/tpu_vm.sh", "create", "vm", "zone-a", accelerator)
        assert f"--accelerator-type={accelerator} --version={runtime}\n" in res.stdout, res.stdout + res.stderr
    res = subprocess.run(["bash", "launch/tpu_vm.sh", "restart", "vm", "zone-a", "v6e-8", FLAGS, "gs://b/run",
                          "--steps=9"], cwd=REPO, capture_output=True, text=True, env=dict(os.environ, DRY="1",
                                                                                          SPOT="1"))
    assert res.returncode == 0, res.stderr
    steps = [line for line in res.stdout.splitlines() if line.startswith("[tpu_vm] gcloud")]
    assert steps[0] == "[tpu_vm] gcloud compute tpus tpu-vm delete vm --zone=zone-a --quiet"
    assert steps[1] == ("[tpu_vm] gcloud compute tpus tpu-vm create vm --zone=zone-a --accelerator-type=v6e-8 "
                        "--version=v2-alpha-tpuv6e --spot")
    assert "tpu-vm scp" in steps[2] and "tpu_worker.sh setup" in steps[3]
    assert steps[4].endswith(f"tpu_worker.sh start gs://b/run {FLAGS} --steps=9")


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
