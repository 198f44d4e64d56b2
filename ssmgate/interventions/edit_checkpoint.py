"""Command line for parameter edits that write a new checkpoint (issue #7, P1 §5's gate scaling):

    python -m ssmgate.interventions.edit_checkpoint --src_run_dir=runs/lm --dst_run_dir=runs/lm_s0.25 \
        --gate_scale=0.25                                   # Mamba-2: A_log += log s
    python -m ssmgate.interventions.edit_checkpoint --src_run_dir=runs/lm --dst_run_dir=runs/lm_dt \
        --edit_param=layers_0/mixer/dt_bias --edit_shift=1.0 [--edit_scale=1.0]   # leaf * scale + shift

Then run the source run's flag file with `--run_dir=<dst_run_dir>`: it resumes from the edited
weights (evaluation only if the run had finished; more training if `--steps` is larger).
"""
from __future__ import annotations

from absl import app, flags, logging

from ssmgate.interventions.edits import edit_checkpoint, edit_param, scale_gate
from ssmgate.train.checkpoint import CheckpointError

flags.DEFINE_string("src_run_dir", None, "Run directory whose latest checkpoint is edited.", required=True)
flags.DEFINE_string("dst_run_dir", None, "New run directory for the edited checkpoint.", required=True)
flags.DEFINE_float("gate_scale", None, "P1's gate scale s > 0 on every Mamba-2 mixer (A_log += log s).")
flags.DEFINE_string("edit_param", None, "Path of one parameter leaf, e.g. layers_0/mixer/dt_bias.")
flags.DEFINE_float("edit_scale", 1.0, "--edit_param: multiply the leaf by this.")
flags.DEFINE_float("edit_shift", 0.0, "--edit_param: then add this.")
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines would bury the one line this prints
    if (FLAGS.gate_scale is None) == (FLAGS.edit_param is None):
        raise app.UsageError("expected exactly one of --gate_scale and --edit_param")
    if FLAGS.gate_scale is not None:
        if not FLAGS.gate_scale > 0:
            raise app.UsageError(f"--gate_scale={FLAGS.gate_scale}: expected s > 0")
        edit, note = (lambda p: scale_gate(p, FLAGS.gate_scale)), f"gate scale s={FLAGS.gate_scale:g}"
    else:
        a, b = FLAGS.edit_scale, FLAGS.edit_shift
        edit = lambda p: edit_param(p, FLAGS.edit_param, lambda x: (x * a + b).astype(x.dtype))
        note = f"{FLAGS.edit_param} * {a:g} + {b:g}"
    try:
        step = edit_checkpoint(FLAGS.src_run_dir, FLAGS.dst_run_dir, edit, note)
    except (CheckpointError, KeyError, ValueError) as e:
        raise app.UsageError(str(e)) from None
    print(f"[edit_checkpoint] {note}: step {step} of {FLAGS.src_run_dir} -> {FLAGS.dst_run_dir}/checkpoints", flush=True)


if __name__ == "__main__":
    app.run(main)
