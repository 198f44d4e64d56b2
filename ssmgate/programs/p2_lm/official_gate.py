"""The native-PPL gate of an official-checkpoint run of `p2_lm` (docs/interventions.md).

Interventions on a converted checkpoint mean something only if the converted model is the
published one. Before anything else is measured, `NativePPLGate.check` measures the native
windowed PPL at the window size the paper reports it for (the PG-19 protocol of
`lm_eval.windowed_ppl`, as `long_eval.evaluate` measures it, stored as the same cell so the
evaluation reuses it) and stops the run unless it is within `tolerance` (relative) of the
published value. A wrong decay activation, a mismatched tokenizer or the wrong books all fail it.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from ssmgate.config_error import ConfigError
from ssmgate.interventions.forward import Intervention
from ssmgate.models.config import ModelCfg
from ssmgate.programs.p2_lm import long_eval
from ssmgate.train.cell_store import CellStore
from ssmgate.train.run_dir import RunDir, say

RESULT_FILE = "native_ppl_gate.json"


class GateError(ConfigError):
    """The converted checkpoint's native PPL is not the published one: the run stops."""


@dataclasses.dataclass(frozen=True)
class NativePPLGate:
    published: float        # the paper's native PPL of this checkpoint at `window`
    window: int             # the window size C of that PPL
    tolerance: float = 0.02  # allowed |measured / published - 1|

    def validate(self, ecfg: long_eval.LongEvalCfg) -> "NativePPLGate":
        if not (math.isfinite(self.published) and self.published > 1.0):
            raise ConfigError(f"--lm_official_ppl={self.published}: expected the published native PPL (> 1)")
        if self.window <= ecfg.score_last:
            raise ConfigError(f"--lm_official_ppl_window={self.window}: expected a window size > --lm_score_last="
                              f"{ecfg.score_last}")
        if not 0.0 < self.tolerance < 1.0:
            raise ConfigError(f"--lm_official_ppl_tolerance={self.tolerance}: expected a fraction in (0, 1)")
        return self

    def check(self, cfg: ModelCfg, params, books: Sequence[np.ndarray], ecfg: long_eval.LongEvalCfg,
              rd: RunDir, digest: str, eos_id: int | None = None) -> dict:
        """Measures (or reads back) the native PPL at `window`; writes native_ppl_gate.json; raises
        GateError when it is off by more than `tolerance`."""
        store = CellStore(rd.file(long_eval.CELLS_FILE), digest)
        wb = long_eval.window_books(books, ecfg, eos_id)
        # long_eval.evaluate's key and measurement of the native cell, so it is measured once
        cell = store.get(long_eval.cell_key("native", None, None, self.window, wb), lambda: long_eval._window_cell(
            cfg, params, wb, self.window, ecfg, Intervention("native", seed=ecfg.shuffle_seed)))
        ppl = cell["ppl"]
        off = None if ppl is None else ppl / self.published - 1.0
        passed = off is not None and abs(off) <= self.tolerance
        result = {"window": self.window, "measured_ppl": ppl, "published_ppl": self.published,
                  "relative_difference": off, "tolerance": self.tolerance, "passed": passed,
                  "n_windows": cell["n_windows"], "a_activation": cfg.a_activation}
        rd.write_json(RESULT_FILE, result)
        if not passed:
            measured = "no window (every book is shorter)" if ppl is None else f"{ppl:.4g} ({100 * off:+.2f}%)"
            raise GateError(
                f"native-PPL gate failed: at window {self.window} the converted checkpoint measures {measured} "
                f"against the published {self.published:.4g} (allowed ±{100 * self.tolerance:g}%); the "
                f"interventions were not run. Expected the published model: check the decay activation "
                f"(--a_activation={cfg.a_activation}; mamba_ssm uses heavy since c69aaab, 2026-06-02, "
                f"softplus before), the tokenizer and the evaluation books ({rd.file(RESULT_FILE)})")
        say(f"[p2_lm] native-PPL gate passed: {ppl:.4g} at window {self.window}, published {self.published:.4g} "
            f"({100 * off:+.2f}%)")
        return result
