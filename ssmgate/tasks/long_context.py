"""The long-context evaluation protocols of protocol §7.2 (PG-19 windows) and 7.3 (position buckets):
which windows, which positions are scored. Pure numpy; running a model over them is
`ssmgate.train.lm_eval`.

PG-19 windows (7.2): for a book of L tokens and a window size C, windows [s, s + C) start at
s = 0, sigma, 2 sigma, ... while s + C <= L, with sigma = max(10, floor((L - C) / 10)), so a book
has at most 11 windows and none when L <= C. The state is reset at each window start and only the
last `score_last` (100) tokens of a window are scored; the perplexity pools every scored token of
every window and book. The same C gives the same windows across models and interventions.

Pseudo-books (ours, for corpora whose books are short; protocol §7.2 keeps the real books): the
books joined with EOS into one stream and cut into consecutive pieces of `anchor + 10 * score_last`
tokens, `anchor` being the largest window size evaluated. On such a piece the §7.2 windows of size
`anchor` start at 0, score_last, ..., 10 * score_last (sigma = score_last: 11 windows whose scored
tails tile the piece's last 11 * score_last tokens). Every smaller C uses windows that END where
those do (`aligned_windows`): every C scores the same tokens of the same text and differs only in
how much context precedes them, so numbers at different C compare like with like.

Bootstrap intervals (ours): windows resampled with replacement (BOOTSTRAP_SAMPLES draws of a fixed
seed); every window scores the same number of tokens, so the pooled PPL of a draw is
exp(mean window nll / score_last), and a ratio of two cells on the same windows uses the same draws
for both (a paired bootstrap). The interval is the 2.5th and 97.5th percentile of the draws.

Position buckets (7.3): documents joined with EOS and cut into rows of `row_len` (4096) tokens, the
state reset at each row; the perplexity per bucket of target positions ([0, 1024), [1024, 2048),
...).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

PAPER_WINDOWS = (1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000)  # "2K" = 2000 tokens
SCORE_LAST = 100
PSEUDO_BOOK_WINDOWS = 11        # windows per pseudo-book: the §7.2 maximum, sigma = score_last
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 0
BOOTSTRAP_LEVEL = 0.95


class Window(NamedTuple):
    book: int     # index into the list of books
    start: int    # first token of the window; the window is tokens [start, start + size)
    size: int     # C


def window_stride(book_len: int, size: int) -> int:
    """sigma = max(10, floor((L - C) / 10))."""
    return max(10, (book_len - size) // 10)


def window_starts(book_len: int, size: int) -> list[int]:
    """Window starts of one book: 0, sigma, 2 sigma, ... with s + C <= L; [] when L <= C."""
    if size < 1:
        raise ValueError(f"window_starts: window size {size}; expected >= 1 token")
    if book_len <= size:
        return []
    sigma = window_stride(book_len, size)
    return list(range(0, book_len - size + 1, sigma))


def pg19_windows(book_lengths: Sequence[int], size: int, score_last: int = SCORE_LAST) -> list[Window]:
    """Every window of every book at window size C, in (book, start) order."""
    if not 1 <= score_last < size:
        raise ValueError(f"pg19_windows: score_last={score_last} with window size {size}; expected "
                         f"1 <= score_last < size (a scored token needs a predecessor in its window)")
    return [Window(i, s, size) for i, n in enumerate(book_lengths) for s in window_starts(int(n), size)]


def pseudo_book_len(anchor: int, score_last: int = SCORE_LAST) -> int:
    """Tokens of one pseudo-book: `anchor` (the largest window) plus 10 strides of `score_last`."""
    return anchor + (PSEUDO_BOOK_WINDOWS - 1) * score_last


def pseudo_books(books: Sequence[np.ndarray], eos_id: int, anchor: int, score_last: int = SCORE_LAST,
                 max_books: int | None = None) -> list[np.ndarray]:
    """The books joined with `eos_id` after each and cut into consecutive pseudo-books of
    pseudo_book_len(anchor, score_last) tokens (the ragged rest dropped), at most `max_books` of them."""
    length = pseudo_book_len(anchor, score_last)
    stream = np.concatenate([np.append(np.asarray(b, np.int32), np.int32(eos_id)) for b in books]) if books \
        else np.zeros(0, np.int32)
    n = len(stream) // length if max_books is None else min(len(stream) // length, max_books)
    return [stream[i * length:(i + 1) * length] for i in range(n)]


def aligned_windows(book_lengths: Sequence[int], size: int, anchor: int, score_last: int = SCORE_LAST) -> list[Window]:
    """Windows of size C = `size` ending where the §7.2 windows of size `anchor` end (so every C <= anchor
    scores the same tokens), in (book, start) order. At C = anchor these are pg19_windows'."""
    if size > anchor:
        raise ValueError(f"aligned_windows: window size {size} > anchor {anchor}; expected size <= anchor")
    if not 1 <= score_last < size:
        raise ValueError(f"aligned_windows: score_last={score_last} with window size {size}; expected "
                         f"1 <= score_last < size")
    return [Window(w.book, w.start + anchor - size, size) for w in pg19_windows(book_lengths, anchor, score_last)]


def _draws(n: int, samples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


def _interval(values: np.ndarray, level: float) -> list[float]:
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def bootstrap_ppl(window_nll: Sequence[float], score_last: int, *, samples: int = BOOTSTRAP_SAMPLES,
                  seed: int = BOOTSTRAP_SEED, level: float = BOOTSTRAP_LEVEL) -> list[float] | None:
    """[lo, hi]: the `level` bootstrap interval of the pooled PPL over windows (each of `score_last`
    scored tokens, summed nll `window_nll`); None without windows."""
    x = np.asarray(window_nll, np.float64)
    if x.size == 0:
        return None
    return _interval(np.exp(x[_draws(x.size, samples, seed)].mean(axis=1) / score_last), level)


def bootstrap_ratio(window_nll: Sequence[float], base_nll: Sequence[float], score_last: int, *,
                    samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED,
                    level: float = BOOTSTRAP_LEVEL) -> list[float] | None:
    """[lo, hi]: the paired bootstrap interval of PPL / base PPL over the same windows (the same draws
    for both); None without windows."""
    x, b = np.asarray(window_nll, np.float64), np.asarray(base_nll, np.float64)
    if x.shape != b.shape:
        raise ValueError(f"bootstrap_ratio: {x.size} windows against {b.size}; expected the same windows")
    if x.size == 0:
        return None
    return _interval(np.exp((x - b)[_draws(x.size, samples, seed)].mean(axis=1) / score_last), level)


def scored_positions(size: int, score_last: int = SCORE_LAST) -> np.ndarray:
    """Positions inside a window whose token is scored: the last `score_last` ones."""
    return np.arange(size - score_last, size)


def pooled_ppl(nll_sum: float, n_scored: int) -> float:
    """exp(sum of -log p / number of scored tokens)."""
    if n_scored < 1:
        raise ValueError("pooled_ppl: no scored tokens (every book shorter than the window?)")
    return float(np.exp(nll_sum / n_scored))


def position_buckets(row_len: int = 4096, width: int = 1024) -> list[tuple[int, int]]:
    """[(lo, hi)] target-position buckets of a row: [0, 1024), [1024, 2048), ..."""
    if row_len < 1 or width < 1:
        raise ValueError(f"position_buckets: row_len={row_len}, width={width}; expected positive sizes")
    return [(lo, min(lo + width, row_len)) for lo in range(0, row_len, width)]
