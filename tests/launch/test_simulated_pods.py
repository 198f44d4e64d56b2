"""The launch scripts end to end on simulated pods: tests/launch/shims/ (first on PATH) stand in for
sbatch/srun/scontrol and gcloud and start the scripts' commands as local processes with the
environment each host would have. Every run is a real jax.distributed job on localhost: 2 processes
x 2 CPU devices = 4 global devices, the batch sharded over all 4 (--mesh_data=4), checkpoints
every 5 steps, summary.json written by process 0.

- SLURM: submit -> 2 tasks -> done (the reference run); and submit -> SIGTERM to the tasks mid-run
  (what --signal=TERM@120 does) -> both save and exit 75 -> the job requeues itself -> the requeued
  job resumes -> the same final params_digest as the reference.
- TPU VM: create -> copy -> run (detached) -> status -> SIGKILL one worker mid-run -> status, stop
  (the survivor waits in a collective: SIGKILL after the grace time) -> run again (resumes) ->
  fetch -> the same final params_digest as the reference.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIMS = Path(__file__).resolve().parent / "shims"
FLAGFILE = "experiments/train/quick/mamba2_copy.flags"
STEPS = 30
SMALL = ["--d_model=32", "--n_layers=2", "--d_state=8", "--headdim=16", "--batch=8", "--seq_len=15",
         f"--steps={STEPS}", "--opt_warmup_steps=2", "--log_every=1", "--eval_every=0", "--ckpt_every=5",
         "--mesh_data=4", "--tensorboard=false"]
TIMEOUT_S = 240  # any one launcher command, the runs included (about 15-20 s each on 2 idle cores)


def sim_env(root: Path, **extra) -> dict:
    return dict(os.environ, PATH=f"{SHIMS}{os.pathsep}{os.environ['PATH']}", SSMGATE_SIM_ROOT=str(root),
                SSMGATE_SIM_PYTHON=sys.executable, **extra)


def start(args, env) -> subprocess.Popen:
    """A launch script in its own process group (killed whole by `finish`)."""
    return subprocess.Popen(["bash", *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout=TIMEOUT_S) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out
    finally:
        kill_group(proc.pid)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def launch(args, env, ok=True) -> str:
    proc = start(args, env)
    out = finish(proc)
    if ok:
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def wait_for(predicate, what: str, ended=lambda: None, timeout=TIMEOUT_S, poll=0.05):
    """predicate()'s first true value; fails at once with the text of ended() once that is not None
    (the run ended without it), or after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        text = ended()
        if text is not None:
            raise AssertionError(f"the run ended before {what}:\n{text[-4000:]}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def last_step(log: Path) -> int:
    steps = re.findall(rf"\[train\] step (\d+)/{STEPS}", log.read_text()) if log.exists() else []
    return int(steps[-1]) if steps else 0


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted SLURM job: (run_dir, its job output)."""
    root = tmp_path_factory.mktemp("slurm_ref")
    run_dir = root / "run"
    out = launch(["launch/slurm_gpu.sh", FLAGFILE, str(run_dir), *SMALL],
                 sim_env(root, NODES="1", GPUS_PER_NODE="2"))
    job = re.search(r"Submitted batch job (\d+)", out).group(1)
    return run_dir, (run_dir / f"slurm-{job}.out").read_text(), root / "jobs" / job


def test_slurm_job_runs_one_process_per_device_over_every_device(reference):
    run_dir, output, job_dir = reference
    # one task per (simulated) GPU, each with its 2 CPU devices, joined into one 4-device mesh
    assert "[ssmgate] process 0/2: 2 local of 4 devices" in output
    assert "[ssmgate] process 1/2: 2 local of 4 devices" in output
    assert "[slurm_gpu] the run finished" in output, output[-3000:]
    assert json.loads((job_dir / "history.json").read_text()) == [0]  # one start, no requeue
    s = summary(run_dir)
    assert s["steps"] == STEPS and s["resumed_from"] is None and len(s["params_digest"]) == 64
    assert str(STEPS) in os.listdir(run_dir / "checkpoints")


def test_slurm_job_preempted_mid_run_saves_requeues_and_resumes_bit_identically(reference, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(["launch/slurm_gpu.sh", FLAGFILE, str(run_dir), *SMALL],
                 sim_env(tmp_path, NODES="1", GPUS_PER_NODE="2"))
    try:
        job_dir = tmp_path / "jobs" / "1000"
        output = run_dir / "slurm-1000.out"
        wait_for(lambda: last_step(output) >= 8, "step 8 of the first start",
                 ended=lambda: None if proc.poll() is None else output.read_text())
        # the scheduler's notice before the time limit (--signal=TERM@120): SIGTERM to every task
        for pid_file in (job_dir / "tasks").glob("*.pid"):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        out = finish(proc)
    finally:
        kill_group(proc.pid)
    text = output.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert text.count("exited with exit code 75") == 2, text[-4000:]  # both tasks saved and stopped
    assert "(exit 75): requeueing job 1000" in text
    assert "job 1000, start 1 (requeues so far)" in text and "resumed from the checkpoint of step" in text
    assert json.loads((job_dir / "history.json").read_text()) == [0, 0]
    s = summary(run_dir)
    assert 8 <= s["resumed_from"] < STEPS and s["steps"] == STEPS
    assert s["params_digest"] == summary(reference[0])["params_digest"]


def worker_pid(root: Path, worker: int) -> int:
    return int((root / "tpu" / "vm" / f"worker-{worker}" / ".ssmgate-run" / "pid").read_text())


def worker_exit(root: Path, worker: int):
    f = root / "tpu" / "vm" / f"worker-{worker}" / ".ssmgate-run" / "exit"
    return f.exists() and f.read_text().strip()


def test_tpu_vm_worker_killed_mid_run_then_stop_and_run_again_resumes_bit_identically(reference, tmp_path):
    env = sim_env(tmp_path)
    run_dir, vm = tmp_path / "shared" / "run", ["vm", "zone-a"]
    try:
        assert "2 simulated workers" in launch(["launch/tpu_vm.sh", "create", *vm, "v4-16"], env)
        # the simulation links this checkout's venv instead of building one (no Python download here)
        out = launch(["launch/tpu_vm.sh", "copy", *vm], dict(env, TPU_ENV_SETUP=f"ln -sfn {REPO / '.venv'} .venv"))
        for i in range(2):  # each worker runs its own copy of the code
            home = tmp_path / "tpu" / "vm" / f"worker-{i}"
            assert f"[worker {i}] ready: Python 3.11" in out and f"ssmgate from {home}/ssmgate/ssmgate" in out, out

        out = launch(["launch/tpu_vm.sh", "run", *vm, FLAGFILE, str(run_dir), *SMALL], env)
        assert "[worker 0] started pid" in out and "[worker 1] started pid" in out, out
        assert "[worker 0] running" in launch(["launch/tpu_vm.sh", "status", *vm], env)
        log0 = run_dir / "logs" / "worker-0.log"
        wait_for(lambda: last_step(log0) >= 8, "step 8 in worker-0.log",
                 ended=lambda: log0.read_text() if worker_exit(tmp_path, 0) else None)
        os.kill(worker_pid(tmp_path, 1), signal.SIGKILL)  # a host lost mid-run
        wait_for(lambda: worker_exit(tmp_path, 1), "worker 1's exit status")
        out = launch(["launch/tpu_vm.sh", "status", *vm], env)
        assert "[worker 1] exited with status 137" in out, out
        # worker 0 waits for its peer in a collective: stop's SIGTERM cannot reach a step boundary
        out = launch(["launch/tpu_vm.sh", "stop", *vm, "3"], env)
        assert "[worker 0] exited with status" in out and worker_exit(tmp_path, 0), out

        out = launch(["launch/tpu_vm.sh", "run", *vm, FLAGFILE, str(run_dir), *SMALL], env)
        wait_for(lambda: worker_exit(tmp_path, 0) and worker_exit(tmp_path, 1), "the second run to end")
        out = launch(["launch/tpu_vm.sh", "status", *vm], env)
        assert out.count("exited with status 0 (finished)") == 2, out
        assert "[worker 0] last log line: [ssmgate] done:" in out, out
        local = tmp_path / "fetched"  # an existing folder, like fetch's default runs/: the run lands in it
        local.mkdir()
        launch(["launch/tpu_vm.sh", "fetch", *vm, str(run_dir), str(local)], env)
    finally:
        for i in range(2):  # the detached runs are in sessions of their own
            try:
                os.kill(worker_pid(tmp_path, i), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                pass
    fetched = local / "run"
    log = (fetched / "logs" / "worker-0.log").read_text()
    assert log.count("=== ") == 2 and "[ssmgate] process 0/2: 2 local of 4 devices" in log
    assert "resumed from the checkpoint of step" in log
    s = summary(fetched)
    assert s["resumed_from"] is not None and s["steps"] == STEPS
    assert s["params_digest"] == summary(reference[0])["params_digest"]


def test_distributed_flags_take_their_defaults_from_the_ssmgate_environment():
    """What the simulated TPU workers rely on (JAX's TPU detection needs the GCE metadata server)."""
    from absl import app
    from ssmgate import main
    env = {"SSMGATE_COORDINATOR_ADDRESS": "host:1234", "SSMGATE_NUM_PROCESSES": "2", "SSMGATE_PROCESS_ID": "1"}
    assert main._distributed_args(env) == {"coordinator_address": "host:1234", "num_processes": 2, "process_id": 1}
    assert main._distributed_args({}) == dict.fromkeys(main.DISTRIBUTED_ENV)  # None: JAX's cluster detection
    flag = main.FLAGS["process_id"]
    flag.value = 0
    try:
        assert main._distributed_args(env)["process_id"] == 0  # a flag given wins
    finally:
        flag.value = None
    with pytest.raises(app.UsageError, match=r"SSMGATE_NUM_PROCESSES='two' \(the default of --num_processes\): "
                                             r"expected an integer >= 0"):
        main._distributed_args({"SSMGATE_NUM_PROCESSES": "two"})
