"""P1 Horn-clause rule retrieval (protocol §4): rule graph, episodes, pools, prompts and metrics.

Rule graph (protocol §4.1; numpy, built once from `graph_seed`): 3 sets S1, S2, S3 of `props_per_set`
propositions `r_` + 4 chars of [0-9a-z] (globally unique); between S1-S2 (layer 1) and S2-S3 (layer 2)
K distinct single-premise clauses A -> B each, every clause with a unique static 4-digit name.
An episode is a 2-step path P -> B -> Q (the protocol's recipe: c1 uniform among layer-1 clauses whose output
has an outgoing layer-2 clause, then c2 uniform among B's); turn 1 asks from (P, Q) over layer 1,
turn 2 from (B, Q) over layer 2; they are separate examples. Classes for a state (current, goal):
1 applicable and goal reachable from the output, 2 applicable only, 3 reachable only, 4 neither
(turn 2: reachable means output == goal). An oracle is a class-1 clause.

Pools (protocol §4.4, §4.5), k clauses of the current layer, by `kind`:
- retrieval: random order, the episode's own path clause (the oracle) injected at a uniform position,
  the other k - 1 uniform without replacement; the first ceil(q k) positions get fresh names.
- lengen: PL ranking (beta, `horn_ranking`), top k in reverse rank order (best next to the query);
  all names fresh. The target is the best-ranked class-1 clause; a pool without one (finite beta
  only) has an all-zero loss mask.
- no_oracle (probe): random order, every class-1 clause excluded, static names; the target is the
  path clause's static name (it is not in the context).
- rand_name (probe): like retrieval, but the oracle is the only class-1 clause in the pool and sits
  at a uniform position among the first ceil(q k) (fresh-named) ones.
Fresh names are distinct, uniform over the 4-digit names that are no clause's static name.

Tokens (character level, protocol §4.2 REC; VOCAB_SIZE = 45):
  0 <PAD>, 1 <START>, 2 <EOS>, 3..12 '0'..'9', 13..38 'a'..'z', 39 '_', 40 '-', 41 '>', 42 ':',
  43 '|', 44 ','.
Example with k pool clauses (20 k + 19 tokens), right-padded with <PAD> to the bucket's k_hi:
  `dddd:r_abcd->r_efgh|` x k (20 tokens each)  `r_abcd,r_efgh<START>` (14)  `dddd<EOS>` (5)
Model arrays are causal: inputs = seq[:-1], targets = seq[1:], both (b, 20 k_hi + 18); the mask is 1
on the 5 target tokens (name + <EOS>), targets indices 20 k + 13 .. 20 k + 17. Trailing padding
never influences a scored position of a causal model.

Metrics (protocol §4.5) read the greedy name at the 4 digit positions (`emitted_names`, -1 if not all
digits) and score it by `horn_ranking.RULES[kind]`: class1 (first-turn accuracy: the name resolves,
through the names shown in this example's context, to a class-1 clause), static_class1 (no-oracle
probe: the static name of any class-1 clause of the layer) or answer (rand-name probe: the oracle's
fresh name).

Sampling is jittable with (cfg, graph, k_lo, k_hi) static: `sample(key, cfg, graph, k_lo, k_hi)`.
Training draws k per example from one length bucket (a contiguous k range, `HornCfg.k_buckets`);
`batch_for_step` picks the bucket on the host from (seed, step) with `length_buckets.bucket_for_step`
(v ~ U{k_min..k_max}, then v's bucket), so each example's k is exactly uniform on {k_min..k_max} while
a batch pads only to its bucket's top.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.tasks import horn_ranking as hr
from ssmgate.tasks import length_buckets as lb
from ssmgate.tasks.synthetic_lm import LMBatch, step_key

REGIMES = ("retrieval", "lengen")
KINDS = ("retrieval", "lengen", "no_oracle", "rand_name")
TURNS = ("both", "first", "second")
LENGEN_KS = (1, 2, 4, 8, 16, 32, 64, 128)   # protocol §4.5 REC
PROBE_K = 32                                # protocol §4.5 REC
DEFAULT_K_MAX = {"retrieval": 32, "lengen": 8}
N_NAMES = 10_000                            # 4-digit names 0000..9999

# --- tokens -----------------------------------------------------------------------------------
PAD, START, EOS = 0, 1, 2
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz_->:|,"
CHAR0 = 3                                   # token of CHARS[i] is CHAR0 + i; digit d is CHAR0 + d
VOCAB_SIZE = CHAR0 + len(CHARS)
SPECIALS = {PAD: "<PAD>", START: "<START>", EOS: "<EOS>"}
UNDERSCORE, DASH, GT, COLON, BAR, COMMA = (CHAR0 + CHARS.index(c) for c in "_->:|,")
ITEM_LEN, QUERY_LEN, TARGET_LEN = 20, 14, 5
TAIL_LEN = QUERY_LEN + TARGET_LEN


def seq_len(k: int) -> int:
    """Tokens of an example with k pool clauses (model arrays are one shorter)."""
    return ITEM_LEN * k + TAIL_LEN


def encode(text: str) -> np.ndarray:
    """int32 tokens of a string over CHARS and <START>/<EOS>/<PAD>."""
    out, i = [], 0
    while i < len(text):
        for tok, s in SPECIALS.items():
            if text.startswith(s, i):
                out.append(tok)
                i += len(s)
                break
        else:
            if text[i] not in CHARS:
                raise ValueError(f"text[{i}]={text[i]!r}: expected one of {CHARS!r} or {list(SPECIALS.values())}")
            out.append(CHAR0 + CHARS.index(text[i]))
            i += 1
    return np.asarray(out, np.int32)


def decode(tokens) -> str:
    return "".join(SPECIALS.get(t, CHARS[t - CHAR0] if CHAR0 <= t < VOCAB_SIZE else f"<{t}?>")
                   for t in np.asarray(tokens).tolist())


# --- configuration ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HornCfg:
    """protocol §0.2 `HornCfg` (data side). k_max None = the regime's protocol value, §4.4 (32 retrieval, 8 lengen;
    `k_upper` resolves it). beta is the PL inverse temperature of the lengen pools (inf allowed; the
    retrieval regime orders at random). turns: which turn each row asks ("both": even rows turn 1, odd
    rows turn 2, independent episodes). n_buckets: contiguous k ranges a training batch is padded within."""

    regime: str = "retrieval"
    n_sets: int = 3
    props_per_set: int = 128
    K: int = 128
    graph_seed: int = 0
    k_min: int = 1
    k_max: int | None = None
    q_fresh: float = 0.1
    beta: float = math.inf
    turns: str = "both"
    batch: int = 128
    n_buckets: int = 4

    @property
    def k_upper(self) -> int:
        return DEFAULT_K_MAX.get(self.regime, 0) if self.k_max is None else self.k_max

    def k_buckets(self) -> tuple[tuple[int, int], ...]:
        """Contiguous (k_lo, k_hi) ranges covering {k_min..k_max}: min(n_buckets, #values) of near-equal width."""
        self.validate()
        return lb.equal_buckets(self.k_min, self.k_upper, min(self.n_buckets, self.k_upper - self.k_min + 1))

    def validate(self) -> "HornCfg":
        if self.regime not in REGIMES:
            raise ValueError(f"regime={self.regime!r}: expected one of {REGIMES}")
        if self.turns not in TURNS:
            raise ValueError(f"turns={self.turns!r}: expected one of {TURNS}")
        for name in ("n_sets", "props_per_set", "K", "graph_seed", "k_min", "batch", "n_buckets"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ValueError(f"{name}={v!r}: expected an int")
        if self.k_max is not None and (not isinstance(self.k_max, (int, np.integer)) or isinstance(self.k_max, bool)):
            raise ValueError(f"k_max={self.k_max!r}: expected an int or None")
        if self.n_sets != 3:
            raise ValueError(f"n_sets={self.n_sets}: expected 3 (episodes are 2-step paths S1 -> S2 -> S3, protocol §4.1)")
        if not 2 <= self.props_per_set <= 36**4 // 3:
            raise ValueError(f"props_per_set={self.props_per_set}: expected 2 .. {36**4 // 3} (unique r_ + 4 chars)")
        if not 1 <= self.K <= min(self.props_per_set**2, N_NAMES // 3):
            raise ValueError(f"K={self.K}: expected 1 .. {min(self.props_per_set**2, N_NAMES // 3)} (distinct "
                             f"pairs of {self.props_per_set} x {self.props_per_set} props; 4-digit names for "
                             "2K static + K fresh)")
        if self.graph_seed < 0:
            raise ValueError(f"graph_seed={self.graph_seed}: expected >= 0")
        if self.k_min < 1:
            raise ValueError(f"k_min={self.k_min}: expected >= 1")
        if not self.k_min <= self.k_upper <= self.K:
            raise ValueError(f"k_max={self.k_max}: expected k_min = {self.k_min} <= k_max <= K = {self.K}")
        if not (isinstance(self.q_fresh, (int, float)) and 0 < self.q_fresh <= 1):
            raise ValueError(f"q_fresh={self.q_fresh!r}: expected a float in (0, 1]")
        hr.check_beta(self.beta)
        if self.batch < 1:
            raise ValueError(f"batch={self.batch}: expected >= 1")
        if self.n_buckets < 1:
            raise ValueError(f"n_buckets={self.n_buckets}: expected >= 1")
        return self


def n_fresh(q_fresh: float, k: int) -> int:
    """ceil(q k), exact for q read as the decimal it prints as (in floats ceil(0.07 * 100) is 8)."""
    return math.ceil(Fraction(repr(float(q_fresh))) * k)


# --- rule graph ---------------------------------------------------------------------------------

class HornGraph:
    """The fixed rule graph (numpy). Hashed by identity: pass it to jit as a static argument.

    prop_chars (3P, 4): char indices into CHARS of prop g (set g // P); src, dst (2, K): local prop
    indices of layer l's clauses (premise in S_{l+1}, output in S_{l+2}, 1-based sets); names (2, K);
    reach (2, P, P): reach[l, out, goal] = goal (in S3) is reachable from output `out` of a layer-l
    clause; eligible1: layer-1 clauses whose output has a layer-2 clause; out2 (P, max_deg) padded
    with -1, deg2 (P,): layer-2 clauses leaving each S2 prop; fresh_pool: the non-static names.
    """

    def __init__(self, props_per_set: int, K: int, graph_seed: int):
        P = props_per_set
        rng = np.random.default_rng(graph_seed)
        codes = rng.choice(36**4, 3 * P, replace=False)
        self.P, self.K, self.graph_seed = P, K, graph_seed
        self.prop_chars = np.stack([codes // 36**(3 - j) % 36 for j in range(4)], axis=1).astype(np.int32)
        pairs = np.stack([rng.choice(P * P, K, replace=False) for _ in range(2)])
        self.src, self.dst = (pairs // P).astype(np.int32), (pairs % P).astype(np.int32)
        self.names = rng.choice(N_NAMES, 2 * K, replace=False).reshape(2, K).astype(np.int32)
        self.reach = np.zeros((2, P, P), bool)
        self.reach[0, self.src[1], self.dst[1]] = True
        self.reach[1] = np.eye(P, dtype=bool)
        self.deg2 = np.bincount(self.src[1], minlength=P).astype(np.int32)
        self.eligible1 = np.flatnonzero(self.deg2[self.dst[0]] > 0).astype(np.int32)
        if self.eligible1.size == 0:
            raise ValueError(f"graph_seed={graph_seed}: the graph (K={K}, props_per_set={P}) has no 2-step path")
        self.out2 = np.full((P, self.deg2.max()), -1, np.int32)
        for b in range(P):
            out = np.flatnonzero(self.src[1] == b)
            self.out2[b, : out.size] = out
        # Class-1 clauses of a state all leave the current prop: their count is at most the out-degree.
        self.max_out_degree = int(max(np.bincount(s, minlength=P).max() for s in self.src))
        self.fresh_pool = np.setdiff1d(np.arange(N_NAMES), self.names).astype(np.int32)
        tok = CHAR0 + self.prop_chars
        r = CHAR0 + CHARS.index("r")
        self.prop_tokens = np.concatenate([np.full((3 * P, 1), r), np.full((3 * P, 1), UNDERSCORE), tok],
                                          1).astype(np.int32)   # (3P, 6): `r_abcd`

    def prop(self, g: int) -> str:
        return "r_" + "".join(CHARS[c] for c in self.prop_chars[g])

    def clause(self, layer: int, c: int) -> str:
        """`r_abcd->r_efgh` of clause c of layer (0 or 1)."""
        a, b = layer * self.P + self.src[layer, c], (layer + 1) * self.P + self.dst[layer, c]
        return f"{self.prop(a)}->{self.prop(b)}"

    def classes(self, layer: int, current: int, goal: int) -> np.ndarray:
        """(K,) classes 1..4 of layer's clauses for local current prop and local goal (in S3)."""
        app = self.src[layer] == current
        reach = self.reach[layer, self.dst[layer], goal]
        return np.where(app, np.where(reach, 1, 2), np.where(reach, 3, 4)).astype(np.int32)


@functools.lru_cache(maxsize=16)
def _graph(props_per_set: int, K: int, graph_seed: int) -> HornGraph:
    return HornGraph(props_per_set, K, graph_seed)


def build_graph(cfg: HornCfg) -> HornGraph:
    """The graph of cfg (cached: the same cfg fields give the same object, so jit caches hit)."""
    cfg.validate()
    return _graph(cfg.props_per_set, cfg.K, cfg.graph_seed)


def _check_graph(cfg: HornCfg, graph: HornGraph) -> None:
    got, want = (graph.P, graph.K, graph.graph_seed), (cfg.props_per_set, cfg.K, cfg.graph_seed)
    if got != want:
        raise ValueError(f"graph=(props_per_set, K, graph_seed)={got}: expected {want} from cfg")


# --- batches ------------------------------------------------------------------------------------

class HornBatch(NamedTuple):
    """LMBatch fields first (lm_loss works on it; `.lm()` gives the plain LMBatch), then per-row
    metadata. Pool arrays are (b, k_hi) with -1 (class 0) at positions >= k."""
    inputs: jax.Array       # (b, t) int32, t = 20 k_hi + 18
    targets: jax.Array      # (b, t) int32
    mask: jax.Array         # (b, t) float32: 1 on the 4 name digits + <EOS>
    k: jax.Array            # (b,) pool size
    turn: jax.Array         # (b,) 1 or 2
    current: jax.Array      # (b,) global prop index
    goal: jax.Array         # (b,) global prop index (in S3)
    path: jax.Array         # (b,) the episode's clause of this layer
    pool_clause: jax.Array  # (b, k_hi) clause index in the layer
    pool_name: jax.Array    # (b, k_hi) displayed 4-digit name as an int (the example's name map)
    pool_class: jax.Array   # (b, k_hi)
    layer_class: jax.Array  # (b, K) classes of all the layer's clauses
    oracle_pos: jax.Array   # (b,) pool position of the target clause, -1 when it is not in the pool
    answer: jax.Array       # (b,) the target name (int)
    target_pos: jax.Array   # (b,) targets index of the first name digit (20 k + 13)

    def lm(self) -> LMBatch:
        return LMBatch(self.inputs, self.targets, self.mask)


def _digits(name):
    return CHAR0 + (name[..., None] // jnp.asarray([1000, 100, 10, 1], jnp.int32)) % 10


def _row(key, row, graph: HornGraph, kind: str, k_lo: int, k_hi: int, turns: str, q: float, beta: float):
    k_ep, k_k, k_pool, k_fresh = jax.random.split(key, 4)
    turn = {"first": 1, "second": 2}.get(turns, 1 + row % 2)
    layer = turn - 1
    cur, goal, path, cls = hr.episode_state(k_ep, graph, layer)
    k = jax.random.randint(k_k, (), k_lo, k_hi + 1)
    K = graph.K
    n_fr = {"lengen": k, "no_oracle": 0}.get(kind)
    if n_fr is None:
        n_fr = jnp.asarray([n_fresh(q, j) for j in range(k_hi + 1)], jnp.int32)[k]
    pool, oracle_pos = hr.build_pool(k_pool, kind, cls, path, k, k_hi, n_fr, beta)
    i = jnp.arange(k_hi)
    c = jnp.clip(pool, 0, K - 1)
    static = jnp.asarray(graph.names)[layer, c]
    if kind == "no_oracle":
        names = static
    else:
        fresh_pool = jnp.asarray(graph.fresh_pool)
        # top-k of iid keys = a uniform ordered k_hi-subset (float keys: see horn_ranking.random_order)
        _, idx = jax.lax.top_k(jax.random.uniform(k_fresh, fresh_pool.shape), k_hi)
        names = jnp.where(i < n_fr, fresh_pool[idx], static)
    names = jnp.where(i < k, names, -1)
    has = oracle_pos >= 0
    answer = jnp.where(has, names[jnp.maximum(oracle_pos, 0)], jnp.asarray(graph.names)[layer, path])
    # Tokens: k_hi fixed-width items, then the tail right after item k - 1, then PAD.
    P, ptok = graph.P, jnp.asarray(graph.prop_tokens)
    src = ptok[layer * P + jnp.asarray(graph.src)[layer, c]]
    dst = ptok[(layer + 1) * P + jnp.asarray(graph.dst)[layer, c]]
    col = lambda v: jnp.full((k_hi, 1), v, jnp.int32)
    items = jnp.concatenate([_digits(jnp.maximum(names, 0)), col(COLON), src, col(DASH), col(GT), dst, col(BAR)], 1)
    tail = jnp.concatenate([ptok[layer * P + cur], jnp.asarray([COMMA]), ptok[2 * P + goal], jnp.asarray([START]),
                            _digits(answer), jnp.asarray([EOS])])
    p = jnp.arange(seq_len(k_hi))
    n_item_tok = ITEM_LEN * k
    seq = jnp.where(p < n_item_tok, items.reshape(-1)[jnp.minimum(p, ITEM_LEN * k_hi - 1)],
                    jnp.where(p < n_item_tok + TAIL_LEN, tail[jnp.clip(p - n_item_tok, 0, TAIL_LEN - 1)], PAD))
    target_pos = n_item_tok + QUERY_LEN - 1
    t = p[:-1]
    scored = (t >= target_pos) & (t < target_pos + TARGET_LEN) & (has | (kind == "no_oracle"))
    pool_class = jnp.where(i < k, cls[c], 0)
    return HornBatch(seq[:-1], seq[1:], scored.astype(jnp.float32), k, jnp.asarray(turn), layer * P + cur, 2 * P + goal,
                     path, pool, names, pool_class, cls, oracle_pos, answer, target_pos)


def _sample(key, graph, kind, k_lo, k_hi, n, turns, q, beta) -> HornBatch:
    ints = isinstance(k_lo, (int, np.integer)) and isinstance(k_hi, (int, np.integer))
    if not (ints and 1 <= k_lo <= k_hi <= graph.K):
        raise ValueError(f"(k_lo, k_hi)=({k_lo!r}, {k_hi!r}): expected ints 1 <= k_lo <= k_hi <= K = {graph.K}")
    if kind in ("no_oracle", "rand_name") and k_hi > graph.K - graph.max_out_degree + (kind == "rand_name"):
        raise ValueError(f"k={k_hi}: the {kind} probe draws its pool from the non-class-1 clauses; expected "
                         f"k <= K - max out-degree{' + 1' if kind == 'rand_name' else ''} = "
                         f"{graph.K - graph.max_out_degree + (kind == 'rand_name')}")
    keys = jax.random.split(key, n)
    rows = jnp.arange(n, dtype=jnp.int32)
    return jax.vmap(lambda kk, r: _row(kk, r, graph, kind, k_lo, k_hi, turns, q, beta))(keys, rows)


def sample(key, cfg: HornCfg, graph: HornGraph, k_lo: int, k_hi: int) -> HornBatch:
    """A training batch of cfg.regime: cfg.batch rows, k ~ U{k_lo..k_hi} per row, padded to k_hi.
    Jittable with cfg, graph, k_lo, k_hi static (`sample_jit`)."""
    cfg.validate()
    _check_graph(cfg, graph)
    return _sample(key, graph, cfg.regime, k_lo, k_hi, cfg.batch, cfg.turns, cfg.q_fresh, cfg.beta)


def sample_eval(key, cfg: HornCfg, graph: HornGraph, kind: str, k: int, n: int) -> HornBatch:
    """n first-turn rows with pools of exactly k clauses built as `kind` (KINDS; protocol §4.5 probes:
    no_oracle and rand_name at k = PROBE_K, lengen at LENGEN_KS). Score with
    `accuracy(.., horn_ranking.RULES[kind])`."""
    cfg.validate()
    _check_graph(cfg, graph)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r}: expected an int >= 1")
    return _sample(key, graph, kind, k, k, n, "first", cfg.q_fresh, cfg.beta)


sample_jit = jax.jit(sample, static_argnums=(1, 2, 3, 4))
sample_eval_jit = jax.jit(sample_eval, static_argnums=(1, 2, 3, 4, 5))


# --- training stream ----------------------------------------------------------------------------

def batch_for_step(cfg: HornCfg, graph: HornGraph, seed: int, step: int) -> HornBatch:
    """The training batch of step `step`: a function of (seed, step) only. The bucket comes from
    `length_buckets.bucket_for_step(cfg.k_buckets(), seed, step)` (salt 0), the rows from step_key."""
    lo, hi = lb.bucket_for_step(cfg.k_buckets(), seed, step)
    return sample_jit(step_key(seed, step), cfg, graph, lo, hi)


# --- metrics -------------------------------------------------------------------------------------

def emitted_names(logits_btv, batch: HornBatch):
    """(b,) int32 greedy name at the 4 target positions; -1 if any argmax is not a digit."""
    pos = batch.target_pos[:, None] + jnp.arange(4)
    tok = jnp.take_along_axis(jnp.argmax(logits_btv, axis=-1), pos, axis=1) - CHAR0
    ok = jnp.all((tok >= 0) & (tok <= 9), axis=1)
    return jnp.where(ok, tok @ jnp.asarray([1000, 100, 10, 1]), -1).astype(jnp.int32)


def accuracy(logits_btv, batch: HornBatch, graph: HornGraph, rule: str = "class1"):
    """Mean over rows of `horn_ranking.correct` (rule: horn_ranking.RULES[kind]); jittable with graph, rule static."""
    return hr.correct(emitted_names(logits_btv, batch), batch, graph, rule).astype(jnp.float32).mean()


def example_text(graph: HornGraph, batch: HornBatch, i: int) -> str:
    """Reference serialisation of row i from its metadata (host side), e.g. for checking the tokens:
    `name:clause|...|current,goal<START>name<EOS>`."""
    b = jax.tree.map(np.asarray, batch)
    layer, k = int(b.turn[i]) - 1, int(b.k[i])
    items = "".join(f"{b.pool_name[i, j]:04d}:{graph.clause(layer, b.pool_clause[i, j])}|" for j in range(k))
    return f"{items}{graph.prop(b.current[i])},{graph.prop(b.goal[i])}<START>{int(b.answer[i]):04d}<EOS>"


def row_tokens(batch: HornBatch, i: int) -> np.ndarray:
    """Row i's whole sequence (inputs plus the last target) without the trailing padding."""
    seq = np.concatenate([np.asarray(batch.inputs[i]), np.asarray(batch.targets[i, -1:])])
    return seq[: seq_len(int(batch.k[i]))]
