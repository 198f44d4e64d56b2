"""Long-context evaluation of a language model (protocol §7.2 PG-19 windows, 7.3 position buckets).

A window is run from a zero state in pieces of `piece_len` tokens that carry the model's cache
(the SSM state; a Transformer's key-value cache sized for the padded window), so a 64K-token window
never holds more than one piece's activations and logits. All pieces of a row have one length
(a ragged end is padded with targets of weight 0), so a model compiles one piece program for every
window longer than a piece. Windows of one size all have the same length, so they are batched
(`batch` windows at a time, the last group padded with weight 0). When the parameters live on
several devices of one process (a run trained over a mesh, e.g. `--cpu_devices=2`), each device
scores its share of the rows: left unsharded, the rows would be scored again on every device.
Works for any `ssmgate.models.lm.LanguageModel`, including `interventions.intervened_model`'s.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ssmgate.tasks import long_context as lc


@functools.lru_cache(maxsize=16)  # one compiled piece function per model (modules hash by config)
def piece_fn(model):
    """The jitted forward of one piece: (params, inputs, targets, weights, cache) -> (weighted -log p,
    weighted top-1 correct, cache); also what `compile_forward` compiles for a TPU slice."""
    @jax.jit
    def run(params, inputs_bt, targets_bt, weights_bt, cache):
        logits_btv, cache = model.apply({"params": params}, inputs_bt, cache)
        logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
        nll_bt = -jnp.take_along_axis(logp, targets_bt[..., None], axis=-1)[..., 0]
        correct_bt = (jnp.argmax(logits_btv, axis=-1) == targets_bt).astype(jnp.float32)
        return nll_bt * weights_bt, correct_bt * weights_bt, cache
    return run


def _rows_over_devices(params, rows: int):
    """The sharding that splits `rows` over the mesh `params` live on, or None (one device, several
    processes, or a row count the devices do not divide: the rows then go where jit puts them)."""
    sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if not isinstance(sharding, NamedSharding) or jax.process_count() > 1:
        return None
    mesh = sharding.mesh
    if mesh.size == 1 or rows % mesh.size:
        return None
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names))


def sequence_scores(model, params, tokens_bl: np.ndarray, weights_bl: np.ndarray,
                    piece_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(-log p, top-1 correct) of every target of rows `tokens_bl` (b, L) from a zero state, each
    times `weights_bl` (b, L - 1; weight of target j = token j + 1), run in pieces carrying the
    cache: two (b, L - 1) arrays."""
    if piece_len < 1:
        raise ValueError(f"sequence_scores: piece_len={piece_len}; expected >= 1")
    tokens_bl = np.asarray(tokens_bl, np.int32)
    b, length = tokens_bl.shape
    n_targets = length - 1
    # Every piece has one length (a compiled program per model, not one more for a ragged last piece):
    # a single piece is rounded up to a power of two (windows of 2^k tokens have 2^k - 1 targets), longer
    # rows to a multiple of piece_len. The padded targets weigh 0 and come after every real one (causal).
    piece = min(piece_len, 1 << max(n_targets - 1, 0).bit_length())
    padded = -(-n_targets // piece) * piece
    tokens_bl = np.pad(tokens_bl, ((0, 0), (0, padded - n_targets)))
    weights_bl = np.pad(np.asarray(weights_bl, np.float32), ((0, 0), (0, padded - n_targets)))
    run = piece_fn(model)
    rows = _rows_over_devices(params, b)
    if rows is not None:
        tokens_bl, weights_bl = jax.device_put(tokens_bl, rows), jax.device_put(weights_bl, rows)
    cache = model.init_cache(b, padded)
    nlls, corrects = [], []
    for lo in range(0, padded, piece):
        hi = lo + piece
        nll, correct, cache = run(params, tokens_bl[:, lo:hi], tokens_bl[:, lo + 1:hi + 1], weights_bl[:, lo:hi],
                                  cache)
        nlls.append(np.asarray(nll, np.float64))
        corrects.append(np.asarray(correct, np.float64))
    return np.concatenate(nlls, axis=1)[:, :n_targets], np.concatenate(corrects, axis=1)[:, :n_targets]


def sequence_nll(model, params, tokens_bl: np.ndarray, weights_bl: np.ndarray, piece_len: int) -> np.ndarray:
    """The -log p part of `sequence_scores`: (b, L - 1)."""
    return sequence_scores(model, params, tokens_bl, weights_bl, piece_len)[0]


def windowed_ppl(model, params, books: Sequence[np.ndarray], size: int, *, score_last: int = lc.SCORE_LAST,
                 batch: int = 8, piece_len: int = 1024, anchor: int | None = None) -> dict:
    """protocol §7.2 at window size C = `size`: {"ppl", "accuracy" (top-1 over the scored tokens),
    "nll_sum", "n_scored", "n_windows", "window_nll": [summed nll of each window in
    lc.pg19_windows order]}. With `anchor` the windows end where those of size `anchor` end
    (lc.aligned_windows: every C scores the same tokens)."""
    lengths = [len(bk) for bk in books]
    windows = (lc.pg19_windows(lengths, size, score_last) if anchor is None
               else lc.aligned_windows(lengths, size, anchor, score_last))
    weights = np.zeros(size - 1, np.float32)
    weights[size - 1 - score_last:] = 1.0  # targets j = C-1-score_last .. C-2 are tokens C-score_last .. C-1
    per_window, n_correct = [], 0.0
    for g in range(0, len(windows), batch):
        group = windows[g:g + batch]
        rows = [np.asarray(books[w.book][w.start:w.start + size]) for w in group]
        real = len(rows)
        rows += [rows[0]] * (batch - real)   # static batch shape; padded rows are dropped below
        nll, correct = sequence_scores(model, params, np.stack(rows), np.broadcast_to(weights, (batch, size - 1)),
                                       piece_len)
        per_window += [float(v) for v in nll[:real].sum(axis=1)]
        n_correct += float(correct[:real].sum())
    total, n_scored = float(np.sum(per_window)), score_last * len(windows)
    return {"ppl": lc.pooled_ppl(total, n_scored) if windows else None,
            "accuracy": n_correct / n_scored if windows else None, "nll_sum": total, "n_scored": n_scored,
            "n_windows": len(windows), "window_nll": per_window}


def bucket_ppl(model, params, rows_bl: np.ndarray, buckets: Sequence[tuple], *, batch: int = 8,
               piece_len: int = 1024) -> dict:
    """protocol §7.3: rows (n, row_len + 1) each run from a zero state; the pooled PPL of the targets
    whose position (0-based, in the row's targets) lies in each bucket [lo, hi): {(lo, hi): ppl}."""
    rows_bl = np.asarray(rows_bl)
    n, length = rows_bl.shape
    for lo, hi in buckets:
        if not 0 <= lo < hi <= length - 1:
            raise ValueError(f"bucket_ppl: bucket [{lo}, {hi}) outside the {length - 1} target positions")
    sums = np.zeros(length - 1)
    for g in range(0, n, batch):
        part = rows_bl[g:g + batch]
        sums += sequence_nll(model, params, part, np.ones((len(part), length - 1), np.float32), piece_len).sum(0)
    return {(lo, hi): lc.pooled_ppl(sums[lo:hi].sum(), n * (hi - lo)) for lo, hi in buckets}
