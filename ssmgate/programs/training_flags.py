"""Flags shared by the programs that train models of the zoo (absl flags are global: one
definition each): model flags generated from ModelCfg's fields on top of `--preset`, optimizer
flags from OptimCfg's (`--opt_*`, with the common `--lr` and `--steps`), mesh flags `--mesh_*`,
and the loop's cadence. `--task` is a string each program checks against its own tasks.
"""
from __future__ import annotations

import math

from absl import flags

from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.programs import common_flags  # noqa: F401  (--lr, --batch, --steps, --seed, --seeds)
from ssmgate.programs import dataclass_flags
from ssmgate.programs.config_error import ConfigError
from ssmgate.programs.grids import parse_grid
from ssmgate.train import loop, mesh as meshlib, optim

flags.DEFINE_string("preset", None, "A named model of ssmgate.models.presets; model flags override its fields.")
dataclass_flags.define(ModelCfg)
dataclass_flags.define(optim.OptimCfg, prefix="opt_", skip=("lr", "total_steps"))
dataclass_flags.define(meshlib.MeshCfg, prefix="mesh_")
flags.DEFINE_string("task", None, "The program's task (train: copy | recall; p2_state_tracking: parity | mod3 | arith).")
flags.DEFINE_integer("log_every", 50, "Steps between progress lines and metrics.jsonl records.")
flags.DEFINE_integer("eval_every", 0, "Steps between evaluations (0: only at the end).")
flags.DEFINE_integer("ckpt_every", 0, "Steps between checkpoints (0: only at the end).")
flags.DEFINE_integer("keep_ckpts", 3, "Checkpoints kept.")
flags.DEFINE_boolean("tensorboard", True, "Write TensorBoard event files when tensorboardX is installed.")
flags.DEFINE_boolean("ckpt_async", False, "Save checkpoints in the background (training goes on while they are "
                     "written; a kill loses at most the one being written).")
flags.DEFINE_string("profile_steps", "", "FIRST:LAST: write a jax.profiler trace of these steps (1-based) into "
                    "RUN_DIR/profile (open it with TensorBoard's profile plugin or Perfetto).")
flags.DEFINE_string("wandb_project", "", "Also log metrics to this Weights & Biases project (needs `pip install wandb`).")
flags.DEFINE_integer("schedule_steps", 0, "Steps of the learning-rate schedule (warmup, then cosine to its floor, flat "
                     "after); 0: --steps. Rerunning a run with more --steps sets it to the steps the run trained with, "
                     "so the extension keeps that schedule (docs/training.md).")
flags.DEFINE_string("sweep_lrs", "", "Sweep: peak learning rates (grid, e.g. 'logspace:-4:-2:8'); empty = --lr.")

FLAGS = flags.FLAGS


def require(name: str, program: str):
    if FLAGS[name].value is None:
        raise ConfigError(f"--{name} is required for --program={program}")
    return FLAGS[name].value


def model_cfg(base: ModelCfg | None = None) -> ModelCfg:
    """`base` (or the `--preset`, or ModelCfg's defaults) with the model flags applied."""
    if base is None:
        base = ModelCfg()
        if FLAGS.preset is not None:
            if FLAGS.preset not in presets.PRESETS:
                raise ConfigError(f"--preset={FLAGS.preset}: expected one of {', '.join(sorted(presets.PRESETS))}")
            base = presets.PRESETS[FLAGS.preset]
    return dataclass_flags.build(ModelCfg, base)


def optim_cfg(lr: float, steps: int) -> optim.OptimCfg:
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"--steps={steps}: expected an integer >= 1 (the training steps)")
    schedule = FLAGS.schedule_steps or steps
    if schedule < 1:
        raise ConfigError(f"--schedule_steps={FLAGS.schedule_steps}: expected 0 (--steps) or an integer >= 1")
    return dataclass_flags.build(optim.OptimCfg, optim.OptimCfg(lr=lr, total_steps=schedule), prefix="opt_",
                                 skip=("lr", "total_steps"))


def mesh_cfg() -> meshlib.MeshCfg:
    return dataclass_flags.build(meshlib.MeshCfg, meshlib.MeshCfg(), prefix="mesh_")


def profile_steps() -> tuple[int, int] | None:
    text = FLAGS.profile_steps.strip()
    if not text:
        return None
    parts = text.split(":")
    try:
        first, last = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"--profile_steps={text}: expected FIRST:LAST, two step numbers such as 10:20") from None
    return first, last


def loop_cfg(steps: int, name: str = "train") -> loop.LoopCfg:
    try:
        return loop.LoopCfg(steps=steps, log_every=FLAGS.log_every, eval_every=FLAGS.eval_every,
                            ckpt_every=FLAGS.ckpt_every, keep_ckpts=FLAGS.keep_ckpts, tensorboard=FLAGS.tensorboard,
                            name=name, ckpt_async=FLAGS.ckpt_async, profile_steps=profile_steps(),
                            wandb_project=FLAGS.wandb_project).validate()
    except ValueError as e:
        raise ConfigError(f"--{e}") from None


def learning_rates(lr: float | None) -> list[float]:
    """--sweep_lrs, or [lr]; positive."""
    try:
        lrs = parse_grid("sweep_lrs", FLAGS.sweep_lrs) or ([] if lr is None else [lr])
    except ValueError as e:
        raise ConfigError(str(e) if str(e).startswith("--") else f"--{e}") from None
    if not lrs:
        raise ConfigError("--sweep_lrs or --lr is required")
    if any(not math.isfinite(v) or v <= 0 for v in lrs):
        given = f"--sweep_lrs={FLAGS.sweep_lrs}" if FLAGS.sweep_lrs else f"--lr={lr}"
        raise ConfigError(f"{given}: expected positive, finite learning rates")
    return lrs
