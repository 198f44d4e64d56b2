"""Flags of the P1 tool-calling program (`--program=p1_tools`) and their translation to P1ToolsCfg.

Model, optimizer, mesh and loop flags are the shared ones (ssmgate.cli.training_flags); the model
flags must describe the `--tools_init_run` checkpoint's model. `--gate_offset` is the grid of gate offsets,
one replica each (P1's gate scales s are written `ln:s`).
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags, training_flags as tf
from ssmgate.programs.p1_tools import program as p1_tools

# The task's flags are ToolsCfg's fields and the program's P1ToolsCfg's (--tools_<field>, two named more plainly);
# --batch and --tokenizer are shared.
TOOLS_NAMES = p1_tools.TOOLS_FLAGS
TOOLS_SKIP = ("batch", "tokenizer")
dataclass_flags.define(p1_tools.ToolsCfg, prefix="tools_", skip=TOOLS_SKIP, names=TOOLS_NAMES, module_name=__name__,
                       helps={
    "test_percent": "Functions held out for testing (percent, by name).",
    "k_max": "Training pools have k ~ U{1..k_max} tools.",
    "seq_len": "The longest training row (bytes); must hold k_max tools.",
    "quantum": "Training rows are padded to a multiple of this.",
    "eval_k": "Pool sizes of the main-setting evaluation.",
    "weak_betas": "Strengths of the weak retriever (empty: none).",
    "weak_k": "Pool sizes of the weak-retriever evaluation.",
    "max_new": "Bytes decoded per answer.",
    "eval_batch": "Prompts per decoding program.",
    "max_test": "Evaluate only the first N held-out questions.",
    "data_dir": "BFCL data folder (default: the bfcl-eval package's data/).",
})
dataclass_flags.define(p1_tools.P1ToolsCfg, prefix="tools_", skip=("tools", "spec"), module_name=__name__, helps={
    "init_run": "Run directory of the pretrained model (its latest checkpoint); relative = a sibling of --run_dir; "
                "empty = fresh weights."})
# Their names before the prefix, still read.
dataclass_flags.keep_old_names({"init_run": "tools_init_run", "weak_betas": "tools_weak_betas",
                                "weak_eval_k": "tools_weak_eval_k", "bfcl_data_dir": "tools_bfcl_data_dir"}, __name__)

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "lr", "gate_offset", "model", "optim", "mesh", "loop", "tokenizer")


def config_from_flags() -> p1_tools.P1ToolsCfg:
    batch = tf.require("batch", "p1_tools")
    spec = tf.run_spec("p1_tools", metric="accuracy")
    tools = dataclass_flags.build(p1_tools.ToolsCfg, p1_tools.ToolsCfg(batch=batch, tokenizer=FLAGS.tokenizer),
                                  prefix="tools_", skip=TOOLS_SKIP, names=TOOLS_NAMES)
    return dataclass_flags.build(p1_tools.P1ToolsCfg, p1_tools.P1ToolsCfg(tools=tools, spec=spec), prefix="tools_",
                                 skip=("tools", "spec"))


def describe(cfg) -> str:
    return p1_tools.describe(cfg)


def run(cfg, run_dir) -> dict:
    return p1_tools.run(cfg, run_dir)
