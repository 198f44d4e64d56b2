"""The long-context evaluation of a trained (or converted) language model: protocol §7.2 windows,
7.3 position buckets, 8.1 layer-window heat map, 8.2 intervention table, 8.3 state diagnostics, 8.4 write/read
rotation removal, 8.5 phase trajectories, and the memory of one long window.

`evaluate` runs every part the `LongEvalCfg` asks for and returns one JSON-able dict (the
`long_eval` part of p2_lm's summary). Each measured cell (intervention, layer window, last k,
window size) is appended to `<run_dir>/long_eval_cells.jsonl` as soon as it is measured, keyed with
the weights' digest, so a killed evaluation resumes where it stopped and never measures a cell twice.
Interventions act on Mamba-3 layers only; on another block only the native numbers are measured.

The windowed cells (native, interventions, B/C removal, layer windows, and the curve along training)
run on the eval books with the windows of protocol §7.2, or, with `pseudo_books` > 0, on pseudo-books
(`long_context.pseudo_books`: the books joined with EOS and cut into pieces of the largest window
plus 10 scored tails, every C's windows ending at the same positions, so every C scores the same
tokens). Each windowed number comes with a 95% bootstrap interval over its windows
(`long_context.bootstrap_ppl` / `bootstrap_ratio`, a fixed seed; ratios paired on the same windows).
The state diagnostics, phase trajectories and position buckets always read the real books.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from ssmgate.interventions import diagnostics, phase_trajectories
from ssmgate.interventions.forward import Intervention, intervened_model
from ssmgate.models.config import ModelCfg
from ssmgate.tasks import long_context as lc
from ssmgate.train import lm_eval
from ssmgate.train import lm_memory
from ssmgate.train.cell_store import CellStore
from ssmgate.train.run_dir import RunDir, say

PHASE_KINDS = ("phase_removal", "phase_reversal", "phase_shuffle", "decay_permutation")  # protocol §8.2
BC_KINDS = ("remove_B", "remove_C", "remove_both")                                       # protocol §8.4
CELLS_FILE = "long_eval_cells.jsonl"


@dataclasses.dataclass(frozen=True)
class LongEvalCfg:
    windows: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)   # C: window sizes of protocol §7.2
    score_last: int = lc.SCORE_LAST
    piece_len: int = 1024          # tokens per forward piece (the cache carries the state between pieces)
    batch: int = 8                 # windows per forward
    interventions: tuple[str, ...] = ()  # of PHASE_KINDS, each at every C
    bc_window: Optional[int] = None       # C of the remove_B / remove_C / remove_both table; None = skip
    heatmap_window: Optional[int] = None  # C of the layer-window phase-removal heat map; None = skip
    diag_len: int = 0              # state diagnostics over the first diag_len tokens of books this long; 0 = skip
    diag_skip: int = 0             # positions excluded from the diagnostics' time means (protocol §8.3: 2000)
    diag_short: int = 0            # the shorter diagnostics span [diag_skip, diag_short) (protocol §8.3: 16000)
    diag_books: int = 4            # at most this many books for the diagnostics
    trajectory_len: int = 0        # phase-trajectory figure over this many tokens of the longest book; 0 = skip
    memory_windows: tuple[int, ...] = ()  # window lengths whose peak memory is measured in a fresh process
    bucket_row_len: int = 0        # protocol §7.3: the books joined with EOS, cut into rows this long; 0 = skip
    bucket_width: int = 1024       # ... and the PPL per bucket of this many positions
    shuffle_seed: int = 0
    pseudo_books: int = 0          # > 0: windows on at most this many pseudo-books (lc.pseudo_books); 0 = the books
    curve_windows: tuple[int, ...] = ()  # window sizes measured along training (P2 Figs 8-9); () = none
    curve_every: int = 0           # ... every this many steps (a multiple of eval_every; 0 = at every evaluation)

    def validate(self) -> "LongEvalCfg":
        if not self.windows or any(c <= self.score_last for c in self.windows):
            raise ValueError(f"windows={self.windows}: expected sizes > score_last={self.score_last}")
        for name in ("score_last", "piece_len", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
        unknown = [k for k in self.interventions if k not in PHASE_KINDS]
        if unknown:
            raise ValueError(f"interventions={','.join(self.interventions)}: {unknown[0]!r} is not one of "
                             f"{', '.join(PHASE_KINDS)}")
        for name in ("bc_window", "heatmap_window"):
            c = getattr(self, name)
            if c is not None and c <= self.score_last:
                raise ValueError(f"{name}={c}: expected a window size > score_last={self.score_last}")
        if self.diag_len and not 0 <= self.diag_skip < self.diag_short <= self.diag_len:
            raise ValueError(f"diag_skip={self.diag_skip}, diag_short={self.diag_short}, diag_len={self.diag_len}: "
                             "expected 0 <= diag_skip < diag_short <= diag_len")
        if self.bucket_row_len and (self.bucket_width < 1 or self.bucket_row_len % self.bucket_width):
            raise ValueError(f"bucket_row_len={self.bucket_row_len}: expected a multiple of bucket_width="
                             f"{self.bucket_width} >= 1")
        if any(m < 2 for m in self.memory_windows):
            raise ValueError(f"memory_windows={self.memory_windows}: expected lengths >= 2")
        if self.pseudo_books < 0:
            raise ValueError(f"pseudo_books={self.pseudo_books}: expected >= 0 (0 = the books themselves)")
        if any(c <= self.score_last for c in self.curve_windows):
            raise ValueError(f"curve_windows={','.join(map(str, self.curve_windows))}: expected sizes > "
                             f"score_last={self.score_last}")
        if self.curve_every < 0:
            raise ValueError(f"curve_every={self.curve_every}: expected >= 0 (0 = at every evaluation)")
        if self.pseudo_books:
            for name, sizes in (("bc_window", (self.bc_window or 0,)), ("heatmap_window", (self.heatmap_window or 0,)),
                                ("curve_windows", self.curve_windows)):
                if max(sizes, default=0) > self.anchor():
                    raise ValueError(f"{name}={','.join(map(str, sizes))}: with pseudo_books every window size must "
                                     f"be <= the largest of lm_windows ({self.anchor()}), whose windows' ends all "
                                     "sizes share")
        return self

    def anchor(self) -> int:
        """The largest of `windows`: on pseudo-books every window ends where the windows of this size end
        (so two models with the same `windows` are evaluated on the same windows)."""
        return max(self.windows)


@dataclasses.dataclass(frozen=True)
class WindowBooks:
    """What the windowed cells run on: `books` with protocol §7.2 windows (anchor None) or pseudo-books
    whose windows of every size end where those of size `anchor` do."""
    books: Sequence[np.ndarray]
    anchor: Optional[int] = None

    @property
    def tag(self) -> str:
        """The cell-key suffix: '' for the books (keys as before), else the pseudo-book layout."""
        return "" if self.anchor is None else f"|pseudo{len(self.books)}x{len(self.books[0]) if self.books else 0}" \
                                               f"@{self.anchor}"

    def describe(self) -> dict:
        if self.anchor is None:
            return {"layout": "books", "books": len(self.books)}
        return {"layout": "pseudo_books", "pseudo_books": len(self.books),
                "pseudo_book_tokens": int(len(self.books[0])) if self.books else 0, "anchor": self.anchor}


def window_books(books: Sequence[np.ndarray], ecfg: LongEvalCfg, eos_id: int | None) -> WindowBooks:
    """The books of the windowed cells: the eval books, or (ecfg.pseudo_books > 0) pseudo-books of them."""
    if not ecfg.pseudo_books:
        return WindowBooks(list(books))
    if eos_id is None:
        raise ValueError("pseudo-books: eos_id is needed to join the books")
    anchor = ecfg.anchor()
    made = lc.pseudo_books(books, eos_id, anchor, ecfg.score_last, max_books=ecfg.pseudo_books)
    if not made:
        raise ValueError(f"pseudo-books: the {sum(map(len, books)):,} eval tokens hold no pseudo-book of "
                         f"{lc.pseudo_book_len(anchor, ecfg.score_last):,} tokens (the largest window {anchor} plus "
                         f"10 x score_last); use shorter windows or more eval text")
    return WindowBooks(made, anchor)


def cell_key(kind: str, layers, last_k, size: int, wb: WindowBooks) -> str:
    return f"{kind}|{layers}|{last_k}|{size}{wb.tag}"


def touches_phase(cfg: ModelCfg) -> bool:
    """Whether the model has phases to intervene on (Mamba-3 with input-dependent rotation)."""
    return cfg.block == "mamba3" and cfg.transition == "native" and cfg.n_rot_pairs > 0


def _window_cell(cfg: ModelCfg, params, wb: WindowBooks, size: int, ecfg: LongEvalCfg,
                 intervention: Intervention) -> dict:
    model = intervened_model(cfg, intervention)
    out = lm_eval.windowed_ppl(model, params, wb.books, size, score_last=ecfg.score_last, batch=ecfg.batch,
                               piece_len=ecfg.piece_len, anchor=wb.anchor)
    return {k: out[k] for k in ("ppl", "accuracy", "n_windows", "n_scored", "window_nll")}


def forward_models(cfg: ModelCfg, ecfg: LongEvalCfg) -> dict:
    """{label: model} of every window forward `evaluate` runs: the native model, each of
    `ecfg.interventions` and, with a B/C window, each removal of the last scored positions (the
    layer-window map and the diagnostics reuse these forwards on fewer layers or shorter text)."""
    ivs = {"native": Intervention()}
    if touches_phase(cfg):
        ivs |= {k: Intervention(k, seed=ecfg.shuffle_seed) for k in ecfg.interventions}
        if ecfg.bc_window is not None:
            ivs |= {k: Intervention(k, last_k=ecfg.score_last) for k in BC_KINDS}
    return {k: intervened_model(cfg, iv) for k, iv in ivs.items()}


def window_ppl(cfg: ModelCfg, params, wb: WindowBooks, sizes: Sequence[int], ecfg: LongEvalCfg) -> dict:
    """{str(C): native windowed PPL} (the curve along training measures this at each of its steps)."""
    return {str(c): _window_cell(cfg, params, wb, c, ecfg, Intervention())["ppl"] for c in sizes}


def _ppl_ci(cell: dict, score_last: int):
    """The bootstrap interval of a cell's PPL (None for a cell stored before intervals were kept)."""
    return lc.bootstrap_ppl(cell["window_nll"], score_last) if "window_nll" in cell else None


def _ratio_ci(cell: dict, base: dict, score_last: int):
    if "window_nll" not in cell or "window_nll" not in base:
        return None
    return lc.bootstrap_ratio(cell["window_nll"], base["window_nll"], score_last)


def _ratio(value, native):
    return None if value is None or native is None else value / native


def evaluate(cfg: ModelCfg, params, books: Sequence[np.ndarray], ecfg: LongEvalCfg, rd: RunDir,
             digest: str, eos_id: int | None = None) -> dict:
    """Every part `ecfg` asks for on the eval `books` (token arrays; `eos_id` joins them for the
    position buckets); see the module docstring."""
    ecfg = ecfg.validate()
    store = CellStore(rd.file(CELLS_FILE), digest)
    phases = touches_phase(cfg)
    wb = window_books(books, ecfg, eos_id)
    sl = ecfg.score_last

    def cell(kind: str, size: int, layers=None, last_k=None) -> dict:
        iv = Intervention(kind, layers=layers, last_k=last_k, seed=ecfg.shuffle_seed)

        def measure():
            say(f"[p2_lm] window {size}: {kind}" + (f" layers {layers}" if layers else "")
                + (f" last {last_k}" if last_k else ""))
            return _window_cell(cfg, params, wb, size, ecfg, iv)
        return store.get(cell_key(kind, layers, last_k, size, wb), measure)

    out: dict = {"books": len(books), "book_tokens": [int(len(b)) for b in books], "score_last": sl,
                 "windows": wb.describe()}
    native = {c: cell("native", c) for c in ecfg.windows}
    out["window_ppl"] = {str(c): native[c]["ppl"] for c in ecfg.windows}
    out["window_ppl_ci"] = {str(c): _ppl_ci(native[c], sl) for c in ecfg.windows}
    out["window_accuracy"] = {str(c): native[c]["accuracy"] for c in ecfg.windows}
    out["n_windows"] = {str(c): native[c]["n_windows"] for c in ecfg.windows}
    if ecfg.bucket_row_len:
        out["bucket_ppl"] = store.get(f"buckets|{ecfg.bucket_row_len}|{ecfg.bucket_width}",
                                      lambda: _buckets(cfg, params, books, ecfg, eos_id))
    if not phases:
        out["interventions_skipped"] = (f"block {cfg.block!r}, transition {cfg.transition!r}, "
                                        f"{cfg.n_rot_pairs} rotated pairs: no phases to intervene on")
        return out | _memory(cfg, ecfg)

    if ecfg.interventions:
        cells = {k: {c: cell(k, c) for c in ecfg.windows} for k in ecfg.interventions}
        out["intervention_ppl"] = {k: {str(c): v["ppl"] for c, v in row.items()} for k, row in cells.items()}
        out["intervention_ratio"] = {k: {str(c): _ratio(v["ppl"], native[c]["ppl"]) for c, v in row.items()}
                                     for k, row in cells.items()}
        out["intervention_ratio_ci"] = {k: {str(c): _ratio_ci(v, native[c], sl) for c, v in row.items()}
                                        for k, row in cells.items()}
    if ecfg.bc_window is not None:
        c = ecfg.bc_window
        base = native.get(c) or cell("native", c)
        bc = {k: cell(k, c, last_k=sl) for k in BC_KINDS}
        out["bc_window"] = c
        out["bc_removal_ppl"] = {"native": base["ppl"], **{k: v["ppl"] for k, v in bc.items()}}
        out["bc_removal_ppl_ci"] = {"native": _ppl_ci(base, sl), **{k: _ppl_ci(v, sl) for k, v in bc.items()}}
        out["bc_removal_ratio"] = {k: _ratio(v["ppl"], base["ppl"]) for k, v in bc.items()}
        out["bc_removal_ratio_ci"] = {k: _ratio_ci(v, base, sl) for k, v in bc.items()}
    if ecfg.heatmap_window is not None:
        out["layer_heatmap"] = _heatmap(cfg, ecfg, cell)
    if ecfg.diag_len:
        out["state_stats"] = _diagnostics(cfg, params, books, ecfg, store)
    if ecfg.trajectory_len:
        out["phase_trajectories"] = _trajectories(cfg, params, books, ecfg, rd)
    return out | _memory(cfg, ecfg)


def _buckets(cfg: ModelCfg, params, books, ecfg: LongEvalCfg, eos_id: int | None) -> dict:
    """protocol §7.3: the books joined with EOS, cut into rows of bucket_row_len tokens (state reset per
    row); the pooled PPL of the targets in each position bucket: {"lo-hi": ppl, "rows": n}."""
    if eos_id is None:
        raise ValueError("position buckets: eos_id is needed to join the books")
    stream = np.concatenate([np.append(np.asarray(b, np.int32), np.int32(eos_id)) for b in books])
    n = (len(stream) - 1) // ecfg.bucket_row_len
    if n < 1:
        return {"rows": 0, "skipped": f"{len(stream)} eval tokens hold no row of {ecfg.bucket_row_len + 1}"}
    say(f"[p2_lm] position buckets: {n} rows of {ecfg.bucket_row_len} tokens")
    rows = np.stack([stream[i * ecfg.bucket_row_len:(i + 1) * ecfg.bucket_row_len + 1] for i in range(n)])
    buckets = lc.position_buckets(ecfg.bucket_row_len, ecfg.bucket_width)
    ppl = lm_eval.bucket_ppl(intervened_model(cfg, Intervention()), params, rows, buckets, batch=ecfg.batch,
                             piece_len=ecfg.piece_len)
    return {"rows": n, **{f"{lo}-{hi}": v for (lo, hi), v in ppl.items()}}


def _heatmap(cfg: ModelCfg, ecfg: LongEvalCfg, cell) -> dict:
    """protocol §8.1 at window C: phase removal in every contiguous window of layers [start, start + width);
    the change of next-token accuracy (percentage points) and the PPL ratio against native."""
    c, n = ecfg.heatmap_window, cfg.n_layers
    base = cell("native", c)
    rows = []
    for width in range(1, n + 1):
        for start in range(0, n - width + 1):
            got = cell("phase_removal", c, layers=(start, start + width))
            rows.append({"start": start, "width": width,
                         "accuracy_change_pp": 100.0 * (got["accuracy"] - base["accuracy"]),
                         "ppl_ratio": _ratio(got["ppl"], base["ppl"])})
    return {"window": c, "native_accuracy": base["accuracy"], "native_ppl": base["ppl"], "cells": rows}


def _diagnostics(cfg: ModelCfg, params, books, ecfg: LongEvalCfg, store: CellStore) -> dict:
    """protocol §8.3 on the books of at least diag_len tokens: one run over their first diag_len tokens,
    time means over [diag_skip, diag_short) ("short") and [diag_skip, diag_len) ("long")."""
    chosen = [i for i, b in enumerate(books) if len(b) >= ecfg.diag_len][:ecfg.diag_books]
    spans = {"short": (ecfg.diag_skip, ecfg.diag_short), "long": (ecfg.diag_skip, ecfg.diag_len)}
    if not chosen:
        return {"skipped": f"no eval book has >= {ecfg.diag_len} tokens"}
    result = {"books": len(chosen), "spans": {k: list(v) for k, v in spans.items()}}
    for label, kind in (("native", "native"), ("removed", "phase_removal")):
        def measure(kind=kind):
            say(f"[p2_lm] state diagnostics ({kind}) on {len(chosen)} books of >= {ecfg.diag_len} tokens")
            per_book = [diagnostics.book_statistics(cfg, params, books[i][:ecfg.diag_len], list(spans.values()),
                                                    Intervention(kind)) for i in chosen]
            return {name: diagnostics.mean_over_books([diagnostics.summarise(b[span]) for b in per_book])
                    for name, span in spans.items()}
        result[label] = store.get(f"diagnostics|{kind}|{ecfg.diag_len}|{ecfg.diag_skip}|{ecfg.diag_short}|"
                                  f"{chosen}", measure)
    return result


def _trajectories(cfg: ModelCfg, params, books, ecfg: LongEvalCfg, rd: RunDir) -> dict:
    """protocol §8.5 (Fig 4) on the first trajectory_len tokens of the longest eval book."""
    longest = int(np.argmax([len(b) for b in books]))
    tokens = books[longest][:ecfg.trajectory_len]
    increments = phase_trajectories.phase_increments(intervened_model(cfg, Intervention()), params, tokens)
    travel = phase_trajectories.phase_travel(increments)
    try:
        channels = phase_trajectories.pick_channels(travel)
    except ValueError as e:  # no channel turns once over the span: nothing to draw, said in the summary
        return {"book": longest, "tokens": int(len(tokens)), "skipped": str(e)}
    phase_trajectories.plot(increments, channels, rd.file("phase_trajectories.png"),
                            title=f"phase trajectories, {len(tokens)} tokens of eval book {longest}")
    return {"book": longest, "tokens": int(len(tokens)),
            "channels": [dict(c._asdict()) for c in channels],
            "channels_with_full_turn": int((travel >= phase_trajectories.FULL_TURN).sum()),
            **phase_trajectories.class_numbers(channels, len(tokens))}


def _memory(cfg: ModelCfg, ecfg: LongEvalCfg) -> dict:
    if not ecfg.memory_windows:
        return {}
    say(f"[p2_lm] peak memory of one window of {', '.join(map(str, ecfg.memory_windows))} tokens (fresh processes)")
    return {"memory": lm_memory.measure(cfg, ecfg.memory_windows, ecfg.piece_len)}
