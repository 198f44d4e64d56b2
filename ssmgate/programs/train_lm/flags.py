"""Flags of the `train` program and their translation to TrainLMCfg (the shared model, optimizer,
mesh, loop, learning-rate and gate-offset flags are in ssmgate.cli.training_flags). A grid in `--lr`
or `--gate_offset`, or `--seeds` > 1, trains every combination as one vmapped sweep."""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags, training_flags as tf
from ssmgate.config_error import ConfigError
from ssmgate.programs.train_lm import program as train_lm
from ssmgate.tasks import synthetic_lm
from ssmgate.train import sweep

# The program's own fields (TrainLMCfg's) and the metric of its stop rule (StopRule.metric), --train_<field>.
RUN_SKIP, RUN_NAMES = ("task", "spec"), {"force_sweep": "train_sweep"}
dataclass_flags.define(train_lm.TrainLMCfg, prefix="train_", skip=RUN_SKIP, names=RUN_NAMES, module_name=__name__,
                       helps={"eval_batches": "Batches of the fixed evaluation set.",
                              "force_sweep": "Train as a vmapped sweep even with one replica."})
dataclass_flags.define(sweep.StopRule, skip=("escape_thr", "stop_thr"), names={"metric": "train_stop_metric"},
                       module_name=__name__,
                       helps={"metric": "Eval metric of the sweep's escape and early-stop rules."})
dataclass_flags.keep_old_names({"eval_batches": "train_eval_batches", "sweep": "train_sweep",  # names before the
                                "stop_metric": "train_stop_metric"}, __name__)                 # prefix, still read

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "seeds", "lr", "gate_offset", "model", "optim", "mesh", "loop", "stop", "seq_len", "task")


def config_from_flags() -> train_lm.TrainLMCfg:
    batch = tf.require("batch", "train")
    metric = FLAGS.train_stop_metric or sweep.StopRule().metric
    spec = tf.run_spec("train", metric=metric, lr_sweep=True)  # each replica its own lr
    task_name = FLAGS.task or "copy"
    if task_name not in synthetic_lm.TASKS:
        raise ConfigError(f"--task={task_name}: expected one of {', '.join(synthetic_lm.TASKS)} for --program=train")
    try:
        task = synthetic_lm.SyntheticCfg(task_name, batch, FLAGS.seq_len, spec.model.vocab_size).validate()
    except ValueError as e:
        raise ConfigError(f"--{e}" if not str(e).startswith("--") else str(e)) from None
    return dataclass_flags.build(train_lm.TrainLMCfg, train_lm.TrainLMCfg(task=task, spec=spec), prefix="train_",
                                 skip=RUN_SKIP, names=RUN_NAMES)


def describe(cfg) -> str:
    return train_lm.describe(cfg)


def run(cfg, run_dir) -> dict:
    return train_lm.run(cfg, run_dir)
