"""Flags of the `train` program and their translation to TrainLMCfg.

Model flags are generated from ModelCfg's fields (`--d_model`, `--block`, ...) on top of an
optional `--preset`; optimizer flags from OptimCfg's with the prefix `opt_` (plus the common
`--lr`, and `--steps` as the schedule's length); mesh flags `--mesh_*`.
"""
from __future__ import annotations

import dataclasses

from absl import flags

from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.programs import common_flags  # noqa: F401  (--lr, --batch, --steps, --seed, --seeds)
from ssmgate.programs import dataclass_flags, train_lm
from ssmgate.programs.config_error import ConfigError
from ssmgate.programs.grids import parse_grid
from ssmgate.tasks import synthetic_lm
from ssmgate.train import loop, mesh as meshlib, optim, sweep

flags.DEFINE_string("preset", None, "A named model of ssmgate.models.presets; model flags override its fields.")
dataclass_flags.define(ModelCfg)
dataclass_flags.define(optim.OptimCfg, prefix="opt_", skip=("lr", "total_steps"))
dataclass_flags.define(meshlib.MeshCfg, prefix="mesh_")
flags.DEFINE_enum("task", "copy", list(synthetic_lm.TASKS), "Synthetic task (ssmgate.tasks.synthetic_lm).")
flags.DEFINE_integer("seq_len", 64, "Model input length (tokens per sequence).")
flags.DEFINE_integer("log_every", 50, "Steps between progress lines and metrics.jsonl records.")
flags.DEFINE_integer("eval_every", 0, "Steps between evaluations (0: only at the end).")
flags.DEFINE_integer("eval_batches", 4, "Batches of the fixed evaluation set.")
flags.DEFINE_integer("ckpt_every", 0, "Steps between checkpoints (0: only at the end).")
flags.DEFINE_integer("keep_ckpts", 3, "Checkpoints kept.")
flags.DEFINE_boolean("tensorboard", True, "Write TensorBoard event files when tensorboardX is installed.")
flags.DEFINE_string("sweep_lrs", "", "Sweep: peak learning rates (grid, e.g. 'logspace:-4:-2:8'); empty = --lr.")
flags.DEFINE_string("sweep_offsets", "", "Sweep: gate offsets delta added to --a_log_offset (A_log += delta, Mamba-2); empty = none.")
flags.DEFINE_boolean("sweep", False, "Train as a vmapped sweep even with one replica.")
flags.DEFINE_string("stop_metric", "seq_accuracy", "Eval metric of the sweep's escape and early-stop rules.")
flags.DEFINE_float("escape_thr", None, "Sweep: a replica escapes at the first eval with stop_metric above this.")
flags.DEFINE_float("stop_thr", None, "Sweep: a replica stops once stop_metric reaches this.")

FLAGS = flags.FLAGS


def _require(name):
    if FLAGS[name].value is None:
        raise ConfigError(f"--{name} is required for --program=train")
    return FLAGS[name].value


def config_from_flags() -> train_lm.TrainLMCfg:
    steps, batch, lr = _require("steps"), _require("batch"), _require("lr")
    base = ModelCfg()
    if FLAGS.preset is not None:
        if FLAGS.preset not in presets.PRESETS:
            raise ConfigError(f"--preset={FLAGS.preset}: expected one of {', '.join(sorted(presets.PRESETS))}")
        base = presets.PRESETS[FLAGS.preset]
    model = dataclass_flags.build(ModelCfg, base)
    opt = dataclass_flags.build(optim.OptimCfg, optim.OptimCfg(lr=lr, total_steps=steps), prefix="opt_",
                                skip=("lr", "total_steps"))
    mesh = dataclass_flags.build(meshlib.MeshCfg, meshlib.MeshCfg(), prefix="mesh_")
    try:
        task = synthetic_lm.SyntheticCfg(FLAGS.task, batch, FLAGS.seq_len, model.vocab_size).validate()
        loop_cfg = loop.LoopCfg(steps=steps, log_every=FLAGS.log_every, eval_every=FLAGS.eval_every,
                                ckpt_every=FLAGS.ckpt_every, keep_ckpts=FLAGS.keep_ckpts,
                                tensorboard=FLAGS.tensorboard).validate()
        lrs = parse_grid("sweep_lrs", FLAGS.sweep_lrs) or [lr]
        offsets = parse_grid("sweep_offsets", FLAGS.sweep_offsets) or [0.0]
    except ValueError as e:
        raise ConfigError(f"--{str(e)}" if not str(e).startswith("--") else str(e)) from None
    if FLAGS.seeds < 1:
        raise ConfigError(f"--seeds={FLAGS.seeds}: expected >= 1")
    if any(v <= 0 for v in lrs):
        raise ConfigError(f"--sweep_lrs={FLAGS.sweep_lrs}: expected positive learning rates")
    replicas = tuple(sweep.grid(range(FLAGS.seed, FLAGS.seed + FLAGS.seeds), lrs, offsets))
    stop = sweep.StopRule(FLAGS.stop_metric, FLAGS.escape_thr, FLAGS.stop_thr)
    cfg = train_lm.TrainLMCfg(model=model, optim=opt, task=task, loop=loop_cfg, mesh=mesh, replicas=replicas,
                              stop=stop, eval_batches=FLAGS.eval_batches, preset=FLAGS.preset,
                              force_sweep=FLAGS.sweep)
    return cfg.validate()


def describe(cfg) -> str:
    return train_lm.describe(cfg)


def run(cfg, run_dir: str) -> dict:
    return train_lm.run(cfg, run_dir)


def as_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
