"""Flags of the P2 theory program (`--program=p2_theory`) and their translation to TheoryCfg.

The run trains nothing: it evaluates ssmgate.theory.oscillation (protocol §1.5-1.8) on random draws
and closed forms, in seconds on a CPU.
"""
from __future__ import annotations

from absl import flags

from ssmgate.programs.p2_theory import program as p2_theory

flags.DEFINE_integer("theory_draws", 1000, "Random draws per linear-attention family of P2 Table 8 (check C5 of "
                     "protocol §9: 1,000).")
flags.DEFINE_integer("theory_key_dim", 4, "Key dimension d of the d x d families' draws (>= 2).")
flags.DEFINE_integer("theory_gain_steps", 5000, "Steps of the simulated rotating accumulator (check C4: 5,000).")
flags.DEFINE_integer("theory_seed", 0, "Seed of the random draws.")
flags.DEFINE_boolean("theory_figure", True, "Draw the families' spectra and damping ratios (spectra.png).")

FLAGS = flags.FLAGS
GROUPS_READ = ()


def config_from_flags() -> p2_theory.TheoryCfg:
    return p2_theory.TheoryCfg(draws=FLAGS.theory_draws, key_dim=FLAGS.theory_key_dim,
                               gain_steps=FLAGS.theory_gain_steps, seed=FLAGS.theory_seed,
                               figure=FLAGS.theory_figure).validate()


def describe(cfg: p2_theory.TheoryCfg) -> str:
    return str(cfg)


def run(cfg: p2_theory.TheoryCfg, run_dir: str) -> dict:
    return p2_theory.run(cfg, run_dir)
