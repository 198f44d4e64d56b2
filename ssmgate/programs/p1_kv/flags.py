"""Flags of the P1 KV-retrieval program (`--program=p1_kv`, protocol §3) and their translation to KVRunCfg.

Task flags are `--kv_*`; `--gate_offset` is the grid of gate offsets delta (Mamba-2: A_log += delta),
trained with `--seeds` seeds each at the one learning rate `--lr` as a single vmapped sweep. The model
comes from `--preset` (p1_kv_mamba2, p1_kv_gpt_neox) and the model flags, the optimizer from `--opt_*`,
the loop from `--steps`, `--eval_every`, ... (ssmgate.cli.training_flags). `--escape_thr` / `--stop_thr`
default to the protocol's 0.95 / 0.99 when not given.
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags, training_flags as tf
from ssmgate.cli.grids import parse_ints
from ssmgate.programs.p1_kv import program as p1_kv
from ssmgate.tasks import kv_retrieval as kv

# The task's flags are KVCfg's fields (--kv_<field>; its defaults, the paper's task, are the flags' defaults).
dataclass_flags.define(kv.KVCfg, prefix="kv_", skip=("batch",), names=p1_kv.TASK_FLAGS, choices={"query": kv.QUERIES},
                       module_name=__name__, helps={
    "n_content": "KV task: content tokens (the model vocabulary adds 5 specials).",
    "m": "KV task: tokens per key and per value.",
    "dict_size": "KV task: (key, value) pairs of the static dictionary.",
    "n_max": "KV task: N, training draws n ~ U{1..N} pairs; evaluation uses n = N.",
    "eps": "KV task: per-token perturbation probability of in-context values.",
    "q": "KV task: query ratio, n_q = max(1, ceil(q n)).",
    "query": "KV task: which keys are queried, the first ceil(q n) of the context (best_first, Fig 2a/b) or the "
             "last (best_last, Fig 2c).",
    "dict_seed": "KV task: seed of the static dictionary (one per run).",
})
# The program's own fields (KVRunCfg's), --kv_<field> (n_buckets: --kv_buckets).
RUN_SKIP = ("kv", "spec")
RUN_NAMES = {"n_buckets": "kv_buckets"}
RUN_PARSERS = {"lengen_ns": parse_ints}
dataclass_flags.define(p1_kv.KVRunCfg, prefix="kv_", skip=RUN_SKIP, names=RUN_NAMES, parsers=RUN_PARSERS,
                       module_name=__name__, helps={
    "n_buckets": "KV task: training length buckets over 1..N (one compiled step each).",
    "lengen_ns": "best_last: pair counts n of the length-generalisation sets evaluated after training (e.g. "
                 "'512,768,1024'); empty = none.",
})
dataclass_flags.keep_old_names({"lengen_ns": "kv_lengen_ns"}, __name__)  # its name before the prefix, still read

FLAGS = flags.FLAGS
PROGRAM = "p1_kv"
GROUPS_READ = ("run", "seeds", "lr", "gate_offset", "model", "optim", "mesh", "loop", "stop", "eval_sets")
ESCAPE_THR, STOP_THR = 0.95, 0.99  # protocol §3.3 / 3.4


def config_from_flags() -> p1_kv.KVRunCfg:
    batch = tf.require("batch", PROGRAM)
    spec = tf.run_spec(PROGRAM, metric=p1_kv.METRIC, escape_thr=ESCAPE_THR, stop_thr=STOP_THR)
    task = dataclass_flags.build(kv.KVCfg, kv.KVCfg(batch=batch), prefix="kv_", skip=("batch",),
                                 names=p1_kv.TASK_FLAGS)
    return dataclass_flags.build(p1_kv.KVRunCfg, p1_kv.KVRunCfg(kv=task, spec=spec), prefix="kv_", skip=RUN_SKIP,
                                 names=RUN_NAMES, parsers=RUN_PARSERS)


def describe(cfg) -> str:
    return p1_kv.describe(cfg)


def run(cfg, run_dir) -> dict:
    return p1_kv.run(cfg, run_dir)
