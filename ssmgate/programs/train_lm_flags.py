"""Flags of the `train` program and their translation to TrainLMCfg (the shared model, optimizer,
mesh and loop flags are in training_flags)."""
from __future__ import annotations

from absl import flags

from ssmgate.programs import training_flags as tf
from ssmgate.programs import train_lm
from ssmgate.programs.config_error import ConfigError
from ssmgate.programs.grids import parse_grid
from ssmgate.tasks import synthetic_lm
from ssmgate.train import sweep

flags.DEFINE_integer("seq_len", 64, "Model input length (tokens per sequence).")
flags.DEFINE_integer("eval_batches", 4, "Batches of the fixed evaluation set.")
flags.DEFINE_string("sweep_offsets", "", "Sweep: gate offsets delta added to --a_log_offset (A_log += delta, Mamba-2); empty = none.")
flags.DEFINE_boolean("sweep", False, "Train as a vmapped sweep even with one replica.")
flags.DEFINE_string("stop_metric", "seq_accuracy", "Eval metric of the sweep's escape and early-stop rules.")
flags.DEFINE_float("escape_thr", None, "Sweep: a replica escapes at the first eval with stop_metric above this.")
flags.DEFINE_float("stop_thr", None, "Sweep: a replica stops once stop_metric reaches this.")

FLAGS = flags.FLAGS


def config_from_flags() -> train_lm.TrainLMCfg:
    steps, batch = tf.require("steps", "train"), tf.require("batch", "train")
    lrs = tf.learning_rates(FLAGS.lr)  # --sweep_lrs, or --lr; the optimizer's own lr is set per replica
    task_name = FLAGS.task or "copy"
    if task_name not in synthetic_lm.TASKS:
        raise ConfigError(f"--task={task_name}: expected one of {', '.join(synthetic_lm.TASKS)} for --program=train")
    model = tf.model_cfg()
    try:
        task = synthetic_lm.SyntheticCfg(task_name, batch, FLAGS.seq_len, model.vocab_size).validate()
        offsets = parse_grid("sweep_offsets", FLAGS.sweep_offsets) or [0.0]
    except ValueError as e:
        raise ConfigError(f"--{e}" if not str(e).startswith("--") else str(e)) from None
    if FLAGS.seeds < 1:
        raise ConfigError(f"--seeds={FLAGS.seeds}: expected >= 1")
    replicas = tuple(sweep.grid(range(FLAGS.seed, FLAGS.seed + FLAGS.seeds), lrs, offsets))
    stop = sweep.StopRule(FLAGS.stop_metric, FLAGS.escape_thr, FLAGS.stop_thr)
    cfg = train_lm.TrainLMCfg(model=model, optim=tf.optim_cfg(lrs[0], steps), task=task, loop=tf.loop_cfg(steps),
                              mesh=tf.mesh_cfg(), replicas=replicas, stop=stop, eval_batches=FLAGS.eval_batches,
                              preset=FLAGS.preset, force_sweep=FLAGS.sweep)
    return cfg.validate()


def describe(cfg) -> str:
    return train_lm.describe(cfg)


def run(cfg, run_dir: str) -> dict:
    return train_lm.run(cfg, run_dir)
