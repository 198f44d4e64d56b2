"""The Horn-clause retrieval task (protocol §4.1-4.5) and check C13 (protocol §9): graph, episodes, classes,
Plackett–Luce ranking, pools, names, tokens, buckets and metrics."""
import functools
import math
import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ssmgate.tasks import horn as H
from ssmgate.tasks import horn_ranking as hr
from ssmgate.tasks import length_buckets as lb
from ssmgate.tasks.synthetic_lm import lm_loss, step_key

RCFG = H.HornCfg(batch=256, n_buckets=1)                     # retrieval, k ~ U{1..32}, both turns
LCFG = H.HornCfg(regime="lengen", batch=256)                 # lengen, k ~ U{1..8}, beta = inf
GRAPH = H.build_graph(RCFG)
P, K = 128, 128


def _np(batch):
    return jax.tree.map(np.asarray, batch)


@functools.lru_cache(maxsize=None)
def _batch(cfg, lo, hi, seed=0):
    return _np(H.sample_jit(jax.random.PRNGKey(seed), cfg, GRAPH, lo, hi))


@functools.lru_cache(maxsize=None)
def _eval(cfg, kind, k, n, seed=0):
    return _np(H.sample_eval_jit(jax.random.PRNGKey(seed), cfg, GRAPH, kind, k, n))


@functools.lru_cache(maxsize=None)
def _states(turn, n, seed=0):
    return _np(jax.jit(hr.sample_states, static_argnums=(1, 2, 3))(jax.random.key(seed), GRAPH, n, turn))


_pl = jax.jit(jax.vmap(hr.pl_order, in_axes=(0, 0, None)), static_argnums=2)


def _orders(classes, beta, seed=1):
    """One PL order per row of classes, with the same per-row keys whatever beta (common random numbers)."""
    return np.asarray(_pl(jax.random.split(jax.random.key(seed), len(classes)), jnp.asarray(classes), beta))


def _valid(batch, i):
    return slice(0, int(batch.k[i]))


# --- configuration ------------------------------------------------------------------------------

def test_cfg_defaults_follow_spec():
    cfg = H.HornCfg().validate()
    assert (cfg.n_sets, cfg.props_per_set, cfg.K, cfg.q_fresh, cfg.beta) == (3, 128, 128, 0.1, math.inf)
    assert (cfg.regime, cfg.k_min, cfg.k_upper) == ("retrieval", 1, 32)
    assert H.HornCfg(regime="lengen").k_upper == 8 and H.HornCfg(k_max=20).k_upper == 20
    assert H.LENGEN_KS == (1, 2, 4, 8, 16, 32, 64, 128) and H.PROBE_K == 32
    assert [H.n_fresh(0.1, k) for k in (1, 9, 10, 11, 30, 32)] == [1, 1, 1, 2, 3, 4]
    assert H.n_fresh(0.07, 100) == 7                              # math.ceil(0.07 * 100) is 8


@pytest.mark.parametrize("override, match", [
    (dict(regime="icl"), r"regime='icl': expected one of \('retrieval', 'lengen'\)"),
    (dict(turns="1"), r"turns='1': expected one of \('both', 'first', 'second'\)"),
    (dict(n_sets=4), r"n_sets=4: expected 3"),
    (dict(props_per_set=1), r"props_per_set=1: expected 2 \.\. "),
    (dict(K=0), r"K=0: expected 1 \.\. 3333"),
    (dict(props_per_set=4, K=17, k_max=8), r"K=17: expected 1 \.\. 16"),
    (dict(K=2.0), r"K=2.0: expected an int"),
    (dict(graph_seed=-1), r"graph_seed=-1: expected >= 0"),
    (dict(k_min=0), r"k_min=0: expected >= 1"),
    (dict(k_max=129), r"k_max=129: expected k_min = 1 <= k_max <= K = 128"),
    (dict(k_min=9, regime="lengen"), r"k_max=None: expected k_min = 9 <= k_max <= K = 128"),
    (dict(k_max=3.5), r"k_max=3.5: expected an int or None"),
    (dict(q_fresh=0.0), r"q_fresh=0.0: expected a float in \(0, 1\]"),
    (dict(beta=-1.0), r"beta=-1.0: expected a float >= 0 \(inf allowed\)"),
    (dict(beta=float("nan")), r"beta=nan: expected a float >= 0"),
    (dict(batch=0), r"batch=0: expected >= 1"),
    (dict(n_buckets=0), r"n_buckets=0: expected >= 1"),
])
def test_cfg_validate_names_the_bad_field(override, match):
    with pytest.raises(ValueError, match=match):
        H.HornCfg(**override).validate()


def test_bad_sampler_arguments_raise_named_errors():
    with pytest.raises(ValueError, match=r"\(k_lo, k_hi\)=\(0, 4\): expected ints 1 <= k_lo <= k_hi <= K = 128"):
        H.sample(jax.random.key(0), RCFG, GRAPH, 0, 4)
    with pytest.raises(ValueError, match=r"\(k_lo, k_hi\)=\(1, 129\)"):
        H.sample(jax.random.key(0), RCFG, GRAPH, 1, 129)
    with pytest.raises(ValueError, match=r"graph=\(props_per_set, K, graph_seed\)=\(128, 128, 0\): "
                                         r"expected \(128, 128, 5\)"):
        H.sample(jax.random.key(0), H.HornCfg(graph_seed=5), GRAPH, 1, 4)
    with pytest.raises(ValueError, match=r"kind='best': expected one of"):
        H.sample_eval(jax.random.key(0), RCFG, GRAPH, "best", 4, 8)
    with pytest.raises(ValueError, match=r"n=0: expected an int >= 1"):
        H.sample_eval(jax.random.key(0), RCFG, GRAPH, "lengen", 4, 0)
    small = H.HornCfg(props_per_set=16, K=16, k_max=8)
    g16 = H.build_graph(small)
    bound = 16 - g16.max_out_degree
    with pytest.raises(ValueError, match=rf"k={bound + 1}: the no_oracle probe .* = {bound}"):
        H.sample_eval(jax.random.key(0), small, g16, "no_oracle", bound + 1, 8)
    with pytest.raises(ValueError, match=r"turn=3: expected 1 or 2"):
        hr.sample_states(jax.random.key(0), GRAPH, 4, 3)
    with pytest.raises(ValueError, match=r"\(seed, step, salt\)=\(-1, 0, 0\): expected ints >= 0"):
        H.batch_for_step(RCFG, GRAPH, -1, 0)
    with pytest.raises(ValueError, match=r"rule='any': expected one of"):
        hr.correct(jnp.zeros(2, jnp.int32), None, GRAPH, "any")


# --- tokens -------------------------------------------------------------------------------------

def test_token_ids_and_encode_decode_round_trip():
    assert H.VOCAB_SIZE == 45 and (H.PAD, H.START, H.EOS) == (0, 1, 2)
    assert H.encode("09az_->:|,").tolist() == [3, 12, 13, 38, 39, 40, 41, 42, 43, 44]
    text = "0123:r_ab9z->r_0000|4567:r_zzzz->r_a1b2|r_ab9z,r_0000<START>0123<EOS><PAD><PAD>"
    toks = H.encode(text)
    assert H.decode(toks) == text and np.array_equal(H.encode(H.decode(toks)), toks)
    assert len(H.encode("0123:r_ab9z->r_0000|")) == H.ITEM_LEN == 20
    assert len(H.encode("r_ab9z,r_0000<START>")) == H.QUERY_LEN and len(H.encode("0123<EOS>")) == H.TARGET_LEN
    assert H.seq_len(2) == len(H.encode(text)) - 2
    with pytest.raises(ValueError, match=r"text\[2\]='A': expected one of"):
        H.encode("r_A")


# --- rule graph ---------------------------------------------------------------------------------

def test_graph_structure():
    g = GRAPH
    props = [g.prop(i) for i in range(3 * P)]
    assert len(set(props)) == 3 * P and all(re.fullmatch(r"r_[0-9a-z]{4}", s) for s in props)
    for layer in (0, 1):
        pairs = set(zip(g.src[layer].tolist(), g.dst[layer].tolist()))
        assert len(pairs) == K and g.src[layer].max() < P and g.dst[layer].max() < P
    assert len(set(g.names.ravel().tolist())) == 2 * K and 0 <= g.names.min() and g.names.max() <= 9999
    adj2 = np.zeros((P, P), bool)
    for a, b in zip(g.src[1], g.dst[1]):
        adj2[a, b] = True
    assert np.array_equal(g.reach[0], adj2) and np.array_equal(g.reach[1], np.eye(P, dtype=bool))
    assert g.eligible1.tolist() == [c for c in range(K) if adj2[g.dst[0, c]].any()]
    for b in range(P):
        assert sorted(g.out2[b, : g.deg2[b]].tolist()) == np.flatnonzero(g.src[1] == b).tolist()
        assert np.all(g.out2[b, g.deg2[b]:] == -1)
    assert g.fresh_pool.size == 10_000 - 2 * K and not np.isin(g.fresh_pool, g.names).any()
    assert g.clause(1, 0) == f"{g.prop(P + g.src[1, 0])}->{g.prop(2 * P + g.dst[1, 0])}"
    # Built once per (props_per_set, K, graph_seed): the same object for jit's static cache, reproducible.
    assert H.build_graph(H.HornCfg(regime="lengen")) is GRAPH
    again = H.HornGraph(P, K, 0)
    assert np.array_equal(again.names, g.names) and np.array_equal(again.src, g.src) and again.prop(7) == g.prop(7)
    assert not np.array_equal(H.build_graph(H.HornCfg(graph_seed=1)).src, g.src)


# --- episodes and classes -----------------------------------------------------------------------

def _brute_classes(layer, cur, goal):
    """Classes from the clause list alone (protocol §4.1), cur and goal local indices."""
    g = GRAPH
    out = []
    for a, b in zip(g.src[layer], g.dst[layer]):
        reach = (b, goal) in set(zip(g.src[1], g.dst[1])) if layer == 0 else b == goal
        out.append(1 if a == cur and reach else 2 if a == cur else 3 if reach else 4)
    return np.asarray(out)


def test_episodes_follow_the_recipe_and_classes_partition():
    n = 4000
    s1, s2 = _states(1, n), _states(2, n)   # same key: the same episodes seen at turn 1 and turn 2
    g = GRAPH
    assert np.array_equal(s1.goal, s2.goal) and np.all(s1.goal >= 2 * P)
    assert np.array_equal(g.src[0, s1.path], s1.current) and np.array_equal(g.dst[0, s1.path] + P, s2.current)
    assert np.array_equal(g.src[1, s2.path] + P, s2.current) and np.array_equal(g.dst[1, s2.path] + 2 * P, s2.goal)
    assert np.isin(s1.path, g.eligible1).all()
    # c1 uniform over the eligible layer-1 clauses (protocol recipe step 2).
    counts = np.bincount(np.searchsorted(g.eligible1, s1.path), minlength=g.eligible1.size)
    assert stats.chisquare(counts).pvalue > 0.01
    for turn, s in ((1, s1), (2, s2)):
        cls = s.classes
        assert set(np.unique(cls).tolist()) <= {1, 2, 3, 4}
        sizes = np.stack([(cls == c).sum(1) for c in (1, 2, 3, 4)], 1)
        assert np.all(sizes.sum(1) == K) and np.all(sizes[:, 0] >= 1)
        assert np.all(cls[np.arange(n), s.path] == 1)
        if turn == 2:
            assert np.all(sizes[:, 0] == 1)     # distinct clauses: only B -> Q itself
        for i in range(0, n, 97):
            want = _brute_classes(turn - 1, s.current[i] - (turn - 1) * P, s.goal[i] - 2 * P)
            assert np.array_equal(cls[i], want)
            assert np.array_equal(cls[i], g.classes(turn - 1, s.current[i] - (turn - 1) * P, s.goal[i] - 2 * P))


# --- Plackett–Luce ranking ----------------------------------------------------------------------

def test_pl_beta0_class1_rank_is_uniform():
    s = _states(1, 12_800, seed=2)
    order = _orders(s.classes, 0.0)
    rank = np.argmax(order == s.path[:, None], axis=1)    # rank of the episode's oracle among all K
    assert np.all(np.sort(order, 1) == np.arange(K))
    assert stats.chisquare(np.bincount(rank, minlength=K)).pvalue > 0.01


@pytest.mark.parametrize("beta", [50.0, math.inf])
def test_pl_strong_beta_ranks_class1_first_and_randomises_within_class(beta):
    s = _states(1, 4000, seed=3)
    order = _orders(s.classes, beta)
    ranked = np.take_along_axis(s.classes, order, 1)
    n1 = (s.classes == 1).sum(1)
    assert all(np.all(ranked[i, : n1[i]] == 1) for i in range(len(n1)))
    assert np.all(np.diff(ranked, axis=1) >= 0)          # then 2, 3, 4 (no NaN from inf * class)
    # Within a class the order is uniform: the first class-4 clause of one fixed state, over many keys.
    cls = np.repeat(s.classes[:1], 6000, 0)
    first4 = _orders(cls, beta, seed=4)[np.arange(6000), (cls[0] < 4).sum()]
    assert cls[0, first4].max() == 4
    ids = np.flatnonzero(cls[0] == 4)
    assert stats.chisquare(np.bincount(np.searchsorted(ids, first4), minlength=ids.size)).pvalue > 0.01


def test_recall_monotone_in_k_and_beta_and_hypergeometric_at_beta0():
    s = _states(1, 20_000, seed=5)
    n1 = (s.classes == 1).sum(1)
    betas = (0.0, 0.5, 2.0, 50.0, math.inf)
    ks = np.asarray(H.LENGEN_KS)
    recall = np.zeros((len(betas), len(ks)))
    for bi, beta in enumerate(betas):
        rank = np.argmax(np.take_along_axis(s.classes, _orders(s.classes, beta), 1) == 1, axis=1)
        recall[bi] = [(rank < k).mean() for k in ks]
    order, cls = _orders(s.classes[:3], 0.5), s.classes[:3].copy()
    cls[2] = np.where(cls[2] == 1, 2, cls[2])          # a row without class 1 ranks it at K
    want = [np.argmax(cls[0, order[0]] == 1), np.argmax(cls[1, order[1]] == 1), K]
    assert np.asarray(jax.vmap(hr.first_class1_rank)(order, cls)).tolist() == want
    assert np.all(np.diff(recall, axis=1) >= 0) and np.all(np.diff(recall, axis=0) >= 0)
    assert recall[0, 0] < 0.05 and np.all(recall[-2:] == 1.0) and recall[0, -1] == 1.0
    exact = np.asarray([[float(hr.uniform_recall(K, m, k)) for k in ks] for m in range(n1.max() + 1)])
    expected = exact[n1].mean(0)                       # hypergeometric, averaged over these episodes
    assert np.all(np.abs(recall[0] - expected) <= 0.01), (recall[0], expected)
    assert hr.uniform_recall(128, 1, 32) == Fraction(1, 4) and hr.uniform_recall(128, 2, 128) == 1


# --- batches ------------------------------------------------------------------------------------

def _check_tokens_and_mask(b, rows):
    for i in rows:
        k = int(b.k[i])
        toks = H.row_tokens(b, i)
        text = H.example_text(GRAPH, b, i)
        assert H.decode(toks) == text and np.array_equal(H.encode(text), toks)
        seq = np.concatenate([b.inputs[i], b.targets[i, -1:]])
        assert np.all(seq[H.seq_len(k):] == H.PAD)
        on = np.flatnonzero(b.mask[i])
        assert on.tolist() == list(range(20 * k + 13, 20 * k + 18)) and b.target_pos[i] == 20 * k + 13
        assert b.inputs[i, 20 * k + 13] == H.START
        assert H.decode(b.targets[i, on]) == f"{int(b.answer[i]):04d}<EOS>"


def _check_names(b, i, n_fresh):
    k = int(b.k[i])
    names, clauses, layer = b.pool_name[i, :k], b.pool_clause[i, :k], int(b.turn[i]) - 1
    assert len(set(names.tolist())) == k                       # unique within the prompt
    static = GRAPH.names[layer, clauses]
    assert not np.isin(names[:n_fresh], GRAPH.names).any()      # fresh: no clause's static name
    assert np.array_equal(names[n_fresh:], static[n_fresh:])
    assert np.all(b.pool_name[i, k:] == -1) and np.all(b.pool_clause[i, k:] == -1) and np.all(b.pool_class[i, k:] == 0)


def test_retrieval_batch():
    b = _batch(RCFG, 1, 32)
    n = RCFG.batch
    assert b.inputs.shape == b.targets.shape == b.mask.shape == (n, 20 * 32 + 18)
    assert b.inputs.dtype == b.targets.dtype == np.int32 and b.mask.dtype == np.float32
    assert b.k.min() == 1 and b.k.max() == 32 and np.array_equal(b.turn, 1 + np.arange(n) % 2)
    for i in range(n):
        k, layer = int(b.k[i]), int(b.turn[i]) - 1
        clauses = b.pool_clause[i, :k]
        assert len(set(clauses.tolist())) == k and clauses.min() >= 0 and clauses.max() < K
        cur, goal = b.current[i] - layer * P, b.goal[i] - 2 * P
        assert np.array_equal(b.layer_class[i], GRAPH.classes(layer, cur, goal))
        pc = b.pool_class[i, :k]
        assert np.array_equal(pc, b.layer_class[i, clauses])
        assert sum((pc == c).sum() for c in (1, 2, 3, 4)) == k and (pc == 1).sum() >= 1
        o = int(b.oracle_pos[i])
        assert 0 <= o < k and clauses[o] == b.path[i] and pc[o] == 1 and b.answer[i] == b.pool_name[i, o]
        _check_names(b, i, H.n_fresh(0.1, k))
    _check_tokens_and_mask(b, range(0, n, 7))
    # the injected oracle's position is uniform on 0..k-1: its relative position has mean ~1/2 - 1/(2k)
    rel = (b.oracle_pos + 0.5) / b.k
    assert abs(rel.mean() - 0.5) < 0.06
    loss, _ = lm_loss(jnp.zeros(b.inputs.shape + (H.VOCAB_SIZE,)), H.HornBatch(*b).lm())
    assert abs(float(loss) - math.log(H.VOCAB_SIZE)) < 1e-5


def test_lengen_batch_reverse_rank_order_all_fresh():
    b = _batch(LCFG, 1, 8)
    assert b.inputs.shape == (LCFG.batch, 20 * 8 + 18) and set(b.k.tolist()) == set(range(1, 9))
    for i in range(LCFG.batch):
        k = int(b.k[i])
        pc = b.pool_class[i, :k]
        assert np.all(np.diff(pc) <= 0) and pc[-1] == 1          # best next to the query
        assert b.oracle_pos[i] == k - 1 and b.answer[i] == b.pool_name[i, k - 1]
        _check_names(b, i, k)
    _check_tokens_and_mask(b, range(0, LCFG.batch, 11))


def test_lengen_eval_pools():
    b = _eval(LCFG, "lengen", 128, 16)
    assert np.all(np.sort(b.pool_clause, 1) == np.arange(K)) and np.all(b.turn == 1)
    assert np.all(np.diff(b.pool_class, axis=1) <= 0) and np.all(b.pool_class[:, -1] == 1)
    _check_tokens_and_mask(b, [0])
    # finite beta: a pool may hold no class-1 clause; that row is then unscored (all-zero mask)
    b0 = _eval(H.HornCfg(regime="lengen", beta=0.0), "lengen", 1, 512)
    none = b0.pool_class[:, 0] != 1
    assert 0.9 < none.mean() < 1.0
    assert np.all(b0.mask[none] == 0) and np.all(b0.oracle_pos[none] == -1)
    assert np.all(b0.mask[~none].sum(1) == 5) and np.all(b0.oracle_pos[~none] == 0)


def test_no_oracle_probe():
    b = _eval(RCFG, "no_oracle", H.PROBE_K, 256)
    assert np.all(b.k == 32) and np.all(b.turn == 1)
    assert not np.any(b.pool_class == 1) and np.all(b.oracle_pos == -1)
    for i in range(256):
        _check_names(b, i, 0)                                     # static names only
    assert np.array_equal(b.answer, GRAPH.names[0, b.path])       # memorisation target, not in context
    assert all(b.path[i] not in b.pool_clause[i] for i in range(256))
    _check_tokens_and_mask(b, range(0, 256, 17))


def test_random_oracle_name_probe():
    b = _eval(RCFG, "rand_name", H.PROBE_K, 512)
    assert np.all(b.k == 32) and np.all((b.pool_class == 1).sum(1) == 1)
    assert set(b.oracle_pos.tolist()) == {0, 1, 2, 3}             # uniform in the first ceil(3.2) = 4 slots
    assert np.all(b.pool_class[np.arange(512), b.oracle_pos] == 1)
    assert np.all(b.pool_clause[np.arange(512), b.oracle_pos] == b.path)
    for i in range(0, 512, 5):
        _check_names(b, i, 4)
    assert not np.isin(b.answer, GRAPH.names).any()               # renamed
    _check_tokens_and_mask(b, range(0, 512, 31))


# --- jit, determinism, buckets ------------------------------------------------------------------

def test_jit_same_key_same_batch_and_step_stream():
    a = _np(H.sample_jit(jax.random.PRNGKey(0), RCFG, GRAPH, 1, 32))
    ref = _batch(RCFG, 1, 32)
    assert all(np.array_equal(x, y) for x, y in zip(a, ref))
    c = _np(H.sample_jit(jax.random.PRNGKey(1), RCFG, GRAPH, 1, 32))
    assert not np.array_equal(c.inputs, ref.inputs)
    s1, s2 = _np(H.batch_for_step(RCFG, GRAPH, 3, 17)), _np(H.batch_for_step(RCFG, GRAPH, 3, 17))
    direct = _np(H.sample_jit(step_key(3, 17), RCFG, GRAPH, 1, 32))
    assert all(np.array_equal(x, y) and np.array_equal(x, z) for x, y, z in zip(s1, s2, direct))
    assert not np.array_equal(_np(H.batch_for_step(RCFG, GRAPH, 3, 18)).inputs, s1.inputs)


@pytest.mark.parametrize("cfg", [H.HornCfg(), H.HornCfg(regime="lengen"), H.HornCfg(k_min=3, k_max=29, n_buckets=5),
                                 H.HornCfg(regime="lengen", n_buckets=20), H.HornCfg(k_min=7, k_max=7)])
def test_cfg_k_buckets_cover_k_range(cfg):
    """HornCfg.k_buckets: length_buckets.equal_buckets over {k_min..k_max}, n_buckets capped at the number
    of values (the marginal and the step draw are tested in test_length_buckets)."""
    buckets = cfg.k_buckets()
    values = list(range(cfg.k_min, cfg.k_upper + 1))
    assert [k for lo, hi in buckets for k in range(lo, hi + 1)] == values   # contiguous, disjoint, covering
    assert len(buckets) == min(cfg.n_buckets, len(values))
    assert buckets == lb.equal_buckets(cfg.k_min, cfg.k_upper, len(buckets))
    if cfg == H.HornCfg():
        assert buckets == ((1, 8), (9, 16), (17, 24), (25, 32))


def test_batch_for_step_pads_to_the_step_bucket():
    cfg = H.HornCfg(regime="lengen", batch=8, n_buckets=2)   # k in {1..8}: buckets (1, 4), (5, 8)
    step = next(s for s in range(100) if lb.bucket_for_step(cfg.k_buckets(), 3, s) == (1, 4))
    b = _np(H.batch_for_step(cfg, GRAPH, 3, step))
    assert b.inputs.shape == (8, H.seq_len(4) - 1) and 1 <= b.k.min() and b.k.max() <= 4
    direct = _np(H.sample_jit(step_key(3, step), cfg, GRAPH, 1, 4))
    assert all(np.array_equal(x, y) for x, y in zip(b, direct))


# --- metrics -------------------------------------------------------------------------------------

def _logits_emitting(b, names):
    """Logits whose argmax is the target sequence except the 4 name digits, set to `names` (-1: a letter)."""
    tg = b.targets.copy()
    for i, nm in enumerate(names):
        digits = [H.CHAR0 + int(d) for d in f"{nm:04d}"] if nm >= 0 else [H.CHAR0 + 10] * 4
        tg[i, b.target_pos[i]: b.target_pos[i] + 4] = digits
    return jax.nn.one_hot(tg, H.VOCAB_SIZE)


_acc = jax.jit(H.accuracy, static_argnums=(2, 3))


def test_metrics_from_logits():
    b = _batch(RCFG, 1, 32)
    jb = H.HornBatch(*map(jnp.asarray, b))
    perfect = _logits_emitting(b, b.answer)
    assert np.array_equal(H.emitted_names(perfect, jb), b.answer)
    assert float(_acc(perfect, jb, GRAPH, "class1")) == 1.0 == float(_acc(perfect, jb, GRAPH, "answer"))
    # a name of a non-class-1 pool clause, a letter instead of digits, and a static name not in context
    wrong = [b.pool_name[i, np.flatnonzero(b.pool_class[i] > 1)[0]] if (b.pool_class[i] > 1).any() else -1
             for i in range(len(b.k))]
    assert float(_acc(_logits_emitting(b, wrong), jb, GRAPH, "class1")) == 0.0
    assert np.all(np.asarray(H.emitted_names(_logits_emitting(b, [-1] * len(b.k)), jb)) == -1)
    # another class-1 clause in the pool also counts (multiple correct paths): mark position j as class 1
    i = int(np.argmax(b.k >= 2))
    j = (int(b.oracle_pos[i]) + 1) % int(b.k[i])
    two = jb._replace(pool_class=jb.pool_class.at[i, j].set(1))
    emit = np.asarray(b.answer).copy()
    emit[i] = b.pool_name[i, j]
    ok = np.asarray(hr.correct(jnp.asarray(emit), two, GRAPH, "class1"))
    assert ok.all() and not np.asarray(hr.correct(jnp.asarray(emit), jb, GRAPH, "class1"))[i]

    nb = _eval(RCFG, "no_oracle", H.PROBE_K, 256)
    jn = H.HornBatch(*map(jnp.asarray, nb))
    assert hr.RULES["no_oracle"] == "static_class1"
    assert float(_acc(_logits_emitting(nb, nb.answer), jn, GRAPH, "static_class1")) == 1.0  # recalled static name
    assert float(_acc(_logits_emitting(nb, nb.answer), jn, GRAPH, "class1")) == 0.0         # not in the context
    assert float(_acc(_logits_emitting(nb, nb.pool_name[:, 0]), jn, GRAPH, "static_class1")) == 0.0

    rb = _eval(RCFG, "rand_name", H.PROBE_K, 512)
    jr = H.HornBatch(*map(jnp.asarray, rb))
    assert float(_acc(_logits_emitting(rb, rb.answer), jr, GRAPH, "answer")) == 1.0
    memoriser = GRAPH.names[0, rb.path]                          # the oracle's static name, not its fresh one
    assert float(_acc(_logits_emitting(rb, memoriser), jr, GRAPH, "answer")) == 0.0
    assert float(_acc(_logits_emitting(rb, memoriser), jr, GRAPH, "static_class1")) == 1.0
