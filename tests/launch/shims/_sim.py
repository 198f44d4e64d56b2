"""A simulated SLURM cluster and Cloud TPU VM on localhost, for tests/launch/test_simulated_pods.py.

The shims next to this file (`sbatch`, `srun`, `scontrol`, `gcloud`) run `python _sim.py TOOL ARGS`;
the tests put this folder first on PATH, so the launch scripts run unchanged and their commands
execute here for N local "hosts", each with the environment the real one would give it. Only the
standard library is used. State lives under $SSMGATE_SIM_ROOT (required: one folder per test).

SLURM:
  sbatch [OPTIONS] [SCRIPT]   reads #SBATCH lines (--nodes, --ntasks-per-node, --output with %j/%x,
                              --open-mode, --requeue/--no-requeue, --job-name), prints "Submitted
                              batch job N" and then, unlike a real scheduler, runs the job in the
                              foreground (again after each `scontrol requeue`, with
                              SLURM_RESTART_COUNT counting up, at most SIM_MAX_REQUEUES=3 times).
  srun [OPTIONS] CMD...       starts SLURM_NTASKS copies of CMD with SLURM_PROCID, SLURM_LOCALID,
                              SLURM_NODEID, SLURM_STEP_NODELIST=localhost, ... (what JAX's
                              SlurmCluster reads), JAX_COORDINATOR_PORT set to a free port (a real
                              cluster derives it from the job id), forwards SIGTERM/SIGINT to them
                              like srun, writes each task's pid to JOB_DIR/tasks/<procid>.pid and
                              exits with the largest task exit status.
  scontrol requeue JOBID      marks the running job for requeueing; with SIM_REQUEUE_REFUSED=1 it
                              refuses, as where the site's preemption has requeued the job already.
  scontrol show job JOBID     one line with JobState=$SIM_JOB_STATE (default RUNNING).
  SIM_SRUN_EXIT=N             srun starts nothing and exits with N (the launcher's own logic, fast).
Cloud TPU VM (`gcloud compute tpus tpu-vm ...`):
  create NAME --zone=Z ...    SIM_TPU_WORKERS (default 2) worker homes ROOT/tpu/NAME/worker-<i>.
  scp [--recurse] SRC DST --zone=Z --worker=W   NAME:PATH on one side; `~`, and relative paths,
                              are in each worker's home; absolute paths are the shared filesystem.
  ssh NAME --zone=Z --worker=W --command=CMD    runs `bash -c CMD` in each worker's home at once,
                              with HOME, TPU_WORKER_ID and SSMGATE_COORDINATOR_ADDRESS/
                              NUM_PROCESSES/PROCESS_ID (JAX's TPU detection asks the GCE metadata
                              server, which does not exist here); exits nonzero if a worker did.
Every simulated process runs on the CPU: JAX_PLATFORMS=cpu, JAX_NUM_CPU_DEVICES=SIM_CPU_DEVICES
(default 2).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path


def die(tool: str, message: str, code: int = 1):
    print(f"{tool} (simulated): {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def sim_root(tool: str) -> Path:
    root = os.environ.get("SSMGATE_SIM_ROOT")
    if not root:
        die(tool, "SSMGATE_SIM_ROOT is not set: expected the folder that holds the simulated cluster's state")
    return Path(root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def cpu_env() -> dict:
    return {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": os.environ.get("SIM_CPU_DEVICES", "2")}


def exit_status(returncode: int) -> int:
    """A shell's view of a child's status: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# ----------------------------------------------------------------------------------------- SLURM

def parse_options(args: list[str]) -> dict:
    """--name=value / --name value / --flag into a dict (sbatch's long options)."""
    opts, i = {}, 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            die("sbatch", f"unexpected argument {a!r}: expected --option[=value] (short options are not simulated)")
        name, eq, value = a[2:].partition("=")
        if not eq and name not in ("requeue", "no-requeue") and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, i = args[i + 1], i + 1
        opts[name] = value if (eq or value) else True
        i += 1
    return opts


def sbatch(args: list[str]) -> int:
    root = sim_root("sbatch")
    script_path = next((a for a in args if not a.startswith("-") and Path(a).is_file()), None)
    script = Path(script_path).read_text() if script_path else sys.stdin.read()
    cli = parse_options([a for a in args if a != script_path])
    directives = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break  # sbatch reads #SBATCH lines until the first command
        if line.startswith("#SBATCH"):
            directives.extend(shlex.split(line[len("#SBATCH"):]))
    opts = {**parse_options(directives), **cli}  # the command line wins, as in sbatch
    nodes, per_node = int(opts.get("nodes", 1)), int(opts.get("ntasks-per-node", 1))
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    job_id = 1000 + len(list((root / "jobs").iterdir()))
    job_dir = root / "jobs" / str(job_id)
    job_dir.mkdir()
    (job_dir / "script.sh").write_text(script)
    name = str(opts.get("job-name", "sbatch"))
    output = str(opts.get("output", "slurm-%j.out")).replace("%j", str(job_id)).replace("%x", name)
    print(f"Submitted batch job {job_id}", flush=True)
    env = dict(os.environ, SLURM_JOB_ID=str(job_id), SLURM_JOBID=str(job_id), SLURM_JOB_NAME=name,
               SLURM_JOB_NUM_NODES=str(nodes), SLURM_NNODES=str(nodes), SLURM_JOB_NODELIST="localhost",
               SLURM_NODELIST="localhost", SLURM_NTASKS_PER_NODE=str(per_node), SLURM_NTASKS=str(nodes * per_node),
               SLURM_SUBMIT_DIR=os.getcwd(), SSMGATE_SIM_JOB_DIR=str(job_dir))
    if "cpus-per-task" in opts:
        env["SLURM_CPUS_PER_TASK"] = str(opts["cpus-per-task"])
    history = []
    for restart in range(int(os.environ.get("SIM_MAX_REQUEUES", "3")) + 1):
        if restart:
            env["SLURM_RESTART_COUNT"] = str(restart)
        mode = "a" if opts.get("open-mode") == "append" else "w"  # without append a requeued job starts the file anew
        with open(output, mode) as out:
            proc = subprocess.run(["bash", str(job_dir / "script.sh")], env=env, stdout=out, stderr=subprocess.STDOUT)
        history.append(exit_status(proc.returncode))
        requeue = job_dir / "requeue"
        if not requeue.exists():
            break
        requeue.unlink()
        if opts.get("no-requeue"):
            break
    (job_dir / "history.json").write_text(json.dumps(history))
    return 0


def srun(args: list[str]) -> int:
    job_dir = os.environ.get("SSMGATE_SIM_JOB_DIR")
    if not job_dir:
        die("srun", "not inside a job of the simulated sbatch (SSMGATE_SIM_JOB_DIR is not set)")
    while args and args[0].startswith("-"):
        args = args[1:]  # srun's own options (--gpu-bind=none, ...) mean nothing on localhost
    if not args:
        die("srun", "expected a command to run")
    if os.environ.get("SIM_SRUN_EXIT"):
        return int(os.environ["SIM_SRUN_EXIT"])
    nodes, per_node = int(os.environ["SLURM_JOB_NUM_NODES"]), int(os.environ["SLURM_NTASKS_PER_NODE"])
    tasks_dir = Path(job_dir) / "tasks"
    tasks_dir.mkdir(exist_ok=True)
    step = dict(SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"], SLURM_STEP_NUM_NODES=str(nodes),
                SLURM_STEP_NUM_TASKS=str(nodes * per_node), SLURM_NTASKS=str(nodes * per_node), SLURM_STEPID="0",
                JAX_COORDINATOR_PORT=str(free_port()), **cpu_env())
    procs = []
    for rank in range(nodes * per_node):
        env = dict(os.environ, **step, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node),
                   SLURM_NODEID=str(rank // per_node))
        procs.append(subprocess.Popen(args, env=env))
        (tasks_dir / f"{rank}.pid").write_text(f"{procs[-1].pid}\n")

    def forward(signum, frame):  # srun passes SIGTERM and SIGINT on to every task
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    statuses = [exit_status(p.wait()) for p in procs]
    for rank, status in enumerate(statuses):
        if status:
            print(f"srun: error: task {rank}: exited with exit code {status}", file=sys.stderr, flush=True)
    return max(statuses)


def scontrol(args: list[str]) -> int:
    if args[:2] == ["show", "job"] and len(args) == 3:
        print(f"JobId={args[2]} JobName=sim JobState={os.environ.get('SIM_JOB_STATE', 'RUNNING')} Reason=None "
              f"Requeue=1 Restarts={os.environ.get('SLURM_RESTART_COUNT', 0)}")
        return 0
    if len(args) != 2 or args[0] != "requeue":
        die("scontrol", f"only `scontrol requeue JOBID` and `scontrol show job JOBID` are simulated; got {' '.join(args)!r}")
    job_dir = sim_root("scontrol") / "jobs" / args[1]
    if not job_dir.is_dir():
        die("scontrol", f"requeue {args[1]}: no such job (expected one submitted with the simulated sbatch)")
    if os.environ.get("SIM_REQUEUE_REFUSED"):
        die("scontrol", f"error: Requested operation is presently disabled for job {args[1]}")
    (job_dir / "requeue").touch()
    return 0


# ----------------------------------------------------------------------------------- Cloud TPU VM

def tpu_args(args: list[str]) -> tuple[str, list[str], dict]:
    if args[:3] != ["compute", "tpus", "tpu-vm"] or len(args) < 4:
        die("gcloud", f"only `gcloud compute tpus tpu-vm create|scp|ssh` is simulated; got {' '.join(args[:4])!r}")
    action, positional, opts = args[3], [], {}
    for a in args[4:]:
        if a.startswith("--"):
            name, _, value = a[2:].partition("=")
            opts[name] = value or True
        else:
            positional.append(a)
    return action, positional, opts


def tpu_vm(root: Path, name: str, zone) -> tuple[Path, dict]:
    vm = root / "tpu" / name
    if not (vm / "vm.json").exists():
        die("gcloud", f"TPU VM {name!r} not found (expected `tpu-vm create {name}` first)")
    meta = json.loads((vm / "vm.json").read_text())
    if zone != meta["zone"]:
        die("gcloud", f"TPU VM {name!r} is in zone {meta['zone']!r}, not --zone={zone!r}")
    return vm, meta


def workers(vm: Path, meta: dict, spec) -> list[tuple[int, Path]]:
    """--worker=all | i | i,j  ->  [(index, home)]"""
    n = meta["workers"]
    if spec in (None, True):
        die("gcloud", "expected --worker=all or a worker index (a multi-host TPU VM needs one)")
    ids = range(n) if spec == "all" else [int(w) for w in str(spec).split(",")]
    for i in ids:
        if not 0 <= i < n:
            die("gcloud", f"--worker={spec}: the TPU VM has workers 0..{n - 1}")
    return [(i, vm / f"worker-{i}") for i in ids]


def on_worker(home: Path, path: str) -> Path:
    if path.startswith("~"):
        return home / path[1:].lstrip("/")
    return Path(path) if path.startswith("/") else home / path


def copy(src: Path, dst: Path, recurse: bool) -> None:
    if src.is_dir():
        if not recurse:
            die("gcloud", f"scp: {src} is a directory (expected --recurse)")
        target = dst / src.name if dst.is_dir() else dst
        shutil.copytree(src, target, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def gcloud(args: list[str]) -> int:
    root = sim_root("gcloud")
    action, positional, opts = tpu_args(args)
    if action == "create":
        name = positional[0]
        vm = root / "tpu" / name
        if vm.exists():
            die("gcloud", f"TPU VM {name!r} already exists")
        n = int(os.environ.get("SIM_TPU_WORKERS", "2"))
        for i in range(n):
            (vm / f"worker-{i}").mkdir(parents=True)
        meta = {"zone": opts.get("zone"), "workers": n, "accelerator": opts.get("accelerator-type"),
                "version": opts.get("version")}
        (vm / "vm.json").write_text(json.dumps(meta))
        print(f"Created TPU VM {name} ({n} simulated workers)", flush=True)
        return 0
    if action == "scp":
        src, dst = positional
        remote_src, remote_dst = ":" in src, ":" in dst
        if remote_src == remote_dst:
            die("gcloud", f"scp {src} {dst}: expected NAME:PATH on exactly one side")
        name = (src if remote_src else dst).split(":", 1)[0]
        vm, meta = tpu_vm(root, name, opts.get("zone"))
        for _, home in workers(vm, meta, opts.get("worker")):
            if remote_dst:
                copy(Path(src), on_worker(home, dst.split(":", 1)[1]), bool(opts.get("recurse")))
            else:
                copy(on_worker(home, src.split(":", 1)[1]), Path(dst), bool(opts.get("recurse")))
        return 0
    if action == "ssh":
        vm, meta = tpu_vm(root, positional[0], opts.get("zone"))
        command = opts.get("command")
        if not isinstance(command, str):
            die("gcloud", "ssh: expected --command=CMD (interactive sessions are not simulated)")
        chosen = workers(vm, meta, opts.get("worker"))
        coordinator = f"localhost:{free_port()}"
        procs = []
        for i, home in chosen:
            env = dict(os.environ, HOME=str(home), TPU_WORKER_ID=str(i), SSMGATE_COORDINATOR_ADDRESS=coordinator,
                       SSMGATE_NUM_PROCESSES=str(meta["workers"]), SSMGATE_PROCESS_ID=str(i), **cpu_env())
            procs.append(subprocess.Popen(["bash", "-c", command], cwd=home, env=env))
        statuses = [exit_status(p.wait()) for p in procs]
        return max(statuses)
    die("gcloud", f"tpu-vm {action}: not simulated (expected create, scp or ssh)")


if __name__ == "__main__":
    tool, argv = sys.argv[1], sys.argv[2:]
    sys.exit({"sbatch": sbatch, "srun": srun, "scontrol": scontrol, "gcloud": gcloud}[tool](argv))
