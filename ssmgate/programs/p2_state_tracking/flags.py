"""Flags of the P2 state-tracking program (`--program=p2_state_tracking`) and their translation.

The model flags (training_flags) override the shared width and depth of every row (default: the
protocol §6.2 state-tracking model, 1 layer for parity / mod 3, 3 for arithmetic); `--lr` is
the learning-rate grid, `--steps` / `--batch` / `--opt_*` the protocol, `--stop_thr` early stopping on the validation accuracy.
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags, training_flags as tf
from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.programs.p2_state_tracking import program as p2
from ssmgate.tasks import state_tracking as st

# The curriculum's flags are StateTrackDataCfg's fields (its max_len is --st_l_max1; task and batch are shared
# flags); the rest are StateTrackingCfg's; all --st_<field>.
PREFIX = "st_"
DATA_NAMES = {"L_min": "st_l_min", "L_max0": "st_l_max0", "L_max1": "st_l_max1", "max_len": "st_l_max1"}
DATA_SKIP = ("task", "batch", "max_len")
dataclass_flags.define(st.StateTrackDataCfg, prefix=PREFIX, skip=DATA_SKIP, names=DATA_NAMES, module_name=__name__,
                       helps={
    "L_min": "Curriculum: shortest training length.",
    "L_max0": "Curriculum: longest training length at step 0.",
    "L_max1": "Curriculum: longest training length after the ramp.",
    "ramp_steps": "Curriculum: steps over which the longest length grows (default: protocol §6.2 per task, 6000 "
                  "parity/mod 3, 10000 arithmetic).",
    "hold_steps": "Curriculum: steps at --st_l_max0 before the ramp starts (0 = protocol §6.2).",
})
RUN_SKIP = ("data", "spec")
dataclass_flags.define(p2.StateTrackingCfg, prefix=PREFIX, skip=RUN_SKIP, module_name=__name__, helps={
    "models": f"Table 2 rows to train: some of {', '.join(p2.MODELS)}.",
    "val_n": "Validation sequences (test length, own seed) that choose the learning rate.",
    "test_n": "Test sequences per test length.",
    "test_lens": "Test lengths (arithmetic uses the odd length below each).",
    "len_quantum": "Training batches are padded to the smallest multiple of this that holds the curriculum's longest "
                   "length (one compilation per width; 0 = always --st_l_max1).",
    "len_buckets": "Each training batch draws one bucket of --st_len_quantum lengths and is padded to its top (every "
                   "sequence's length stays U{l_min..L_max(step)}; a batch's lengths are alike).",
})
# Their names before the prefix, still read.
dataclass_flags.keep_old_names({old: PREFIX + old for old in (
    "models", "l_min", "l_max0", "l_max1", "ramp_steps", "hold_steps", "len_quantum", "len_buckets", "val_n", "test_n",
    "test_lens")}, __name__)

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "seeds", "lr", "model", "optim", "mesh", "loop", "stop", "task")


def config_from_flags() -> p2.StateTrackingCfg:
    batch = tf.require("batch", "p2_state_tracking")
    task = tf.require("task", "p2_state_tracking")
    if task not in st.TASKS:
        raise ConfigError(f"--task={task}: expected one of {', '.join(st.TASKS)} for --program=p2_state_tracking")
    base = st.StateTrackDataCfg(task=task, batch=batch, ramp_steps=st.PAPER_RAMP_STEPS[task])
    longest = FLAGS.st_l_max1 if FLAGS.st_l_max1 is not None else base.L_max1
    data = dataclass_flags.build(st.StateTrackDataCfg, base, prefix=PREFIX, skip=DATA_SKIP, names=DATA_NAMES,
                                 extra={"max_len": longest})
    spec = tf.run_spec("p2_state_tracking", metric="accuracy", lr_sweep=True, loop_name=task,
                       model_base=presets.state_tracking("m3_native", p2.LAYERS[task]))
    return dataclass_flags.build(p2.StateTrackingCfg, p2.StateTrackingCfg(data=data, spec=spec), prefix=PREFIX,
                                 skip=RUN_SKIP)


def describe(cfg) -> str:
    return p2.describe(cfg)


def run(cfg, run_dir) -> dict:
    return p2.run(cfg, run_dir)
