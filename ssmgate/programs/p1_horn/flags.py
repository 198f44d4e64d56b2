"""Flags of the P1 Horn-clause program (`--program=p1_horn`, protocol §4) and their translation to HornRunCfg.

Task flags are `--horn_*`. Shared flags (ssmgate.cli.training_flags): `--gate_offset` (the grid of
gate offsets delta, Mamba-2 A_log += delta; a Transformer takes 0 only), `--eval_n` (examples of the
fixed evaluation set, here the first-turn set on the training distribution) and `--lengen_eval_n`
(examples per length-generalisation set). `--escape_thr` / `--stop_thr` act on the first-turn accuracy
and are off unless given (the paper trains every run for the full budget). The model comes from `--preset`
(p1_horn_mamba2, p1_horn_llama) and the model flags, the optimizer from `--opt_*` (protocol §4.6: Muon,
`--opt_name=muon`, `--opt_muon_adam_lr`), the loop from `--steps`, `--eval_every`, ... (the shared groups).
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags, training_flags as tf
from ssmgate.cli.grids import parse_grid, parse_ints
from ssmgate.programs.p1_horn import program as p1_horn
from ssmgate.tasks import horn

# The task's flags are HornCfg's fields (--horn_<field>; its defaults, the paper's task, are the flags' defaults).
dataclass_flags.define(horn.HornCfg, prefix="horn_", skip=("batch", "n_sets"), names=p1_horn.TASK_FLAGS,
                       choices={"regime": horn.REGIMES, "turns": horn.TURNS}, module_name=__name__, helps={
    "regime": "Horn task: training regime, in-context retrieval (Fig 3b/c: random order, one oracle, fresh names in "
              "the first q of the pool) or lengen (Fig 3d, Table 1: PL-ranked pools best-last, all names fresh).",
    "props_per_set": "Horn task: propositions in each of the 3 sets.",
    "K": "Horn task: clauses between adjacent sets (per layer).",
    "graph_seed": "Horn task: seed of the rule graph and its static names (one per run).",
    "k_min": "Horn task: smallest training pool size.",
    "k_max": "Horn task: largest training pool size (None: the regime's protocol value, §4.4, 32 retrieval, "
             "8 lengen).",
    "q_fresh": "Horn task: retrieval pools rename their first ceil(q k) clauses.",
    "beta": "Horn task: PL inverse temperature of the lengen pools (inf allowed).",
    "turns": "Horn task: which turn the training rows ask (both: even rows turn 1, odd rows turn 2).",
    "n_buckets": "Horn task: training length buckets over k_min..k_max (one compiled step each).",
})
# The program's own fields (HornRunCfg's), --horn_<field>.
RUN_SKIP = ("horn", "spec")
RUN_PARSERS = {"lengen_ks": parse_ints, "weak_betas": parse_grid}
dataclass_flags.define(p1_horn.HornRunCfg, prefix="horn_", skip=RUN_SKIP, parsers=RUN_PARSERS, module_name=__name__,
                       helps={
    "probe_k": "Retrieval regime: pool size of the no-oracle and random-oracle-name probes (default min(32, "
               "--horn_k_max)).",
    "probe_n": "Retrieval regime: examples per probe set (default --eval_n).",
    "lengen_ks": "Lengen regime: pool sizes evaluated after training (e.g. '1,2,4,8,16,32,64,128'); empty = "
                 "protocol §4.5's 1, 2, 4, ..., 128 up to --horn_K.",
    "weak_betas": "Lengen regime: also evaluate at lengen_ks with a weak retriever, pools from a PL ranking at each "
                  "of these finite betas with no oracle injected (P1 Fig 5 top: '0,1'); empty = none.",
    "early_frac": "The 'early' probe values are the first evaluation at or after this fraction of training.",
    "gate_prompts": "Prompts of the token-averaged gate statistics (protocol §2.5).",
})

FLAGS = flags.FLAGS
PROGRAM = "p1_horn"
GROUPS_READ = ("run", "seeds", "lr", "gate_offset", "model", "optim", "mesh", "loop", "stop", "eval_sets")


def config_from_flags() -> p1_horn.HornRunCfg:
    batch = tf.require("batch", PROGRAM)
    spec = tf.run_spec(PROGRAM, metric=p1_horn.METRIC)
    task = dataclass_flags.build(horn.HornCfg, horn.HornCfg(batch=batch), prefix="horn_", skip=("batch", "n_sets"),
                                 names=p1_horn.TASK_FLAGS)
    run = dataclass_flags.overrides(p1_horn.HornRunCfg, prefix="horn_", skip=RUN_SKIP, parsers=RUN_PARSERS)
    if not run.get("lengen_ks") and task.regime == "lengen":  # none given: protocol §4.5's sizes up to K
        run["lengen_ks"] = tuple(k for k in horn.LENGEN_KS if k <= task.K)
    return p1_horn.HornRunCfg(horn=task, spec=spec, **run).validate()


def describe(cfg) -> str:
    return p1_horn.describe(cfg)


def run(cfg, run_dir) -> dict:
    return p1_horn.run(cfg, run_dir)
