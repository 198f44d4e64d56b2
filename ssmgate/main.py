"""The absl entry point: `python -m ssmgate.main --flagfile=experiments/p1/fig1a.flags [--run_dir=...]`.

Thin by design: parse the flags, pick the program from ssmgate.programs.registry, check its
configuration, write the resolved flags to the run directory, run. A bad flag stops the run before
any work with a message that names the flag and what it accepts, and so does a flag the chosen
program does not read. `--program=NAME --help` lists the flags of that program. Flag files
compose: a file may hold `--flagfile=base.flags` lines, and later flags override earlier ones.
`--dry_run` prints the resolved configuration (for `train`: parameter counts, the mesh and the
sharding of every parameter) and runs nothing.

On a multi-host pod pass `--distributed`: `jax.distributed.initialize()` joins the hosts first
(coordinator, process count and id from the cluster environment on TPU VMs and SLURM, or from
`--coordinator_address/--num_processes/--process_id`, whose defaults the environment variables
SSMGATE_COORDINATOR_ADDRESS, SSMGATE_NUM_PROCESSES and SSMGATE_PROCESS_ID may set: for hosts that
JAX's cluster detection does not know, such as the simulated pods of tests/launch/).

SIGTERM (a scheduler's preemption notice) or SIGINT saves a checkpoint after the current step and
exits with status 75 (`ssmgate.train.preemption.EXIT_PREEMPTED`); the same command resumes.

On a CPU, `--cpu_devices=N` splits the machine into N XLA devices before JAX starts, so that a
mesh axis over them runs side by side on the cores: a sweep with `--mesh_replica=N` trains its
replicas N groups at a time (P1's cpu KV sweep, 8 replicas on 2 cores: 1.2-1.3x the steps per
second of one device, the same losses to float32 rounding).
"""
from __future__ import annotations

import contextlib
import os
import sys

from absl import app, flags, logging

from ssmgate import xla_env
from ssmgate.config_error import ConfigError
from ssmgate.programs import registry

registry.define_all_flags()
PROGRAMS = registry.PROGRAMS

flags.DEFINE_enum("program", None, sorted(PROGRAMS), "The experiment program to run.")
flags.DEFINE_string("run_dir", None, "Output directory of the run (created; an existing run resumes).")
flags.DEFINE_boolean("dry_run", False, "Check the flags and print the configuration; run nothing.")
flags.DEFINE_integer("cpu_devices", None, "Split the host CPU into this many XLA devices before JAX starts "
                     "(JAX's jax_num_cpu_devices), e.g. 2 with --mesh_replica=2 to run a "
                     "sweep's replicas on two cores side by side; default: XLA's one CPU device.")
flags.DEFINE_boolean("distributed", False, "Call jax.distributed.initialize() first (multi-host runs).")
flags.DEFINE_string("coordinator_address", None, "--distributed: host:port of process 0 "
                    "(default: $SSMGATE_COORDINATOR_ADDRESS, else from the cluster).")
flags.DEFINE_integer("num_processes", None, "--distributed: number of processes "
                     "(default: $SSMGATE_NUM_PROCESSES, else from the cluster).")
flags.DEFINE_integer("process_id", None, "--distributed: this process's id "
                     "(default: $SSMGATE_PROCESS_ID, else from the cluster).")
FLAGS = flags.FLAGS
MAIN_FLAGS = ("program", "run_dir", "dry_run", "cpu_devices", "distributed", "coordinator_address", "num_processes",
              "process_id")
HELP_ARGS = ("--help", "-help", "-h", "-?", "--helpshort")
EXIT_USAGE = 2  # a run directory in use, or a checkpoint this configuration cannot resume


def program_flags(name: str) -> set[str]:
    return {n for names in registry.flag_names(name).values() for n in names}


def resolved_flags() -> str:
    """main's flags and those of the chosen program with their final values, one `--name=value` per line."""
    names = set(MAIN_FLAGS) | program_flags(FLAGS.program)
    return "\n".join(FLAGS[n].serialize() for n in sorted(names) if FLAGS[n].value is not None) + "\n"


def unread_flags(name: str) -> list[str]:
    """The ssmgate flags given (on the command line or in a flag file) that --program=name does not read."""
    allowed = set(MAIN_FLAGS) | program_flags(name)
    given = {f.name for module, module_flags in FLAGS.flags_by_module_dict().items()
             if module.startswith("ssmgate.") for f in module_flags if f.present}
    return sorted(given - allowed)


def _readers(flag: str) -> list[str]:
    return [p for p in PROGRAMS if flag in program_flags(p)]


def program_help(name: str | None) -> str:
    """--help: the flags of --program=name with their help and defaults (main's and the program list without one)."""
    def lines(names):
        out = []
        for n in names:
            f = FLAGS[n]
            out.append(f"  --{n}: {f.help}" + ("" if f.default is None else f" (default: {f.default_as_str})"))
        return out
    text = ["python -m ssmgate.main --program=NAME --flagfile=FILE --run_dir=DIR [--dry_run]", "",
            "Flags of every program:", *lines(MAIN_FLAGS)]
    if name is None:
        return "\n".join(text + ["", f"Programs: {', '.join(PROGRAMS)}; --program=NAME --help lists the flags of one."])
    for group, names in registry.flag_names(name).items():
        title = f"{name}'s own flags:" if group == "own" else f"shared flags, group {group}:"
        text += ["", title, *lines(names)]
    return "\n".join(text)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with --help answered per program (after the flags, so --program may come from a flag file)."""
    wants_help = any(a in HELP_ARGS for a in argv[1:])
    args = app.parse_flags_with_usage([a for a in argv if a not in HELP_ARGS])
    if wants_help:
        print(program_help(FLAGS.program))
        sys.exit(0)
    return args


# Environment defaults of the --distributed flags. Real TPU VMs and SLURM need none (JAX reads the
# cluster); a launcher or simulation that knows the values where JAX cannot look sets them.
DISTRIBUTED_ENV = {"coordinator_address": "SSMGATE_COORDINATOR_ADDRESS", "num_processes": "SSMGATE_NUM_PROCESSES",
                   "process_id": "SSMGATE_PROCESS_ID"}


def _distributed_args(environ=os.environ) -> dict:
    """--coordinator_address/--num_processes/--process_id, each from its flag, else its DISTRIBUTED_ENV
    variable, else None (JAX's cluster detection)."""
    args = {}
    for name, var in DISTRIBUTED_ENV.items():
        value, raw = FLAGS[name].value, environ.get(var, "")
        if value is None and raw:
            if name != "coordinator_address":
                if not raw.isdigit():
                    raise app.UsageError(f"{var}={raw!r} (the default of --{name}): expected an integer >= 0")
                raw = int(raw)
            value = raw
        args[name] = value
    return args


def _initialize_distributed() -> None:
    import jax
    # On CPU, cross-process collectives go through gloo, jax 0.10's default
    # (jax_cpu_collectives_implementation): the simulated pods of tests/launch/ run on it.
    jax.distributed.initialize(**_distributed_args())
    print(f"[ssmgate] process {jax.process_index()}/{jax.process_count()}: "
          f"{jax.local_device_count()} local of {jax.device_count()} devices", flush=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments {argv[1:]}; pass flags as --name=value")
    if FLAGS.program is None:
        raise app.UsageError(f"--program is required; one of {', '.join(sorted(PROGRAMS))}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # keeps JAX's start-up INFO lines out of the progress display
    unread = unread_flags(FLAGS.program)
    if unread:
        raise app.UsageError("; ".join(
            f"--{n} is not a flag of --program={FLAGS.program}"
            + (f" (it is one of {', '.join(_readers(n))})" if _readers(n) else "") for n in unread)
            + f"; `python -m ssmgate.main --program={FLAGS.program} --help` lists its flags")
    program = PROGRAMS[FLAGS.program].flags
    if FLAGS.cpu_devices is not None:
        try:
            xla_env.set_cpu_devices(FLAGS.cpu_devices)
        except (ValueError, RuntimeError) as e:
            raise app.UsageError(str(e)) from None
    try:
        cfg = program.config_from_flags()
        if FLAGS.dry_run:
            print(f"[ssmgate] program {FLAGS.program} (dry run)\n{program.describe(cfg)}", flush=True)
            return
    except ConfigError as e:
        raise app.UsageError(str(e)) from None
    if FLAGS.run_dir is None:
        raise app.UsageError("--run_dir is required (where the run writes its outputs)")
    if FLAGS.distributed:
        _initialize_distributed()
    print(f"[ssmgate] program {FLAGS.program}: {cfg}", flush=True)
    import jax
    from ssmgate.train.run_dir import RunDir
    from ssmgate.train.run_lock import RunDirBusy, RunLock
    try:
        rd = RunDir(FLAGS.run_dir)
    except OSError as e:  # an unwritable parent, a file in the way, ...
        print(f"[ssmgate] --run_dir={FLAGS.run_dir}: cannot create the run directory ({e.strerror or e}); "
              f"expected a writable directory path", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)
    lock = RunLock(rd) if jax.process_index() == 0 else contextlib.nullcontext()
    try:
        with lock:
            _run(program, cfg, rd)
    except RunDirBusy as e:
        print(f"[ssmgate] {e}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)
    print(f"[ssmgate] done: {FLAGS.run_dir}/summary.json", flush=True)


def _parse_flags(text: str) -> dict:
    return dict(line.split("=", 1) if "=" in line else (line, "") for line in text.splitlines() if line)


def _flag_changes(old: str, new: str) -> str:
    """'--lr: 0.005 -> 0.01, ...' between two flags.txt texts."""
    a, b = _parse_flags(old), _parse_flags(new)
    return ", ".join(f"{k}: {a.get(k, '<unset>')} -> {b.get(k, '<unset>')}" for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k)) or "none"


def _extension(program, cfg, rd):
    """More --steps on a run with checkpoints: (cfg on the schedule the run trained with, note), or
    (cfg, None) when this is not an extension. The schedule's length is --steps unless
    --schedule_steps says otherwise, and the checkpoint's optimizer state was trained on the old
    one: keeping it changes no trained step, and the added steps run at the schedule's end value."""
    old = rd.file("flags.txt")
    if FLAGS["schedule_steps"].present or getattr(cfg, "optim", None) is None or not old.exists() \
            or not any(rd.file("checkpoints").glob("[0-9]*")):
        return cfg, None
    before = _parse_flags(old.read_text())
    old_steps = int(before.get("--steps", "0") or 0)
    if FLAGS.steps is None or not 0 < old_steps < FLAGS.steps:
        return cfg, None
    schedule = int(before.get("--schedule_steps", "0") or 0) or old_steps
    FLAGS.schedule_steps = schedule
    cfg = program.config_from_flags()
    floor = cfg.optim.lr * cfg.optim.final_lr_frac
    if floor == 0:
        raise ConfigError(f"--steps: {old_steps} -> {FLAGS.steps} extends a run whose schedule ends at lr 0 "
                          f"(--opt_final_lr_frac={cfg.optim.final_lr_frac:g}): the added steps would not train; "
                          f"expected a new --run_dir for a longer schedule")
    return cfg, (f"extending the run from --steps={old_steps} to {FLAGS.steps} on the schedule it trained with "
                 f"(--schedule_steps={schedule}): steps after {schedule} run at its final lr {floor:.3g}")


def _run(program, cfg, rd) -> None:
    """Runs the program in a locked run directory; the new flags become flags.txt once the run
    accepts them (a fresh run, or a checkpoint of the same configuration)."""
    import jax
    from ssmgate.train.checkpoint import CheckpointError, CheckpointWriteError
    from ssmgate.train.loop import TrainingDiverged
    from ssmgate.train.preemption import EXIT_PREEMPTED, Preempted
    main_process = jax.process_index() == 0
    try:
        cfg, extension = _extension(program, cfg, rd)
    except ConfigError as e:
        raise app.UsageError(str(e)) from None
    if extension and main_process:
        print(f"[ssmgate] {extension}", flush=True)
    flags_text, old = resolved_flags(), rd.file("flags.txt")
    old_text = old.read_text() if main_process and old.exists() else None
    if main_process:
        rd.stage("flags.txt", flags_text)
    refused = False
    try:
        program.run(cfg, str(rd.path))
    except ConfigError as e:  # flags that only the running job can check (e.g. the mesh against its devices)
        refused = True
        raise app.UsageError(str(e)) from None
    except CheckpointError as e:  # a resume refused: the run directory keeps its own record
        refused = True
        changed = "" if old_text is None else f"; flags changed since {old}: {_flag_changes(old_text, flags_text)}"
        print(f"[ssmgate] cannot resume: {e}{changed}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)
    except Preempted as e:  # SIGTERM/SIGINT: saved; a scheduler (launch/) requeues on this status
        print(f"[ssmgate] {e} (exit status {EXIT_PREEMPTED})", flush=True)
        sys.exit(EXIT_PREEMPTED)
    except CheckpointWriteError as e:  # disk full, permissions: names the step and what is intact
        print(f"[ssmgate] {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    except TrainingDiverged as e:  # the message names the step, the quantity and the saved state
        print(f"[ssmgate] training diverged: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if main_process and refused:
            rd.file("flags.txt.staged").unlink(missing_ok=True)
        elif main_process:  # the loop promotes as soon as it accepts; programs without it end here
            rd.promote("flags.txt")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
