"""The one list of ssmgate's programs and experiments, read by `ssmgate.main` (which program a
`--program` names, and which flags it reads), `ssmgate.reproduce` (which flag files each experiment
runs and which report section it writes) and the benchmarks.

A program is a package (`ssmgate.programs.<name>`; docs/extending.md adds one step by step) with
- `flags.py`: its own flags, `GROUPS_READ` (the shared flag groups of ssmgate.cli.training_flags it
  reads), `config_from_flags()`, `describe(cfg)` and `run(cfg, run_dir)`;
- `program.py`: the run itself; and, for an experiment of the reproduction report,
- `report.py`: `build` (the report section and its summary entry, checks included) and `recheck`
  (an entry judged again by today's checks), what ssmgate.reproduce calls;
- `claims.py`: `BARS` (its checks' thresholds, each with its source), `CLAIMS` (its rows of the claim
  table, naming its checks) and `UNCLAIMED_CHECKS` (checks of this project's budgets, no paper's claim).
No program imports another: what two share lives in a lower layer (ssmgate.train, ssmgate.cli,
ssmgate.report, ...); tests/test_layers.py holds that.
"""
from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType


@dataclasses.dataclass(frozen=True)
class Program:
    name: str                    # the value of --program
    package: str                 # its package, e.g. ssmgate.programs.p1_kv
    paper: str | None = None     # an experiment of the reproduction: its folder experiments/<paper>/
    runs: tuple[str, ...] = ()   # its flag files there, <run>.flags at each scale

    def module(self, leaf: str) -> ModuleType:
        return importlib.import_module(f"{self.package}.{leaf}")

    @property
    def flags(self) -> ModuleType:
        return self.module("flags")

    @property
    def report(self) -> ModuleType:
        return self.module("report")

    @property
    def claims(self) -> ModuleType:
        return self.module("claims")


PROGRAMS = {p.name: p for p in (
    Program("p1_fig1", "ssmgate.programs.p1_fig1", "p1", ("fig1a", "fig1b", "fig1c", "fig1d")),
    Program("p1_kv", "ssmgate.programs.p1_kv", "p1", ("kv_best_first", "kv_best_last", "kv_transformer")),
    Program("p1_horn", "ssmgate.programs.p1_horn", "p1", ("horn_retrieval", "horn_lengen", "horn_transformer")),
    Program("p1_tools", "ssmgate.programs.p1_tools", "p1",
            ("tools_pretrain", "tools_sft", "tools_transformer_pretrain", "tools_transformer")),
    Program("p2_theory", "ssmgate.programs.p2_theory", "p2", ("theory",)),
    Program("p2_state_tracking", "ssmgate.programs.p2_state_tracking", "p2",
            ("state_tracking_parity", "state_tracking_mod3", "state_tracking_arith")),
    Program("p2_lm", "ssmgate.programs.p2_lm", "p2", ("lm_rope05", "lm_rope0", "lm_rope05_seed1", "lm_rope0_seed1",
                                                          "lm_mimo")),
    Program("train", "ssmgate.programs.train_lm"),
)}

# The experiments of the reproduction report, in its order.
EXPERIMENTS = {name: p for name, p in PROGRAMS.items() if p.paper is not None}


def claim_rows() -> tuple:
    """Every experiment's rows of the claim table, in the report's order."""
    return tuple(c for p in EXPERIMENTS.values() for c in p.claims.CLAIMS)


def check_bars():
    """Every experiment's thresholds as one table (docs/reproduction.md#thresholds), in the report's order."""
    from ssmgate.report import check_bars as bars
    return bars.merged((name, p.claims.BARS) for name, p in EXPERIMENTS.items())


def define_all_flags() -> None:
    """Imports every program's flags module: absl parses a flag only once it is defined."""
    for p in PROGRAMS.values():
        _ = p.flags


def flag_names(name: str) -> dict[str, list[str]]:
    """{group: flag names} that --program=name reads: 'own' (its flags module's), then its groups; old
    names of renamed flags aside (old_flag_names)."""
    from ssmgate.cli import dataclass_flags, training_flags
    module = PROGRAMS[name].flags
    own = sorted(n for n in _module_flags(module) if n not in dataclass_flags.RENAMED)
    return {"own": own, **{g: list(training_flags.GROUPS[g]) for g in module.GROUPS_READ}}


def old_flag_names(name: str) -> dict[str, str]:
    """{old name: name now} of --program=name's renamed flags, still read."""
    from ssmgate.cli import dataclass_flags
    return {n: dataclass_flags.RENAMED[n] for n in _module_flags(PROGRAMS[name].flags) if n in dataclass_flags.RENAMED}


def _module_flags(module) -> list[str]:
    from absl import flags
    return sorted(f.name for f in flags.FLAGS.get_flags_for_module(module.__name__))
