"""Small synthetic next-token tasks for the training framework: made on device, reproducible.

Every sampler is `sample(key, cfg) -> LMBatch` and jittable; the loop calls it with
`step_key(seed, k)`, so the batch of step k depends only on (seed, k) and a resumed run sees
exactly the batches of an uninterrupted one. Loss and accuracy are taken where `mask` is 1.

- `copy`: `BOS s_1 .. s_m SEP s_1 .. s_m` with s iid uniform; the second copy is scored. Solving
  it needs a memory of m tokens across m + 1 steps.
- `recall` (associative recall): `BOS k_1 v_1 .. k_n v_n SEP k_q v_q` with distinct keys; the
  value after the query key is scored. A strong gate forgets early pairs, a weak one keeps them.

Token ids: 0 = PAD, 1 = BOS, 2 = SEP, content tokens 3 .. vocab_size - 1.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

PAD, BOS, SEP = 0, 1, 2
N_SPECIAL = 3
TASKS = ("copy", "recall")


class LMBatch(NamedTuple):
    inputs: jax.Array   # (b, t) int32
    targets: jax.Array  # (b, t) int32: inputs shifted left by one
    mask: jax.Array     # (b, t) float32: 1 where the prediction is scored

    @classmethod
    def shapes(cls, b: int, t: int) -> "LMBatch":
        """A batch of b rows of t tokens as jax.ShapeDtypeStructs (what a compile-only step takes)."""
        tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
        return cls(tokens, tokens, jax.ShapeDtypeStruct((b, t), jnp.float32))


@dataclasses.dataclass(frozen=True)
class SyntheticCfg:
    task: str = "copy"
    batch: int = 32
    seq_len: int = 64     # model input length t; the task fills it exactly
    vocab_size: int = 32

    @property
    def n_content(self) -> int:
        return self.vocab_size - N_SPECIAL

    def validate(self) -> "SyntheticCfg":
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r}: expected one of {TASKS}")
        if self.batch < 1:
            raise ValueError(f"batch={self.batch}: expected >= 1")
        if self.seq_len < 5:
            raise ValueError(f"seq_len={self.seq_len}: expected >= 5")
        if self.task == "recall" and self.seq_len % 2 == 0:
            raise ValueError(f"seq_len={self.seq_len}: recall needs an odd input length (BOS, pairs, SEP, key)")
        if self.n_content < 2:
            raise ValueError(f"vocab_size={self.vocab_size}: expected >= {N_SPECIAL + 2}")
        if self.task == "recall" and self.n_pairs > self.n_content:
            raise ValueError(f"recall with seq_len={self.seq_len} has {self.n_pairs} pairs of distinct keys; "
                             f"vocab_size={self.vocab_size} gives only {self.n_content} keys")
        return self

    @property
    def n_pairs(self) -> int:
        return (self.seq_len - 3) // 2


def step_key(seed: int, step) -> jax.Array:
    """The data key of step `step` of a run seeded `seed` (a function of the two only)."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), step)


def _shifted(seq_btl, score_btl) -> LMBatch:
    inputs, targets = seq_btl[:, :-1], seq_btl[:, 1:]
    return LMBatch(inputs.astype(jnp.int32), targets.astype(jnp.int32), score_btl[:, 1:].astype(jnp.float32))


def _pad_to(arr_bl, length: int, value=PAD):
    return jnp.pad(arr_bl, ((0, 0), (0, length - arr_bl.shape[1])), constant_values=value)


def sample_copy(key, cfg: SyntheticCfg) -> LMBatch:
    m = (cfg.seq_len - 1) // 2
    s = jax.random.randint(key, (cfg.batch, m), N_SPECIAL, cfg.vocab_size)
    col = lambda v: jnp.full((cfg.batch, 1), v)
    seq = jnp.concatenate([col(BOS), s, col(SEP), s], axis=1)  # 2m + 2 tokens; an even t leaves one PAD
    score = jnp.concatenate([jnp.zeros((cfg.batch, m + 2)), jnp.ones((cfg.batch, m))], axis=1)
    return _shifted(_pad_to(seq, cfg.seq_len + 1), _pad_to(score, cfg.seq_len + 1, 0.0))


def sample_recall(key, cfg: SyntheticCfg) -> LMBatch:
    n = cfg.n_pairs
    k_keys, k_vals, k_q = jax.random.split(key, 3)
    perm = jax.vmap(lambda k: jax.random.permutation(k, cfg.n_content)[:n])(jax.random.split(k_keys, cfg.batch))
    keys = perm + N_SPECIAL
    vals = jax.random.randint(k_vals, (cfg.batch, n), N_SPECIAL, cfg.vocab_size)
    q = jax.random.randint(k_q, (cfg.batch,), 0, n)
    take = lambda a: jnp.take_along_axis(a, q[:, None], axis=1)
    pairs = jnp.stack([keys, vals], axis=2).reshape(cfg.batch, 2 * n)
    col = lambda v: jnp.full((cfg.batch, 1), v)
    seq = jnp.concatenate([col(BOS), pairs, col(SEP), take(keys), take(vals)], axis=1)  # 2n + 4 = seq_len + 1
    score = jnp.zeros(seq.shape).at[:, -1].set(1.0)
    return _shifted(seq, score)


SAMPLERS = {"copy": sample_copy, "recall": sample_recall}


def sample(key, cfg: SyntheticCfg) -> LMBatch:
    return SAMPLERS[cfg.task](key, cfg)


def lm_loss(logits_btv, batch: LMBatch):
    """Masked mean cross-entropy (float32) and metrics: token accuracy on scored positions and
    sequence accuracy (every scored token of a row correct)."""
    logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
    n = jnp.maximum(batch.mask.sum(), 1.0)
    loss = (nll * batch.mask).sum() / n
    correct = (jnp.argmax(logits_btv, axis=-1) == batch.targets).astype(jnp.float32)
    token_acc = (correct * batch.mask).sum() / n
    row_ok = jnp.all((correct > 0) | (batch.mask == 0), axis=1)
    return loss, {"accuracy": token_acc, "seq_accuracy": row_ok.mean()}
