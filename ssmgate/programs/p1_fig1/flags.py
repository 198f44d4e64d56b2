"""Flags of the P1 Figure 1 program (`--program=p1_fig1`): ToyGateCfg's fields (`--fig1_<field>`), its
learning rate, batch, steps and seeds from the run flags (ssmgate.cli.training_flags)."""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags, training_flags as tf
from ssmgate.cli.grids import parse_grid
from ssmgate.programs.p1_fig1 import program as p1_fig1

PROGRAM = "p1_fig1"
RUN_FIELDS = ("lr", "batch", "steps", "seeds", "seed")


def _query_distance(flag: str, text: str) -> int | None:
    text = text.strip().lower()
    if text == "uniform":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected an integer distance >= 1 or 'uniform'") from None


def _distances(flag: str, text: str) -> tuple[int, ...]:
    values = parse_grid(flag, text)
    if any(v != int(v) for v in values):
        raise ValueError("expected integer distances")
    return tuple(int(v) for v in values)


PREFIX = "fig1_"
NAMES = {"delta": "fig1_query_distance", "eval_delta": "fig1_eval_distances"}
PARSERS = {"panel": lambda flag, text: text.strip().lower(), "delta": _query_distance, "alpha0": parse_grid,
           "tau": parse_grid, "eval_delta": _distances}
dataclass_flags.define(p1_fig1.ToyGateCfg, prefix=PREFIX, skip=RUN_FIELDS, names=NAMES, parsers=PARSERS,
                       choices={"train_query": ("matched", "uniform")}, module_name=__name__, helps={
    "panel": "Figure 1 panel: a, b, c or d.",
    "d": "Key dimension d.",
    "ell": "Context length ell (tokens).",
    "delta": "Query distance (1 = last token) or 'uniform'.",
    "P": "Panels a/b: dictionary size.",
    "eps": "Panels a/b: label-flip probability, in (0, 0.5).",
    "alpha0": "Panels a/b: grid of initial retentions alpha0 in (0, 1).",
    "tau": "Panels c/d: grid of frozen gate lengths tau = exp(-lambda).",
    "train_lambda": "Panels c/d: train the gate too (the paper freezes it).",
    "n_test": "Panels c/d: test contexts (each answers every evaluated distance).",
    "eval_delta": "Panel c: query distances to evaluate; panel d: empty = all 1..ell.",
    "train_query": "Panels c/d: query distances of training batches: 'matched' = one model per evaluated distance (c) "
                   "or distance bin (d); 'uniform' = one model per tau, distance uniform on 1..ell.",
    "delta_bins": "Panel d, matched training: log-spaced distance bins (one model each).",
    "segment": "SGD steps per compiled segment (progress lines, metrics.jsonl).",
})
# Their names before the prefix, still read.
dataclass_flags.keep_old_names({old: PREFIX + old for old in (
    "panel", "d", "ell", "query_distance", "P", "eps", "alpha0", "tau", "train_lambda", "n_test", "eval_distances",
    "train_query", "delta_bins", "segment")}, __name__)

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "seeds", "lr")
REQUIRED = ("lr", "batch", "steps")   # the run's; ToyGateCfg's own fields without a default: build() requires them


def config_from_flags() -> p1_fig1.ToyGateCfg:
    """Reads and validates the flags; raises p1_fig1.ConfigError naming the bad flag."""
    for name in REQUIRED:
        tf.require(name, PROGRAM)
    grid = tf.grid()
    run = {"lr": tf.one_lr(PROGRAM), "batch": FLAGS.batch, "steps": FLAGS.steps, "seeds": grid.seeds,
           "seed": grid.seed}
    cfg = dataclass_flags.build(p1_fig1.ToyGateCfg, prefix=PREFIX, skip=RUN_FIELDS, names=NAMES, parsers=PARSERS,
                                extra=run, program=PROGRAM)
    return p1_fig1.validate(cfg)


def describe(cfg: p1_fig1.ToyGateCfg) -> str:
    return str(cfg)


def run(cfg: p1_fig1.ToyGateCfg, run_dir) -> dict:
    return p1_fig1.run(cfg, run_dir)
