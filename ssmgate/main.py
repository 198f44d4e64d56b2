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
import dataclasses
import os
import signal
import sys

from absl import app, flags, logging

from ssmgate import xla_env
from ssmgate.train import preemption

if __name__ == "__main__":  # before the heavy imports: from here on a SIGTERM exits with status 75
    preemption.catch_stop_signals()

from ssmgate.cli import extension  # noqa: E402
from ssmgate.config_error import ConfigError  # noqa: E402
from ssmgate.programs import registry  # noqa: E402
from ssmgate.storage_error import StorageError  # noqa: E402

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


def resolved_flags(settled: dict | None = None) -> str:
    """main's flags and those of the chosen program that have a value, one `--name=value` per line; `settled`:
    {name: value} the run decided itself (an extension's --schedule_steps)."""
    names = set(MAIN_FLAGS) | program_flags(FLAGS.program)
    values = {n: FLAGS[n].serialize() for n in names if FLAGS[n].value is not None}
    values.update({n: f"--{n}={v}" for n, v in (settled or {}).items()})
    return "\n".join(values[n] for n in sorted(values)) + "\n"


def unread_flags(name: str) -> list[str]:
    """The ssmgate flags given (on the command line or in a flag file) that --program=name does not read."""
    allowed = set(MAIN_FLAGS) | program_flags(name) | set(registry.old_flag_names(name))
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
    old = registry.old_flag_names(name)
    if old:
        text += ["", "old names, still read:", *(f"  --{o}: now --{n}" for o, n in sorted(old.items()))]
    return "\n".join(text)


def old_names_given(name: str) -> list[str]:
    """'--old (now --new)' for each old flag name the command or its flag files used."""
    return [f"--{o} (now --{n})" for o, n in sorted(registry.old_flag_names(name).items()) if FLAGS[o].present]


def fail(message: str, status: int) -> None:
    """Ends the run with one line on stderr."""
    print(f"[ssmgate] {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with --help answered per program (after the flags, so --program may come from a
    flag file) and a bad flag answered in one line (absl adds a usage hint to it)."""
    wants_help = any(a in HELP_ARGS for a in argv[1:])
    try:
        args = FLAGS([a for a in argv if a not in HELP_ARGS])
    except flags.Error as e:
        fail(f"{' '.join(str(e).split())}; `python -m ssmgate.main --program=NAME --help` lists the flags of a "
             f"program", EXIT_USAGE)
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
    # SIGTERM is JAX's now (its preemption notice, shared by every process); SIGINT is not shared,
    # so it keeps Python's default: KeyboardInterrupt, nothing saved.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"[ssmgate] process {jax.process_index()}/{jax.process_count()}: "
          f"{jax.local_device_count()} local of {jax.device_count()} devices", flush=True)


def main(argv):
    """The run; every configuration error, refusal and storage failure ends in one line (absl
    would print its usage text before a usage error)."""
    try:
        with preemption.armed():
            _main(argv)
    except (app.UsageError, ConfigError) as e:
        fail(str(e), EXIT_USAGE)
    except preemption.Interrupted as e:
        fail(str(e), preemption.EXIT_PREEMPTED)


def _main(argv):
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
    old = old_names_given(FLAGS.program)
    if old:  # still read; the new names are what --help and flags.txt show
        print(f"[ssmgate] old flag names, still read: {', '.join(old)}; flag files should use the new names",
              file=sys.stderr, flush=True)
    program = PROGRAMS[FLAGS.program].flags
    if FLAGS.cpu_devices is not None:
        try:
            xla_env.set_cpu_devices(FLAGS.cpu_devices)
        except (ValueError, RuntimeError) as e:
            raise app.UsageError(str(e)) from None
    cfg = program.config_from_flags()
    if FLAGS.dry_run:
        print(f"[ssmgate] program {FLAGS.program} (dry run)\n{program.describe(cfg)}", flush=True)
        return
    if FLAGS.run_dir is None:
        raise app.UsageError("--run_dir is required (where the run writes its outputs)")
    if FLAGS.distributed:
        _initialize_distributed()
    print(f"[ssmgate] program {FLAGS.program}: {cfg}", flush=True)
    import jax
    from ssmgate.train.run_dir import RunDir
    from ssmgate.train.run_lock import RunDirBusy, RunLock
    created = "://" not in FLAGS.run_dir and not os.path.lexists(FLAGS.run_dir)
    try:
        rd = RunDir(FLAGS.run_dir)
    except OSError as e:  # an unwritable parent, a file in the way, ...
        fail(f"--run_dir={FLAGS.run_dir}: cannot create the run directory ({e.strerror or e}); expected a writable "
             f"directory path", EXIT_USAGE)
    lock = RunLock(rd) if jax.process_index() == 0 else contextlib.nullcontext()
    try:
        with lock:
            _run(program, cfg, rd)
    except RunDirBusy as e:
        fail(str(e), EXIT_USAGE)
    except (app.UsageError, ConfigError):  # refused: a directory made for it alone goes again
        if created:
            rd.remove_if_unused()
        raise
    except StorageError as e:  # disk full, read-only, no permission: the message names the path
        from ssmgate.train.checkpoint import CheckpointWriteError  # its message lists the checkpoints itself
        fail(str(e) if isinstance(e, CheckpointWriteError) else f"{e}; {_checkpoints_note(rd)}", 1)
    print(f"[ssmgate] done: {FLAGS.run_dir}/summary.json", flush=True)


def _checkpoints_note(rd) -> str:
    """What a storage failure left intact of the run's checkpoints (orbax renames a step's folder
    into place only once it is complete)."""
    folder = rd.file("checkpoints")
    steps = sorted(int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()) if folder.exists() else []
    if not steps:
        return "no checkpoint was written yet; fix the cause and run the same command again"
    return f"the checkpoints in {folder} (steps {steps}) are intact; fix the cause and run the same command again to " \
           f"resume from step {steps[-1]}"


def _optim(cfg):
    """The optimizer config of a program that trains (its run spec's); None: it trains nothing."""
    return getattr(getattr(cfg, "spec", None), "optim", None)


def _on_schedule(cfg, steps: int):
    """cfg (validated) with its run spec's optimizer on a schedule of `steps` >= 1 steps: nothing else changes,
    so it is not validated again."""
    spec = cfg.spec
    return dataclasses.replace(cfg, spec=dataclasses.replace(
        spec, optim=dataclasses.replace(spec.optim, total_steps=steps)))


def _extension(cfg, rd):
    """(cfg on the schedule the run trains on, note, the flags.txt lines it settles) for a rerun of a run with
    checkpoints (ssmgate.cli.extension), or (cfg, None, {}) when the flags alone decide. Keeping the
    checkpoint's optimizer state changes no trained step, and added steps run at the schedule's end value."""
    old = rd.file("flags.txt")
    if FLAGS["schedule_steps"].present or _optim(cfg) is None or not old.exists() \
            or not any(rd.file("checkpoints").glob("[0-9]*")):
        return cfg, None, {}
    schedule = extension.schedule_of_rerun(old.read_text(), str(old), FLAGS.steps)
    if schedule is None:
        return cfg, None, {}
    cfg, settled = _on_schedule(cfg, schedule.steps), {"schedule_steps": schedule.steps}
    opt = _optim(cfg)
    floor = opt.lr * opt.final_lr_frac
    if schedule.resumed:
        return cfg, (f"resuming the run extended to --steps={FLAGS.steps} on the schedule it trained with "
                     f"(--schedule_steps={schedule.steps}, from {old})"), settled
    if floor == 0:
        raise ConfigError(f"--steps: {schedule.extends_from} -> {FLAGS.steps} extends a run whose schedule ends at "
                          f"lr 0 (--opt_final_lr_frac={opt.final_lr_frac:g}): the added steps would not train; "
                          f"expected a new --run_dir for a longer schedule")
    return cfg, (f"extending the run from --steps={schedule.extends_from} to {FLAGS.steps} on the schedule it "
                 f"trained with (--schedule_steps={schedule.steps}): steps after {schedule.steps} run at its final "
                 f"lr {floor:.3g}"), settled


def _run(program, cfg, rd) -> None:
    """Runs the program in a locked run directory; the new flags become flags.txt once the run
    accepts them (the loop, on a fresh start or a checkpoint of the same configuration; here for a
    program without the loop), and a run that ends otherwise leaves the record as it was."""
    import jax
    from ssmgate.train.checkpoint import CheckpointError
    from ssmgate.train.loop import TrainingDiverged
    from ssmgate.train.preemption import EXIT_PREEMPTED, Preempted
    main_process = jax.process_index() == 0
    cfg, note, settled = _extension(cfg, rd)
    if note and main_process:
        print(f"[ssmgate] {note}", flush=True)
    flags_text, old = resolved_flags(settled), rd.file("flags.txt")
    old_text = old.read_text() if main_process and old.exists() else None
    if main_process:
        rd.stage("flags.txt", flags_text)
    try:
        program.run(cfg, rd)
    except BaseException as e:
        if main_process:
            rd.discard_staged("flags.txt")
        if isinstance(e, CheckpointError):  # a resume refused: the run directory keeps its own record
            renamed = registry.old_flag_names(FLAGS.program)
            changed = "" if old_text is None else f"; flags changed since {old}: " \
                                                  f"{extension.flag_changes(old_text, flags_text, renamed)}"
            fail(f"cannot resume: {e}{changed}", EXIT_USAGE)
        if isinstance(e, Preempted):  # SIGTERM/SIGINT: saved; a scheduler (launch/) requeues on this status
            print(f"[ssmgate] {e} (exit status {EXIT_PREEMPTED})", flush=True)
            sys.exit(EXIT_PREEMPTED)
        if isinstance(e, TrainingDiverged):  # the message names the step, the quantity and the saved state
            fail(f"training diverged: {e}", 1)
        raise  # configuration errors, storage failures and interruptions: main's and _main's one lines
    if main_process:
        rd.promote("flags.txt")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
