"""Pseudo-books and bootstrap intervals of the P2 windowed evaluation (long_context, lm_eval): every
window size C scores the same tokens of the same text, at C = the anchor the windows are protocol
§7.2's, and the intervals contain the point estimate and are reproducible."""
import jax
import numpy as np
import pytest

from ssmgate.models import lm
from ssmgate.models.config import ModelCfg
from ssmgate.programs.p2_lm.long_eval import LongEvalCfg, WindowBooks, cell_key, window_books
from ssmgate.programs.p2_lm.claims import BARS
from ssmgate.tasks import long_context as lc
from ssmgate.train import lm_eval

BOOKS = [np.arange(n, dtype=np.int32) % 250 for n in (739, 25310, 5762, 7347)]  # the cpu corpus's test book lengths


def test_pseudo_books_join_the_books_with_eos_and_cut_equal_pieces():
    got = lc.pseudo_books(BOOKS, 257, anchor=8192, score_last=100)
    length = lc.pseudo_book_len(8192, 100)
    assert length == 9192 and [len(b) for b in got] == [length] * 4  # 39,162 tokens hold 4
    stream = np.concatenate([np.append(b, 257) for b in BOOKS])
    np.testing.assert_array_equal(np.concatenate(got), stream[:4 * length])
    assert len(lc.pseudo_books(BOOKS, 257, 8192, 100, max_books=2)) == 2
    assert lc.pseudo_books(BOOKS[:1], 257, 8192, 100) == []  # 740 tokens hold none


def test_every_window_size_scores_the_same_tokens():
    books = lc.pseudo_books(BOOKS, 257, anchor=8192, score_last=100)
    lengths = [len(b) for b in books]
    ends = None
    for size in (512, 1024, 2048, 4096, 8192):
        windows = lc.aligned_windows(lengths, size, 8192, 100)
        assert len(windows) == 44 and all(w.size == size and w.start >= 0 for w in windows)
        got = [(w.book, w.start + size) for w in windows]
        ends = ends or got
        assert got == ends  # the same window ends, hence the same 100 scored tokens, at every C
    assert lc.aligned_windows(lengths, 8192, 8192, 100) == lc.pg19_windows(lengths, 8192, 100)
    # the scored tails of a pseudo-book are contiguous: sigma = score_last
    assert [e for b, e in ends if b == 0] == list(range(8192, 9193, 100))
    # the real books instead: the set of windows changes with C (one book is longer than 8192)
    real = [len(b) for b in BOOKS]
    assert len(lc.pg19_windows(real, 512, 100)) == 44 and len(lc.pg19_windows(real, 8192, 100)) == 11
    with pytest.raises(ValueError, match="window size 9000 > anchor 8192"):
        lc.aligned_windows(lengths, 9000, 8192, 100)
    with pytest.raises(ValueError, match="score_last=100 with window size 100"):
        lc.aligned_windows(lengths, 100, 8192, 100)


def test_window_books_of_the_evaluation():
    ecfg = LongEvalCfg(windows=(256, 1024), score_last=50, bc_window=1024, curve_windows=(256,), pseudo_books=4)
    assert ecfg.anchor() == 1024
    with pytest.raises(ValueError, match="bc_window=2048: with pseudo_books every window size must be <= the largest"):
        LongEvalCfg(windows=(256, 1024), score_last=50, bc_window=2048, pseudo_books=4).validate()
    wb = window_books(BOOKS, ecfg, eos_id=257)
    assert wb.anchor == 1024 and len(wb.books) == 4 and len(wb.books[0]) == 1524
    assert wb.describe() == {"layout": "pseudo_books", "pseudo_books": 4, "pseudo_book_tokens": 1524, "anchor": 1024}
    assert cell_key("native", None, None, 256, wb) == "native|None|None|256|pseudo4x1524@1024"
    plain = window_books(BOOKS, LongEvalCfg(windows=(256,)), eos_id=None)
    assert plain.anchor is None and cell_key("native", None, None, 256, plain) == "native|None|None|256"
    with pytest.raises(ValueError, match="eos_id is needed"):
        window_books(BOOKS, ecfg, eos_id=None)
    with pytest.raises(ValueError, match="hold no pseudo-book"):
        window_books(BOOKS[:1], ecfg, eos_id=257)
    with pytest.raises(ValueError, match="pseudo_books=-1"):
        LongEvalCfg(pseudo_books=-1).validate()
    with pytest.raises(ValueError, match="curve_windows=16: expected sizes > score_last=100"):
        LongEvalCfg(curve_windows=(16,)).validate()


def test_bootstrap_interval_contains_the_estimate_and_is_reproducible():
    rng = np.random.default_rng(3)
    nll = rng.gamma(2.0, 60.0, size=44)  # summed nll of 44 windows of 100 scored tokens
    point = lc.pooled_ppl(nll.sum(), 100 * nll.size)
    lo, hi = lc.bootstrap_ppl(nll, 100)
    assert lo < point < hi and lc.bootstrap_ppl(nll, 100) == [lo, hi]
    assert lc.bootstrap_ppl(nll, 100, seed=1) != [lo, hi]
    wide = lc.bootstrap_ppl(nll[:11], 100)
    assert wide[1] - wide[0] > hi - lo  # fewer windows, a wider interval
    other = nll * rng.uniform(1.5, 2.5, size=44)
    ratio = lc.pooled_ppl(other.sum(), 4400) / point
    r_lo, r_hi = lc.bootstrap_ratio(other, nll, 100)
    assert r_lo < ratio < r_hi and lc.bootstrap_ratio(other, nll, 100) == [r_lo, r_hi]
    assert lc.bootstrap_ratio(nll, nll, 100) == [1.0, 1.0]  # paired: the same windows cancel exactly
    assert lc.bootstrap_ppl([], 100) is None and lc.bootstrap_ratio([], [], 100) is None
    with pytest.raises(ValueError, match="expected the same windows"):
        lc.bootstrap_ratio(nll, nll[:10], 100)
    assert lc.BOOTSTRAP_LEVEL == BARS.bar("lm_ci_level")  # the checks' bar is the evaluation's level


def test_windowed_ppl_on_aligned_windows():
    cfg = ModelCfg(block="mamba3", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8, expand=2,
                   dtype="float32")
    model, params = lm.build_model(cfg), lm.init_params(cfg, jax.random.PRNGKey(0))
    books = lc.pseudo_books([np.random.default_rng(0).integers(0, 15, size=n) for n in (300, 500)], 15, 128, 16)
    wb = WindowBooks(books, anchor=128)
    small = lm_eval.windowed_ppl(model, params, wb.books, 64, score_last=16, batch=4, piece_len=64, anchor=128)
    large = lm_eval.windowed_ppl(model, params, wb.books, 128, score_last=16, batch=4, piece_len=64, anchor=128)
    assert small["n_windows"] == large["n_windows"] == 11 * len(books) and small["n_scored"] == large["n_scored"]
    plain = lm_eval.windowed_ppl(model, params, wb.books, 128, score_last=16, batch=4, piece_len=64)
    np.testing.assert_allclose(large["window_nll"], plain["window_nll"], rtol=1e-6)  # at the anchor: §7.2's
    # a window of 64 is the last 64 tokens of the 128-token window with the same end
    weights = np.zeros((1, 63), np.float32)
    weights[:, -16:] = 1.0
    w = lc.aligned_windows([len(b) for b in books], 64, 128, 16)[3]
    alone = lm_eval.sequence_nll(model, params, books[w.book][None, w.start:w.start + 64], weights, 64).sum()
    assert small["window_nll"][3] == pytest.approx(alone, rel=1e-5)
