"""Flags of the `train` program and their translation to TrainLMCfg (the shared model, optimizer,
mesh, loop, learning-rate and gate-offset flags are in ssmgate.cli.training_flags). A grid in `--lr`
or `--gate_offset`, or `--seeds` > 1, trains every combination as one vmapped sweep."""
from __future__ import annotations

from absl import flags

from ssmgate.cli import training_flags as tf
from ssmgate.config_error import ConfigError
from ssmgate.programs.train_lm import program as train_lm
from ssmgate.tasks import synthetic_lm

flags.DEFINE_integer("eval_batches", 4, "Batches of the fixed evaluation set.")
flags.DEFINE_boolean("sweep", False, "Train as a vmapped sweep even with one replica.")
flags.DEFINE_string("stop_metric", "seq_accuracy", "Eval metric of the sweep's escape and early-stop rules.")

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "seeds", "lr", "gate_offset", "model", "optim", "mesh", "loop", "stop", "seq_len", "task")


def config_from_flags() -> train_lm.TrainLMCfg:
    batch = tf.require("batch", "train")
    spec = tf.run_spec("train", metric=FLAGS.stop_metric, lr_sweep=True)  # each replica its own lr
    task_name = FLAGS.task or "copy"
    if task_name not in synthetic_lm.TASKS:
        raise ConfigError(f"--task={task_name}: expected one of {', '.join(synthetic_lm.TASKS)} for --program=train")
    try:
        task = synthetic_lm.SyntheticCfg(task_name, batch, FLAGS.seq_len, spec.model.vocab_size).validate()
    except ValueError as e:
        raise ConfigError(f"--{e}" if not str(e).startswith("--") else str(e)) from None
    return train_lm.TrainLMCfg(task=task, spec=spec, eval_batches=FLAGS.eval_batches,
                               force_sweep=FLAGS.sweep).validate()


def describe(cfg) -> str:
    return train_lm.describe(cfg)


def run(cfg, run_dir) -> dict:
    return train_lm.run(cfg, run_dir)
