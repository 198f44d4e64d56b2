"""The absl entry point: `python -m ssmgate.main --flagfile=experiments/p1/fig1a.flags [--run_dir=...]`.

Thin by design: parse the flags, pick the program, check its configuration, write the resolved
flags to the run directory, run. A bad flag stops the run before any work with a message that
names the flag and what it accepts.
"""
from __future__ import annotations

import sys

from absl import app, flags, logging

from ssmgate.programs import p1_fig1, p1_fig1_flags

PROGRAMS = {"p1_fig1": p1_fig1_flags}

flags.DEFINE_enum("program", None, sorted(PROGRAMS), "The experiment program to run.")
flags.DEFINE_string("run_dir", None, "Output directory of the run (created).")
flags.DEFINE_boolean("dry_run", False, "Check the flags and print the configuration; run nothing.")
FLAGS = flags.FLAGS


def resolved_flags() -> str:
    """The flags of ssmgate's modules with their final values, one `--name=value` per line."""
    lines = []
    for module, module_flags in sorted(FLAGS.flags_by_module_dict().items()):
        if module.startswith("ssmgate") or module == sys.argv[0]:
            lines.extend(f.serialize() for f in sorted(module_flags, key=lambda f: f.name) if f.value is not None)
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments {argv[1:]}; pass flags as --name=value")
    if FLAGS.program is None:
        raise app.UsageError(f"--program is required; one of {', '.join(sorted(PROGRAMS))}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # keeps JAX's start-up INFO lines out of the progress display
    program = PROGRAMS[FLAGS.program]
    try:
        cfg = program.config_from_flags()
    except p1_fig1.ConfigError as e:
        raise app.UsageError(str(e)) from None
    print(f"[ssmgate] program {FLAGS.program}: {cfg}", flush=True)
    if FLAGS.dry_run:
        return
    if FLAGS.run_dir is None:
        raise app.UsageError("--run_dir is required (where the run writes its outputs)")
    from ssmgate.train.run_dir import RunDir
    RunDir(FLAGS.run_dir).write_text("flags.txt", resolved_flags())
    program.run(FLAGS.run_dir)
    print(f"[ssmgate] done: {FLAGS.run_dir}/summary.json", flush=True)


if __name__ == "__main__":
    app.run(main)
