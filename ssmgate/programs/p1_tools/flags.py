"""Flags of the P1 tool-calling program (`--program=p1_tools`) and their translation to P1ToolsCfg.

Model, optimizer, mesh and loop flags are the shared ones (ssmgate.cli.training_flags); the model
flags must describe the `--init_run` checkpoint's model. `--gate_offset` is the grid of gate offsets,
one replica each (P1's gate scales s are written `ln:s`).
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import training_flags as tf
from ssmgate.config_error import ConfigError
from ssmgate.programs.p1_tools import program as p1_tools

_T = p1_tools.ToolsCfg()
flags.DEFINE_string("init_run", "", "Run directory of the pretrained model (its latest checkpoint); relative = a "
                    "sibling of --run_dir; empty = fresh weights.")
flags.DEFINE_integer("tools_test_percent", _T.test_percent, "Functions held out for testing (percent, by name).")
flags.DEFINE_integer("tools_k_max", _T.k_max, "Training pools have k ~ U{1..k_max} tools.")
flags.DEFINE_integer("tools_seq_len", _T.seq_len, "The longest training row (bytes); must hold k_max tools.")
flags.DEFINE_integer("tools_quantum", _T.quantum, "Training rows are padded to a multiple of this.")
flags.DEFINE_list("tools_eval_k", [str(k) for k in _T.eval_k], "Pool sizes of the main-setting evaluation.")
flags.DEFINE_list("weak_betas", [f"{b:g}" for b in _T.weak_betas], "Strengths of the weak retriever (empty: none).")
flags.DEFINE_list("weak_eval_k", [str(k) for k in _T.weak_k], "Pool sizes of the weak-retriever evaluation.")
flags.DEFINE_integer("tools_max_new", _T.max_new, "Bytes decoded per answer.")
flags.DEFINE_integer("tools_eval_batch", _T.eval_batch, "Prompts per decoding program.")
flags.DEFINE_integer("tools_max_test", None, "Evaluate only the first N held-out questions.")
flags.DEFINE_string("bfcl_data_dir", None, "BFCL data folder (default: the bfcl-eval package's data/).")

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "lr", "gate_offset", "model", "optim", "mesh", "loop", "tokenizer")


def _numbers(name: str, kind):
    try:
        return tuple(kind(v) for v in FLAGS[name].value)
    except ValueError:
        raise ConfigError(f"--{name}={','.join(FLAGS[name].value)}: expected comma-separated "
                          f"{'integers' if kind is int else 'numbers'}") from None


def config_from_flags() -> p1_tools.P1ToolsCfg:
    batch = tf.require("batch", "p1_tools")
    spec = tf.run_spec("p1_tools", metric="accuracy")
    tools = p1_tools.ToolsCfg(test_percent=FLAGS.tools_test_percent, k_max=FLAGS.tools_k_max,
                              seq_len=FLAGS.tools_seq_len, quantum=FLAGS.tools_quantum, batch=batch,
                              eval_k=_numbers("tools_eval_k", int), weak_betas=_numbers("weak_betas", float),
                              weak_k=_numbers("weak_eval_k", int), max_new=FLAGS.tools_max_new,
                              eval_batch=FLAGS.tools_eval_batch, max_test=FLAGS.tools_max_test,
                              data_dir=FLAGS.bfcl_data_dir, tokenizer=FLAGS.tokenizer)
    return p1_tools.P1ToolsCfg(tools=tools, spec=spec, init_run=FLAGS.init_run).validate()


def describe(cfg) -> str:
    return p1_tools.describe(cfg)


def run(cfg, run_dir) -> dict:
    return p1_tools.run(cfg, run_dir)
