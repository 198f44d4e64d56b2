"""Compile a flag file's training step for a TPU slice before paying for one:
`python -m ssmgate.aot --flagfile=experiments/p2/lm_rope05.flags --topology=v5p-8 [--aot_json=FILE]`.

The program builds its sharded step as its run would (ssmgate.train.compile_step), for the slice's
compile-only devices (ssmgate.train.topology: `v5p-8`, `v5e-16`, `v6e-64`, `v4-32`, multi-host
included, or libtpu's `v5e:4x4`), and the real XLA:TPU and Mosaic compilers compile it on this
machine; nothing runs and no data is read. One table follows: devices and hosts, the mesh,
parameters, memory per device against the HBM the compiler can use there (ssmgate.train.topology),
whether it fits with the program's code, the compile time, the compiler's
FLOPs and its roofline estimate of the step as tokens/s and MFU (an estimate, not a measurement).
A run that evaluates a converted checkpoint instead of training (the official Mamba-3 interventions)
compiles its window forwards, the native model's and each intervention's, for one device of the
slice (ssmgate.train.compile_forward); their shape comes from the checkpoint's config.json.

Exit status: 0 when the step fits, 1 when it compiles but does not fit (the last line names the
shortfall), 2 for a bad flag, a mesh the slice cannot hold, or a program without a training step.
A compile error from XLA or Mosaic is raised as is: that is what the command is for.
"""
from __future__ import annotations

import json
import sys

from absl import app, flags

from ssmgate import main as ssm_main
from ssmgate.config_error import ConfigError
from ssmgate.programs import registry

flags.DEFINE_string("topology", None, "The TPU slice to compile for: v5p-8, v5e-16, v6e-64, v4-32 (Cloud TPU's "
                    "names) or libtpu's <generation>:<chips per axis>, e.g. v5e:4x4.")
flags.DEFINE_string("aot_json", None, "Also write the table's numbers to this JSON file.")
FLAGS = flags.FLAGS
AOT_FLAGS = ("topology", "aot_json")


def compilable() -> list[str]:
    """The programs with a training step (a `training_plan` in their program module) or an
    evaluation's forward pass (a `forward_plan`) to compile."""
    return [name for name, p in registry.PROGRAMS.items()
            if any(hasattr(p.module("program"), f) for f in ("training_plan", "forward_plan"))]


def main(argv):
    try:
        _main(argv)
    except (app.UsageError, ConfigError, ValueError) as e:
        ssm_main.fail(str(e), ssm_main.EXIT_USAGE)


def _main(argv):
    from ssmgate.train import compile_forward, compile_step, topology
    if len(argv) > 1:
        raise app.UsageError(f"unexpected positional arguments {argv[1:]}; pass flags as --name=value")
    if FLAGS.program is None:
        raise app.UsageError(f"--program is required (or a --flagfile that sets it); one of "
                             f"{', '.join(compilable())}")
    if FLAGS.topology is None:
        raise app.UsageError("--topology is required: the TPU slice to compile for, e.g. --topology=v5p-8")
    unread = [n for n in ssm_main.unread_flags(FLAGS.program) if n not in AOT_FLAGS]
    if unread:
        raise app.UsageError(f"{', '.join('--' + n for n in unread)}: not flags of --program={FLAGS.program}")
    topo = topology.parse(FLAGS.topology)
    program = registry.PROGRAMS[FLAGS.program]
    if FLAGS.program not in compilable():
        raise app.UsageError(f"--program={FLAGS.program} has no training step to compile; programs with one: "
                             f"{', '.join(compilable())}")
    module = program.module("program")
    # The configuration as --dry_run reads it: a corpus, tokenizer or weights need not be here.
    FLAGS.dry_run = True
    cfg = program.flags.config_from_flags()
    forward = getattr(module, "forward_plan", lambda cfg: None)(cfg)
    what = "step" if forward is None else "evaluation's forward pass"
    print(f"[ssmgate.aot] compiling the {FLAGS.program} {what} for {topo.name} ({topo.libtpu_name}) ...", flush=True)
    try:
        report = (compile_step.compile_plan(module.training_plan(cfg), topo) if forward is None
                  else compile_forward.compile_forward(forward, topo))
    except ValueError as e:  # the mesh flags or the batch against the slice's devices
        raise ConfigError(f"--topology={topo.name}: {e}") from None
    print(compile_step.table(report), flush=True)
    if FLAGS.aot_json:
        with open(FLAGS.aot_json, "w") as f:
            json.dump({"program": FLAGS.program, **report}, f, indent=1)
    if not report["fits"]:
        sys.exit(1)


if __name__ == "__main__":
    app.run(main, flags_parser=ssm_main.parse_flags)
