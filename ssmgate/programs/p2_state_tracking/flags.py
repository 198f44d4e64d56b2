"""Flags of the P2 state-tracking program (`--program=p2_state_tracking`) and their translation.

The model flags (training_flags) override the shared width and depth of every row (default: the
protocol §6.2 state-tracking model, 1 layer for parity / mod 3, 3 for arithmetic); `--lr` is
the learning-rate grid, `--steps` / `--batch` / `--opt_*` the protocol, `--stop_thr` early stopping on the validation accuracy.
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import training_flags as tf
from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.programs.p2_state_tracking import program as p2
from ssmgate.tasks import state_tracking as st

flags.DEFINE_list("models", list(p2.TABLE_MODELS) + ["underdamped_companion"],
                  f"Table 2 rows to train: some of {', '.join(p2.MODELS)}.")
flags.DEFINE_integer("l_min", 3, "Curriculum: shortest training length.")
flags.DEFINE_integer("l_max0", 40, "Curriculum: longest training length at step 0.")
flags.DEFINE_integer("l_max1", 160, "Curriculum: longest training length after the ramp.")
flags.DEFINE_integer("ramp_steps", None, "Curriculum: steps over which the longest length grows (default: protocol §6.2 "
                     "per task, 6000 parity/mod 3, 10000 arithmetic).")
flags.DEFINE_integer("hold_steps", 0, "Curriculum: steps at --l_max0 before the ramp starts (0 = protocol §6.2).")
flags.DEFINE_integer("len_quantum", 32, "Training batches are padded to the smallest multiple of this that holds "
                     "the curriculum's longest length (one compilation per width; 0 = always --l_max1).")
flags.DEFINE_bool("len_buckets", False, "Each training batch draws one bucket of --len_quantum lengths and is "
                  "padded to its top (every sequence's length stays U{l_min..L_max(step)}; a batch's lengths are "
                  "alike).")
flags.DEFINE_integer("val_n", 2048, "Validation sequences (test length, own seed) that choose the learning rate.")
flags.DEFINE_integer("test_n", 8192, "Test sequences per test length.")
flags.DEFINE_list("test_lens", ["224", "256"], "Test lengths (arithmetic uses the odd length below each).")

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "seeds", "lr", "model", "optim", "mesh", "loop", "stop", "task")


def config_from_flags() -> p2.StateTrackingCfg:
    batch = tf.require("batch", "p2_state_tracking")
    task = tf.require("task", "p2_state_tracking")
    if task not in st.TASKS:
        raise ConfigError(f"--task={task}: expected one of {', '.join(st.TASKS)} for --program=p2_state_tracking")
    ramp = FLAGS.ramp_steps if FLAGS.ramp_steps is not None else st.PAPER_RAMP_STEPS[task]
    try:
        data = st.StateTrackDataCfg(task=task, batch=batch, max_len=FLAGS.l_max1, L_min=FLAGS.l_min,
                                    L_max0=FLAGS.l_max0, L_max1=FLAGS.l_max1, ramp_steps=ramp,
                                    hold_steps=FLAGS.hold_steps).validate()
        test_lens = tuple(int(v) for v in FLAGS.test_lens)
    except ValueError as e:
        raise ConfigError(_flag_message(str(e))) from None
    spec = tf.run_spec("p2_state_tracking", metric="accuracy", lr_sweep=True, loop_name=task,
                       model_base=presets.state_tracking("m3_native", p2.LAYERS[task]))
    return p2.StateTrackingCfg(data=data, spec=spec, models=tuple(FLAGS.models), val_n=FLAGS.val_n,
                               test_n=FLAGS.test_n, test_lens=test_lens, len_quantum=FLAGS.len_quantum,
                               len_buckets=FLAGS.len_buckets).validate()


_FIELD_FLAGS = {"L_min": "l_min", "L_max0": "l_max0", "L_max1": "l_max1", "ramp_steps": "ramp_steps",
                "batch": "batch", "max_len": "l_max1", "hold_steps": "hold_steps"}


def _flag_message(message: str) -> str:
    """'L_max0=3: expected ...' -> '--l_max0=3: expected ...' (the data config's field as its flag)."""
    for field, flag in _FIELD_FLAGS.items():
        if message.startswith(f"{field}="):
            return f"--{flag}=" + message[len(field) + 1:]
    return message


def describe(cfg) -> str:
    return p2.describe(cfg)


def run(cfg, run_dir) -> dict:
    return p2.run(cfg, run_dir)
