"""The P1 multi-token KV retrieval generator and metrics (protocol §3.1) and check C11 (protocol §9)."""
import dataclasses
import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.tasks import kv_retrieval as kv
from ssmgate.tasks import length_buckets as lb
from ssmgate.tasks.synthetic_lm import lm_loss, step_key

# Compiled once per (cfg, n_lo, n_hi) and shared with batch_for_step: compiles dominate this file's time,
# so few configurations are used.
_sample = kv.sample_jit
_accuracy = jax.jit(kv.prediction_accuracy)
PAPER = kv.KVCfg()  # vocab 64, m 8, dictionary 10k, N 512 (C11)
BASELINE = 0.9 ** 8  # (1 - eps)^m = 0.43047


@functools.lru_cache(maxsize=None)
def _dictionary(cfg: kv.KVCfg):
    return kv.make_dictionary(cfg)


def _paper_cfg(query: str) -> kv.KVCfg:
    return dataclasses.replace(PAPER, query=query, batch=256)


@functools.lru_cache(maxsize=None)
def _paper_batch(query: str, i: int) -> kv.KVBatch:
    """Batch i of 256 examples at n = N = 512 (C11): 256 * 52 = 13,312 queries."""
    return _sample(step_key(11, i), _paper_cfg(query), _dictionary(PAPER), 512, 512)


def _ceil_q(cfg, n):
    return max(1, math.ceil(Fraction(str(cfg.q)) * n))


def _check_structure(batch, cfg, dictionary, rows=None):
    """Parses every row from its tokens alone and checks the §3.1 layout, the dictionary, the query sets
    and the diagnostics. Returns (context values, their static values) of all parsed rows."""
    keys, vals = dictionary
    lookup = {k.tobytes(): i for i, k in enumerate(keys)}
    inp, tgt, mask = (np.asarray(a) for a in batch[:3])
    seq = np.concatenate([inp, tgt[:, -1:]], axis=1)
    np.testing.assert_array_equal(inp[:, 1:], tgt[:, :-1])  # causal framing
    W, m, Q = cfg.block, cfg.m, batch.query_mask.shape[1]
    lo_c, hi_c = kv.N_SPECIAL, kv.N_SPECIAL + cfg.n_content
    assert seq.min() >= 0 and seq.max() < cfg.vocab_size
    ctx_vals, static_vals = [], []
    for r in rows if rows is not None else range(seq.shape[0]):
        n, nq, s = int(batch.n[r]), int(batch.n_q[r]), seq[r]
        assert nq == _ceil_q(cfg, n) >= 1
        L = 2 + W * (n + nq)
        assert s[0] == kv.BOS and s[1 + W * n] == kv.BAR and (s[L:] == kv.PAD).all()
        ctx, qry = s[1:1 + W * n].reshape(n, W), s[2 + W * n:L].reshape(nq, W)
        for blk in (ctx, qry):
            assert (blk[:, m] == kv.COLON).all() and (blk[:, -1] == kv.COMMA).all()
            body = np.concatenate([blk[:, :m], blk[:, m + 1:2 * m + 1]], axis=1)
            assert body.min() >= lo_c and body.max() < hi_c
        ck, cv = ctx[:, :m], ctx[:, m + 1:2 * m + 1]
        idx = np.array([lookup[k.tobytes()] for k in ck])  # KeyError: not a dictionary key
        assert len(set(idx.tolist())) == n                  # distinct keys
        ctx_vals.append(cv)
        static_vals.append(vals[idx])
        qpos = np.asarray(batch.query_pos[r])
        assert (qpos[nq:] == -1).all()
        first = range(nq) if cfg.query == "best_first" else range(n - nq, n)
        assert sorted(qpos[:nq].tolist()) == list(first)   # exact query index set
        np.testing.assert_array_equal(qry[:, :m], ck[qpos[:nq]])
        np.testing.assert_array_equal(qry[:, m + 1:2 * m + 1], cv[qpos[:nq]])  # target = in-context value
        np.testing.assert_array_equal(np.asarray(batch.query_perturbed[r]),
                                      np.r_[(cv != vals[idx]).any(1)[qpos[:nq]], np.zeros(Q - nq, bool)])
        starts = W * n + 2 + W * np.arange(nq) + m
        want = np.zeros(inp.shape[1])
        for st in starts:
            want[st:st + m] = 1
        np.testing.assert_array_equal(mask[r], want)
        assert (tgt[r][want > 0] == qry[:, m + 1:2 * m + 1].ravel()).all()
        np.testing.assert_array_equal(np.asarray(batch.query_start[r]), np.r_[starts, np.zeros(Q - nq)])
        np.testing.assert_array_equal(np.asarray(batch.query_mask[r]), np.arange(Q) < nq)
    return np.concatenate(ctx_vals), np.concatenate(static_vals)


# --- configuration and dictionary ------------------------------------------------------------------------

def test_paper_cfg_and_lengths():
    assert (PAPER.n_content, PAPER.m, PAPER.dict_size, PAPER.n_max) == (64, 8, 10_000, 512)
    assert (PAPER.eps, PAPER.q, PAPER.query) == (0.1, 0.1, "best_first")
    assert (PAPER.vocab_size, PAPER.padded_vocab, PAPER.block) == (69, 72, 18)
    assert kv.seq_len(PAPER, 512) == 2 + 18 * (512 + 52) == 10_154
    assert kv.seq_len(PAPER, 2048) == 2 + 18 * (2048 + 205) == 40_556     # protocol: ~41k tokens at n = 2048
    ns = np.arange(1, 2049)
    want = np.array([max(1, -(-n // 10)) for n in ns])     # exact ceil(n / 10); float 0.1 * 30 would give 4
    assert [kv.n_queries(PAPER, int(n)) for n in ns] == want.tolist()
    np.testing.assert_array_equal(np.asarray(kv.n_queries(PAPER, jnp.asarray(ns))), want)
    third = kv.KVCfg(q=1 / 3).validate()
    assert [kv.n_queries(third, n) for n in (1, 3, 4, 6, 7)] == [1, 1, 2, 2, 3]


@pytest.mark.parametrize("override, match", [
    (dict(n_content=1), r"n_content=1: expected >= 2"),
    (dict(m=0), r"m=0: expected >= 1"),
    (dict(batch=0), r"batch=0: expected >= 1"),
    (dict(n_max=0), r"n_max=0: expected >= 1"),
    (dict(m=2.0), r"m=2.0: expected an int"),
    (dict(dict_size=100), r"dict_size=100: expected >= n_max = 512"),
    (dict(n_content=2, m=3, n_max=4, dict_size=9), r"dict_size=9: expected <= n_content\*\*m = 8"),
    (dict(eps=1.5), r"eps=1.5: expected a probability in \[0, 1\]"),
    (dict(q=0.0), r"q=0.0: expected a query ratio in \(0, 1\]"),
    (dict(q=0.12345), r"q=0.12345: expected a fraction with denominator <= 1000"),
    (dict(query="middle"), r"query='middle': expected one of \('best_first', 'best_last'\)"),
    (dict(dict_seed=-1), r"dict_seed=-1: expected >= 0"),
])
def test_cfg_validate_names_the_bad_field(override, match):
    with pytest.raises(ValueError, match=match):
        kv.KVCfg(**override).validate()


def test_bad_ranges_and_bounds_raise():
    small = kv.KVCfg(n_max=8, dict_size=16, batch=2)
    d = kv.make_dictionary(small)
    for lo, hi, match in ((0, 4, r"\(n_lo, n_hi\)=\(0, 4\)"), (5, 4, r"\(n_lo, n_hi\)=\(5, 4\)"),
                          (1, 17, r"n_hi <= dict_size = 16"), (1.0, 4, r"n_lo=1.0: expected a static python int")):
        with pytest.raises(ValueError, match=match):
            kv.sample(jax.random.PRNGKey(0), small, d, lo, hi)
    # batch_for_step's bounds must cover 1..n_max exactly (checked before anything is compiled).
    for bounds in (((1, 4), (6, 8)), ((1, 4), (5, 7)), ((2, 4), (5, 8))):
        with pytest.raises(ValueError, match=r"expected contiguous \(lo, hi\) ranges covering 1\.\.8"):
            kv.batch_for_step(small, d, 0, 0, bounds)


def test_dictionary_is_static_distinct_and_in_range():
    keys, vals = _dictionary(PAPER)
    assert keys.shape == vals.shape == (10_000, 8) and keys.dtype == vals.dtype == np.int32
    for a in (keys, vals):
        assert a.min() == kv.N_SPECIAL and a.max() == kv.N_SPECIAL + 63   # content tokens only, all used
        counts = np.bincount(a.ravel() - kv.N_SPECIAL, minlength=64)
        assert np.abs(counts / counts.mean() - 1).max() < 0.15              # iid uniform (mean 1250)
    assert len(np.unique(keys, axis=0)) == 10_000
    k2, v2 = kv.make_dictionary(PAPER)
    np.testing.assert_array_equal(k2, keys)
    np.testing.assert_array_equal(v2, vals)
    assert not np.array_equal(kv.make_dictionary(kv.KVCfg(dict_seed=1))[0], keys)
    # All 8 keys of {a, b}^3: the redraw loop must terminate with every key distinct.
    full = kv.make_dictionary(kv.KVCfg(n_content=2, m=3, n_max=8, dict_size=8))[0]
    assert len(np.unique(full, axis=0)) == 8


# --- check C11 ---------------------------------------------------------------------------------------------

def test_c11_memoriser_scores_baseline_and_copier_scores_one():
    cfg, d = _paper_cfg("best_first"), _dictionary(PAPER)
    tot = {"n": 0, "ok": 0}
    for b in (_paper_batch("best_first", i) for i in range(8)):
        mem = _accuracy(jnp.asarray(kv.memoriser_predictions(b, cfg, d)), b)
        assert float(mem["seq_accuracy_perturbed"]) == 0.0 and float(mem["seq_accuracy_clean"]) == 1.0
        tot["n"] += int(mem["n_queries"])
        tot["ok"] += int(mem["n_clean"])
        assert int(mem["n_queries"]) == 256 * 52 == int(b.query_mask.sum())
        cop = _accuracy(jnp.asarray(kv.copier_predictions(b, cfg)), b)
        assert float(cop["seq_accuracy"]) == 1.0
    assert tot["n"] == 8 * 13_312                  # 106,496 queries: sd of the mean 0.0015
    assert abs(tot["ok"] / tot["n"] - BASELINE) < 0.005, tot["ok"] / tot["n"]


@pytest.mark.parametrize("query", kv.QUERIES)
def test_c11_layout_query_sets_and_perturbation_at_paper_size(query):
    cfg, b = _paper_cfg(query), _paper_batch(query, 0)
    assert b.inputs.shape == (256, 10_153) and b.query_mask.shape == (256, 52)
    assert (np.asarray(b.n) == 512).all() and (np.asarray(b.n_q) == 52).all()
    cv, sv = _check_structure(b, cfg, _dictionary(PAPER))
    changed = cv != sv
    assert abs(changed.mean() - 0.1) < 0.002                       # eps per token (1.05M tokens)
    shift = (cv[changed] - sv[changed]) % 64                      # replacement: uniform over the other 63
    counts = np.bincount(shift, minlength=64)
    assert counts[0] == 0 and np.abs(counts[1:] / counts[1:].mean() - 1).max() < 0.15
    # Presentation order is random: 52 queries in ascending order would have probability 1/52!.
    qpos = np.asarray(b.query_pos)
    assert (np.diff(qpos, axis=1) > 0).all(axis=1).sum() == 0
    if query == "best_last":
        cop = _accuracy(jnp.asarray(kv.copier_predictions(b, cfg)), b)
        assert float(cop["seq_accuracy"]) == 1.0


SMALL = kv.KVCfg(batch=64, n_max=64)


@functools.lru_cache(maxsize=None)
def _small_batch(query: str, seed: int = 3) -> kv.KVBatch:
    """n ~ U{1..32}: the first of lb.equal_buckets(1, 64, 2), so batch_for_step reuses the compile."""
    return _sample(jax.random.PRNGKey(seed), dataclasses.replace(SMALL, query=query), _dictionary(PAPER), 1, 32)


@pytest.mark.parametrize("query", kv.QUERIES)
def test_variable_n_bucket_structure_and_copier(query):
    cfg, b = dataclasses.replace(SMALL, query=query), _small_batch(query)
    assert b.inputs.shape == (64, kv.seq_len(cfg, 32) - 1) and b.query_mask.shape == (64, 4)
    n = np.asarray(b.n)
    assert n.min() >= 1 and n.max() <= 32 and len(np.unique(n)) > 20
    _check_structure(b, cfg, _dictionary(PAPER))
    assert float(_accuracy(jnp.asarray(kv.copier_predictions(b, cfg)), b)["seq_accuracy"]) == 1.0
    mem = _accuracy(jnp.asarray(kv.memoriser_predictions(b, cfg, _dictionary(PAPER))), b)
    assert float(mem["seq_accuracy_perturbed"]) == 0.0 and float(mem["seq_accuracy_clean"]) == 1.0


def test_same_key_same_batch():
    a, again, other = _small_batch("best_first"), _small_batch("best_first", 4), _small_batch("best_first", 5)
    fresh = _sample(jax.random.PRNGKey(3), SMALL, _dictionary(PAPER), 1, 32)  # not the cached object
    for x, y in zip(a, fresh):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(again.inputs), np.asarray(other.inputs))


def test_eps_one_perturbs_every_value_token():
    cfg, d = dataclasses.replace(SMALL, batch=8, eps=1.0), _dictionary(PAPER)
    b = jax.jit(kv.sample_eval, static_argnums=(1, 3))(jax.random.PRNGKey(1), cfg, d, 30)
    assert (np.asarray(b.n) == 30).all()
    mem = _accuracy(jnp.asarray(kv.memoriser_predictions(b, cfg, d)), b)
    assert float(mem["seq_accuracy"]) == 0.0 and int(mem["n_perturbed"]) == 8 * 3
    cv, sv = _check_structure(b, cfg, d)
    assert (cv != sv).all()


# --- metrics -----------------------------------------------------------------------------------------------

def test_sequence_accuracy_counts_whole_values_from_logits():
    cfg, b = SMALL, _small_batch("best_first")
    rows = np.nonzero(np.asarray(b.n_q) >= 3)[0]
    r0, r1, r2 = (int(r) for r in rows[:3])
    total = int(np.asarray(b.n_q).sum())
    pred = kv.copier_predictions(b, cfg)
    acc = jax.jit(kv.sequence_accuracy)
    assert float(acc(kv.one_hot_logits(pred, cfg), b)["seq_accuracy"]) == 1.0
    start = np.asarray(b.query_start)
    bad = pred.copy()
    bad[r1, start[r1, 2] + cfg.m - 1] += 1           # last value token of a third query
    bad[r2, 0] = 99                                  # an unscored position changes nothing
    bad[r2, start[r2, 1] - 1] = 99                   # nor does the ':' prediction before a value
    out = acc(kv.one_hot_logits(bad, cfg), b)
    assert int(out["n_queries"]) == total and float(out["seq_accuracy"]) == np.float32((total - 1) / total)
    ok = np.asarray(kv.query_correct(jnp.asarray(bad), b))
    assert ok.sum() == total - 1 and not ok[r1, 2]
    bad[r0, start[r0, 0]] += 1                        # first value token of a first query
    assert float(acc(kv.one_hot_logits(bad, cfg), b)["seq_accuracy"]) == np.float32((total - 2) / total)
    # The framework loss works on a KVBatch (LMBatch fields) and agrees on fully correct rows.
    _, metrics = lm_loss(kv.one_hot_logits(pred, cfg) * 50.0, b)
    assert float(metrics["accuracy"]) == 1.0 and float(metrics["seq_accuracy"]) == 1.0


# --- training stream ------------------------------------------------------------------------------------

def test_batch_for_step_samples_the_salted_step_bucket():
    """batch_for_step = sample_jit(step_key(seed, step), .., bucket) with the bucket drawn by
    length_buckets.bucket_for_step under KV's own salt (the shared helper is tested in test_length_buckets)."""
    small = lb.equal_buckets(1, SMALL.n_max, 2)
    assert small == ((1, 32), (33, 64))
    draw = lambda k, salt: lb.bucket_for_step(small, 5, k, salt=salt)
    # A step whose KV-salted bucket is (1, 32) but whose unsalted one is not: the salt is used.
    step = next(k for k in range(200) if draw(k, kv.BUCKET_SALT) == (1, 32) and draw(k, 0) != (1, 32))
    b = kv.batch_for_step(SMALL, _dictionary(PAPER), 5, step, small)   # (1, 32) is compiled already
    assert b.inputs.shape == (64, kv.seq_len(SMALL, 32) - 1) and 1 <= np.asarray(b.n).min()
    expect = _sample(step_key(5, step), SMALL, _dictionary(PAPER), 1, 32)
    np.testing.assert_array_equal(np.asarray(b.inputs), np.asarray(expect.inputs))
