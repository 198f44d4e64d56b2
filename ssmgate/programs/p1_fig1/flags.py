"""Flags of the P1 Figure 1 program (`--program=p1_fig1`) and their translation to ToyGateCfg."""
from __future__ import annotations

from absl import flags

from ssmgate.cli import training_flags as tf
from ssmgate.cli.grids import parse_grid
from ssmgate.programs.p1_fig1 import program as p1_fig1

flags.DEFINE_string("panel", None, "Figure 1 panel: a, b, c or d.")
flags.DEFINE_integer("d", None, "Key dimension d.")
flags.DEFINE_integer("ell", None, "Context length ell (tokens).")
flags.DEFINE_string("query_distance", None, "Query distance (1 = last token) or 'uniform'.")
flags.DEFINE_integer("P", 32, "Panels a/b: dictionary size.")
flags.DEFINE_float("eps", 0.1, "Panels a/b: label-flip probability, in (0, 0.5).")
flags.DEFINE_string("alpha0", "", "Panels a/b: grid of initial retentions alpha0 in (0, 1).")
flags.DEFINE_string("tau", "", "Panels c/d: grid of frozen gate lengths tau = exp(-lambda).")
flags.DEFINE_boolean("train_lambda", False, "Panels c/d: train the gate too (the paper freezes it).")
flags.DEFINE_integer("n_test", 0, "Panels c/d: test contexts (each answers every evaluated distance).")
flags.DEFINE_string("eval_distances", "", "Panel c: query distances to evaluate; panel d: empty = all 1..ell.")
flags.DEFINE_enum("train_query", "matched", ["matched", "uniform"],
                  "Panels c/d: query distances of training batches: 'matched' = one model per evaluated "
                  "distance (c) or distance bin (d); 'uniform' = one model per tau, distance uniform on 1..ell.")
flags.DEFINE_integer("delta_bins", 12, "Panel d, matched training: log-spaced distance bins (one model each).")
flags.DEFINE_integer("segment", 500, "SGD steps per compiled segment (progress lines, metrics.jsonl).")

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "seeds", "lr")
REQUIRED = ("panel", "d", "ell", "query_distance", "lr", "batch", "steps")


def config_from_flags() -> p1_fig1.ToyGateCfg:
    """Reads and validates the flags; raises p1_fig1.ConfigError naming the bad flag."""
    for name in REQUIRED:
        if FLAGS[name].value is None:
            raise p1_fig1.ConfigError(f"--{name} is required for --program=p1_fig1")
    delta_text = FLAGS.query_distance.strip().lower()
    if delta_text == "uniform":
        delta = None
    else:
        try:
            delta = int(delta_text)
        except ValueError:
            raise p1_fig1.ConfigError(f"--query_distance={FLAGS.query_distance}: expected an integer distance >= 1 or 'uniform'") from None
    try:
        alpha0 = parse_grid("alpha0", FLAGS.alpha0)
        tau = parse_grid("tau", FLAGS.tau)
        eval_delta = parse_grid("eval_distances", FLAGS.eval_distances)
    except ValueError as e:
        raise p1_fig1.ConfigError(str(e)) from None
    if any(v != int(v) for v in eval_delta):
        raise p1_fig1.ConfigError(f"--eval_distances={FLAGS.eval_distances}: expected integer distances")
    cfg = p1_fig1.ToyGateCfg(
        panel=FLAGS.panel.strip().lower(), d=FLAGS.d, ell=FLAGS.ell, delta=delta, lr=tf.one_lr("p1_fig1"),
        batch=FLAGS.batch, steps=FLAGS.steps, seeds=FLAGS.seeds, seed=FLAGS.seed, P=FLAGS.P, eps=FLAGS.eps,
        alpha0=alpha0, tau=tau, train_lambda=FLAGS.train_lambda, n_test=FLAGS.n_test,
        eval_delta=tuple(int(v) for v in eval_delta), train_query=FLAGS.train_query,
        delta_bins=FLAGS.delta_bins, segment=FLAGS.segment)
    return p1_fig1.validate(cfg)


def describe(cfg: p1_fig1.ToyGateCfg) -> str:
    return str(cfg)


def run(cfg: p1_fig1.ToyGateCfg, run_dir) -> dict:
    return p1_fig1.run(cfg, run_dir)
