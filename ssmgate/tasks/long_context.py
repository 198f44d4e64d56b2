"""The long-context evaluation protocols of protocol §7.2 (PG-19 windows) and 7.3 (position buckets):
which windows, which positions are scored. Pure numpy; running a model over them is
`ssmgate.train.lm_eval`.

PG-19 windows (7.2): for a book of L tokens and a window size C, windows [s, s + C) start at
s = 0, sigma, 2 sigma, ... while s + C <= L, with sigma = max(10, floor((L - C) / 10)), so a book
has at most 11 windows and none when L <= C. The state is reset at each window start and only the
last `score_last` (100) tokens of a window are scored; the perplexity pools every scored token of
every window and book. The same C gives the same windows across models and interventions.

Position buckets (7.3): documents joined with EOS and cut into rows of `row_len` (4096) tokens, the
state reset at each row; the perplexity per bucket of target positions ([0, 1024), [1024, 2048),
...).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

PAPER_WINDOWS = (1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000)  # "2K" = 2000 tokens
SCORE_LAST = 100


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
