"""P1 multi-token key-value retrieval (protocol §3.1, check C11 of §9).

A static dictionary of `dict_size` (key, value) pairs, each key and value m content tokens, is drawn
once per run from `dict_seed`. An example holds n distinct dictionary pairs (sampled order, without
replacement), every value token perturbed independently with prob eps to one of the other
n_content - 1 content tokens, then queries on n_q = max(1, ceil(q n)) of its keys: the first n_q
context positions (best_first) or the last n_q (best_last), presented in a random order. The target
is the in-context (perturbed) value, so memorising the dictionary scores (1 - eps)^m = 0.4305 per
query while copying from the context scores 1.

Token ids (protocol §3.1 [REC]; vocab_size = 5 + n_content = 69, padded_vocab = 72 for n_content = 64):

| id                | token                  |
|-------------------|------------------------|
| 0                 | PAD (after the end)    |
| 1                 | BOS                    |
| 2                 | ':' key/value          |
| 3                 | ',' end of a pair      |
| 4                 | '|' context/queries    |
| 5 .. 4+n_content  | content tokens         |

Sequence: `BOS [k_1 : v_1 ,] .. [k_n : v_n ,] | [kq_1 : vq_1 ,] .. [kq_nq : vq_nq ,] PAD ..`, where each
bracket is a block of W = 2m + 2 tokens (m key tokens, ':', m value tokens, ','), so a sequence has
L(n, n_q) = 2 + W (n + n_q) tokens (10,154 at n = 512, m = 8). A batch drawn with n in {n_lo..n_hi} is
right-padded to the static L(n_hi, n_q(n_hi)) and framed causally (inputs = seq[:-1], targets = seq[1:]);
`mask` is 1 exactly on the m predictions of each query block's value tokens (teacher forcing).

Training (protocol §3.1: n ~ U{1..N}) uses `length_buckets`: bounds = `length_buckets.equal_buckets(1, N,
n_buckets)` cut 1..N into contiguous ranges, `batch_for_step` draws the bucket of step k on the host from
(seed, k, BUCKET_SALT) with probability = its share of U{1..N}, and `sample` draws n uniformly inside it,
so every example's n is exactly U{1..N} while padding stays within the bucket. `sample_eval` fixes n
(in-distribution eval n = 512).
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.tasks import length_buckets as lb
from ssmgate.tasks.synthetic_lm import step_key

PAD, BOS, COLON, COMMA, BAR = 0, 1, 2, 3, 4
N_SPECIAL = 5
QUERIES = ("best_first", "best_last")
Q_MAX_DENOMINATOR = 1000  # q is used as an exact fraction a/b (b <= 1000) so ceil(q n) has no float error
BUCKET_SALT = 0x6B76      # length_buckets.bucket_for_step salt: independent of other host draws from (seed, step)


class KVBatch(NamedTuple):
    """LMBatch fields plus per-query diagnostics; every array has the batch axis first.

    Q = n_q(n_hi) query slots, the first n_q of each row are used (in presentation order)."""
    inputs: jax.Array           # (b, T) int32, T = L(n_hi, Q) - 1
    targets: jax.Array          # (b, T) int32
    mask: jax.Array             # (b, T) float32: 1 on the value-token predictions of query blocks
    n: jax.Array                # (b,) int32 pairs in the context
    n_q: jax.Array              # (b,) int32 queries
    query_mask: jax.Array       # (b, Q) float32: 1 for the row's first n_q slots
    query_pos: jax.Array        # (b, Q) int32: 0-based context position of the queried pair, -1 if unused
    query_start: jax.Array      # (b, Q) int32: target index of the query's first value token, 0 if unused
    query_perturbed: jax.Array  # (b, Q) bool: the queried value has >= 1 perturbed token


@dataclasses.dataclass(frozen=True)
class KVCfg:
    n_content: int = 64
    m: int = 8              # tokens per key and per value
    dict_size: int = 10_000
    n_max: int = 512        # N: training draws n ~ U{1..N}
    eps: float = 0.1        # per-token perturbation probability of in-context values
    q: float = 0.1          # query ratio: n_q = max(1, ceil(q n))
    query: str = "best_first"
    batch: int = 128
    dict_seed: int = 0      # the static dictionary's seed, independent of the batch keys

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + self.n_content

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab_size // 8) * 8  # embedding tables in multiples of 8 (69 -> 72)

    @property
    def block(self) -> int:
        return 2 * self.m + 2

    def q_fraction(self) -> Fraction:
        return Fraction(self.q).limit_denominator(Q_MAX_DENOMINATOR)

    def validate(self) -> "KVCfg":
        for name in ("n_content", "m", "dict_size", "n_max", "batch", "dict_seed"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ValueError(f"{name}={v!r}: expected an int")
        for name in ("m", "n_max", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
        if self.n_content < 2:
            raise ValueError(f"n_content={self.n_content}: expected >= 2 (a perturbation needs another token)")
        if self.dict_size < self.n_max:
            raise ValueError(f"dict_size={self.dict_size}: expected >= n_max = {self.n_max} "
                             "(pairs are drawn without replacement)")
        if self.dict_size > self.n_content ** self.m:
            raise ValueError(f"dict_size={self.dict_size}: expected <= n_content**m = {self.n_content ** self.m} "
                             "distinct keys")
        if self.dict_seed < 0:
            raise ValueError(f"dict_seed={self.dict_seed}: expected >= 0")
        if not 0.0 <= self.eps <= 1.0:
            raise ValueError(f"eps={self.eps!r}: expected a probability in [0, 1]")
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"q={self.q!r}: expected a query ratio in (0, 1]")
        if abs(float(self.q_fraction()) - self.q) > 1e-12:
            raise ValueError(f"q={self.q!r}: expected a fraction with denominator <= {Q_MAX_DENOMINATOR} "
                             "(e.g. 0.1, 0.125, 1/3)")
        if self.query not in QUERIES:
            raise ValueError(f"query={self.query!r}: expected one of {QUERIES}")
        return self


def n_queries(cfg: KVCfg, n):
    """n_q = max(1, ceil(q n)) in exact integer arithmetic (0.1 * 30 is 3.0000000000000004 in floats).
    Python int in, python int out; arrays in, int32 arrays out (jittable)."""
    f = cfg.q_fraction()
    if isinstance(n, (int, np.integer)):
        return max(1, -(-f.numerator * int(n) // f.denominator))
    n = jnp.asarray(n, jnp.int32)
    return jnp.maximum(1, (f.numerator * n + f.denominator - 1) // f.denominator).astype(jnp.int32)


def seq_len(cfg: KVCfg, n_hi: int) -> int:
    """Static padded sequence length L(n_hi, n_q(n_hi)); the arrays of a batch are (b, seq_len - 1)."""
    return 2 + cfg.block * (n_hi + n_queries(cfg, n_hi))


def make_dictionary(cfg: KVCfg):
    """The static dictionary from cfg.dict_seed: keys, values (dict_size, m) int32 content token ids,
    tokens iid uniform; keys conditioned on being distinct (duplicate rows are redrawn)."""
    cfg.validate()
    rng = np.random.default_rng(cfg.dict_seed)
    lo, hi, shape = N_SPECIAL, N_SPECIAL + cfg.n_content, (cfg.dict_size, cfg.m)
    keys = rng.integers(lo, hi, shape)
    while True:
        _, first = np.unique(keys, axis=0, return_index=True)
        dup = np.setdiff1d(np.arange(cfg.dict_size), first)
        if dup.size == 0:
            break
        keys[dup] = rng.integers(lo, hi, (dup.size, cfg.m))
    values = rng.integers(lo, hi, shape)
    return keys.astype(np.int32), values.astype(np.int32)


def _check_range(cfg: KVCfg, n_lo, n_hi) -> None:
    for name, v in (("n_lo", n_lo), ("n_hi", n_hi)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise ValueError(f"{name}={v!r}: expected a static python int")
    if not 1 <= n_lo <= n_hi <= cfg.dict_size:
        raise ValueError(f"(n_lo, n_hi)=({n_lo}, {n_hi}): expected 1 <= n_lo <= n_hi <= dict_size = {cfg.dict_size}")


def _ordered_subset(key, b: int, D: int, k: int):
    """(b, k) int32: per row k distinct indices of 0..D-1 in uniformly random order (the top k of D iid
    random keys; ~10x cheaper than a permutation on CPU). Keys are 30 random bits + 2**23 read as float32:
    normal, finite and ordered like the bits; a tie among the chosen (P ~ k D / 2**31, 2e-3 at k = 512,
    D = 10**4) only fixes the relative order of two tied entries (or which one is chosen at the k-th)."""
    bits = (jax.random.bits(key, (b, D), jnp.uint32) >> 2) + jnp.uint32(1 << 23)
    return jax.lax.top_k(jax.lax.bitcast_convert_type(bits, jnp.float32), k)[1].astype(jnp.int32)


def sample(key, cfg: KVCfg, dictionary, n_lo: int, n_hi: int) -> KVBatch:
    """cfg.batch examples with n ~ U{n_lo..n_hi} each, padded to seq_len(cfg, n_hi). Jittable with
    cfg, n_lo, n_hi static (`jax.jit(sample, static_argnums=(1, 3, 4))`); dictionary may be traced."""
    cfg.validate()
    _check_range(cfg, n_lo, n_hi)
    keys_dm, vals_dm = (jnp.asarray(a, jnp.int32) for a in dictionary)
    b, m, W, C = cfg.batch, cfg.m, cfg.block, cfg.n_content
    Q = n_queries(cfg, n_hi)
    k_n, k_idx, k_flip, k_shift, k_order = jax.random.split(key, 5)
    n_b = jax.random.randint(k_n, (b,), n_lo, n_hi + 1, jnp.int32)
    nq_b = n_queries(cfg, n_b)
    # The first n of a uniform ordered n_hi-subset is a uniform ordered n-subset: pairs without replacement.
    idx = _ordered_subset(k_idx, b, keys_dm.shape[0], n_hi)
    ctx_k, clean_v = keys_dm[idx], vals_dm[idx]                       # (b, n_hi, m)
    flip = jax.random.bernoulli(k_flip, cfg.eps, (b, n_hi, m))
    # A shift in 1..C-1 mod C always changes the token and is uniform over the other C - 1.
    shift = jax.random.randint(k_shift, (b, n_hi, m), 1, C, jnp.int32)
    ctx_v = jnp.where(flip, (clean_v - N_SPECIAL + shift) % C + N_SPECIAL, clean_v)

    # Random order of the n_q queried positions: the entries < n_q of a uniform permutation of 0..Q-1,
    # kept in their order (a stable sort moves them to the front), are a uniform order of 0..n_q-1.
    perm = jax.vmap(lambda k: jax.random.permutation(k, Q))(jax.random.split(k_order, b)).astype(jnp.int32)
    order = jnp.take_along_axis(perm, jnp.argsort((perm >= nq_b[:, None]).astype(jnp.int32), axis=1,
                                                  stable=True), axis=1)
    valid = jnp.arange(Q)[None, :] < nq_b[:, None]
    offset = jnp.zeros_like(n_b) if cfg.query == "best_first" else n_b - nq_b
    qpos = jnp.where(valid, offset[:, None] + order, 0)
    gather = lambda a: jnp.take_along_axis(a, qpos[:, :, None], axis=1)
    q_pert = jnp.any(gather(flip), axis=-1) & valid

    def blocks(k_, v_):  # (b, j, m) keys and values -> (b, j * W) tokens `k : v ,`
        col = lambda tok: jnp.full(k_.shape[:2] + (1,), tok, jnp.int32)
        return jnp.concatenate([k_, col(COLON), v_, col(COMMA)], axis=-1).reshape(b, -1)

    col = lambda tok: jnp.full((b, 1), tok, jnp.int32)
    source = jnp.concatenate([col(BOS), blocks(ctx_k, ctx_v), col(BAR),
                              blocks(gather(ctx_k), gather(ctx_v)), col(PAD)], axis=1)
    L = seq_len(cfg, n_hi)
    t = jnp.arange(L, dtype=jnp.int32)[None, :]
    ctx_end, q_lo = W * n_b[:, None], W * n_b[:, None] + 2       # last context token; first query token
    q_hi = q_lo + W * nq_b[:, None]
    src = jnp.where(t <= ctx_end, t,
                    jnp.where(t == ctx_end + 1, 1 + W * n_hi,
                              jnp.where(t < q_hi, t - q_lo + 2 + W * n_hi, L)))
    seq = jnp.take_along_axis(source, src, axis=1)
    in_block = (t - q_lo) % W
    score = (t >= q_lo) & (t < q_hi) & (in_block > m) & (in_block <= 2 * m)
    q_start = jnp.where(valid, q_lo + W * jnp.arange(Q)[None, :] + m, 0)
    return KVBatch(seq[:, :-1], seq[:, 1:], score[:, 1:].astype(jnp.float32), n_b, nq_b,
                   valid.astype(jnp.float32), jnp.where(valid, qpos, -1).astype(jnp.int32),
                   q_start.astype(jnp.int32), q_pert)


def sample_eval(key, cfg: KVCfg, dictionary, n: int) -> KVBatch:
    """cfg.batch examples with exactly n pairs (protocol §3.4: n = 512 in distribution, up to 2048 for 2c)."""
    return sample(key, cfg, dictionary, n, n)


sample_jit = jax.jit(sample, static_argnums=(1, 3, 4))  # one compile per (cfg, n_lo, n_hi)


def batch_for_step(cfg: KVCfg, dictionary, seed: int, step: int, bounds) -> KVBatch:
    """The training batch of step `step`: bucket from (seed, step) (`length_buckets.bucket_for_step`,
    salt BUCKET_SALT), then n ~ U(bucket) per example, so n ~ U{1..cfg.n_max} marginally. bounds:
    contiguous (n_lo, n_hi) ranges covering 1..cfg.n_max, e.g. `length_buckets.equal_buckets(1, cfg.n_max,
    n_buckets)`. Compiles once per bucket; pass the dictionary as device arrays (jnp.asarray) so it is
    not copied to the device at every step."""
    lo, hi = lb.bucket_for_step(lb.check_bounds(bounds, 1, cfg.n_max), seed, step, salt=BUCKET_SALT)
    return sample_jit(step_key(seed, step), cfg, dictionary, lo, hi)


def query_correct(pred_bt, batch: KVBatch):
    """(b, Q) bool: the query is used and every scored token of its value is predicted. Query j's scored
    tokens are the masked ones from its query_start up to the next query's (or the end of the row)."""
    wrong = ((pred_bt != batch.targets) & (batch.mask > 0)).astype(jnp.int32)
    cw = jnp.pad(jnp.cumsum(wrong, axis=1), ((0, 0), (1, 0)))      # cw[:, t] = errors before t
    valid = batch.query_mask > 0
    T = wrong.shape[1]
    nxt_valid = jnp.pad(valid[:, 1:], ((0, 0), (0, 1)))
    end = jnp.where(nxt_valid, jnp.pad(batch.query_start[:, 1:], ((0, 0), (0, 1))), T)
    errs = jnp.take_along_axis(cw, end, axis=1) - jnp.take_along_axis(cw, batch.query_start, axis=1)
    return (errs == 0) & valid


def prediction_accuracy(pred_bt, batch: KVBatch) -> dict:
    """Sequence accuracy (protocol §3.1) of predicted tokens (b, T): mean over all queries of the batch, and
    over queries with >= 1 perturbed value token / clean ones (nan if none); counts for exact pooling."""
    ok = query_correct(pred_bt, batch)
    valid = batch.query_mask > 0
    pert, clean = valid & batch.query_perturbed, valid & ~batch.query_perturbed
    acc = lambda sel: jnp.where(sel.sum() > 0, (ok & sel).sum() / jnp.maximum(sel.sum(), 1), jnp.nan)
    return {"seq_accuracy": acc(valid), "seq_accuracy_perturbed": acc(pert), "seq_accuracy_clean": acc(clean),
            "n_queries": valid.sum(), "n_perturbed": pert.sum(), "n_clean": clean.sum()}


def sequence_accuracy(logits_btv, batch: KVBatch) -> dict:
    """`prediction_accuracy` of the argmax (≡ greedy decoding under teacher forcing). Jittable."""
    return prediction_accuracy(jnp.argmax(logits_btv, axis=-1), batch)


# --- reference solvers for check C11 (host-side numpy) ------------------------------------------------

def _codes(tokens_xm, cfg: KVCfg) -> np.ndarray:
    """A key's m tokens as one int64 base-n_content number."""
    return ((tokens_xm.astype(np.int64) - N_SPECIAL) * cfg.n_content ** np.arange(cfg.m, dtype=np.int64)).sum(-1)


def _query_keys(batch: KVBatch, cfg: KVCfg):
    """(b, Q, m) queried key tokens: the m inputs before ':' = inputs[query_start] (junk for unused slots)."""
    inputs, start = np.asarray(batch.inputs), np.maximum(np.asarray(batch.query_start), cfg.m)
    return np.take_along_axis(inputs[:, None, :], (start - cfg.m)[..., None] + np.arange(cfg.m), axis=2)


def _predict(batch: KVBatch, cfg: KVCfg, values_bqm) -> np.ndarray:
    """Predictions (b, T): values_bqm in the value slots of the used queries, PAD elsewhere."""
    pred = np.zeros(np.shape(batch.targets), np.int32)
    valid = np.asarray(batch.query_mask) > 0
    r, j = np.nonzero(valid)
    cols = np.asarray(batch.query_start)[r, j][:, None] + np.arange(cfg.m)
    pred[r[:, None], cols] = values_bqm[r, j]
    return pred


def memoriser_predictions(batch: KVBatch, cfg: KVCfg, dictionary) -> np.ndarray:
    """Reads each queried key from the tokens and predicts its static dictionary value (PAD if unknown):
    a pure memoriser, expected sequence accuracy (1 - eps)^m."""
    keys, values = (np.asarray(a) for a in dictionary)
    codes = _codes(keys, cfg)
    order = np.argsort(codes)
    qc = _codes(_query_keys(batch, cfg), cfg)
    at = np.clip(np.searchsorted(codes[order], qc), 0, len(codes) - 1)
    hit = codes[order][at] == qc
    return _predict(batch, cfg, np.where(hit[..., None], values[order][at], PAD))


def copier_predictions(batch: KVBatch, cfg: KVCfg) -> np.ndarray:
    """Finds each queried key among the row's context keys (by tokens) and predicts the value written
    after it there (PAD if absent): perfect retrieval, expected sequence accuracy 1."""
    inputs, n = np.asarray(batch.inputs), np.asarray(batch.n)
    b, W, base = inputs.shape[0], cfg.block, cfg.n_content ** cfg.m
    if (b + 1) * base >= 2 ** 62:
        raise ValueError(f"n_content**m = {base} with batch {b}: row-offset key codes overflow int64")
    n_ctx = int(n.max())
    pos = 1 + W * np.arange(n_ctx)[:, None] + np.arange(cfg.m)               # (n_ctx, m) key token positions
    ctx_keys = inputs[:, pos]                                                # (b, n_ctx, m)
    ctx_vals = inputs[:, pos + cfg.m + 1]
    used = np.arange(n_ctx)[None, :] < n[:, None]
    rows = np.arange(b, dtype=np.int64)[:, None] * base
    cc = np.where(used, _codes(ctx_keys, cfg) + rows, -1).ravel()
    order = np.argsort(cc)
    qc = (_codes(_query_keys(batch, cfg), cfg) + rows).ravel()
    at = np.clip(np.searchsorted(cc[order], qc), 0, cc.size - 1)
    hit = (cc[order][at] == qc).reshape(b, -1)
    found = ctx_vals.reshape(b * n_ctx, cfg.m)[order[at]].reshape(b, -1, cfg.m)
    return _predict(batch, cfg, np.where(hit[..., None], found, PAD))


def one_hot_logits(pred_bt, cfg: KVCfg):
    """Logits (b, T, padded_vocab) whose argmax is pred_bt: turns a reference solver into a 'model'."""
    return jax.nn.one_hot(jnp.asarray(pred_bt), cfg.padded_vocab, dtype=jnp.float32)
