"""Flags of the P2 theory program (`--program=p2_theory`) and their translation to TheoryCfg.

The run trains nothing: it evaluates ssmgate.theory.oscillation (protocol §1.5-1.8) on random draws
and closed forms, in seconds on a CPU.
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags
from ssmgate.programs.p2_theory import program as p2_theory

dataclass_flags.define(p2_theory.TheoryCfg, prefix="theory_", module_name=__name__, helps={
    "draws": "Random draws per linear-attention family of P2 Table 8 (check C5 of protocol §9: 1,000).",
    "key_dim": "Key dimension d of the d x d families' draws (>= 2).",
    "gain_steps": "Steps of the simulated rotating accumulator (check C4: 5,000).",
    "seed": "Seed of the random draws.",
    "figure": "Draw the families' spectra and damping ratios (spectra.png).",
})

FLAGS = flags.FLAGS
GROUPS_READ = ()


def config_from_flags() -> p2_theory.TheoryCfg:
    return dataclass_flags.build(p2_theory.TheoryCfg, prefix="theory_")


def describe(cfg: p2_theory.TheoryCfg) -> str:
    return str(cfg)


def run(cfg: p2_theory.TheoryCfg, run_dir: str) -> dict:
    return p2_theory.run(cfg, run_dir)
