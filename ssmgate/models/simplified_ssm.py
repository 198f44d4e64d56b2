"""The gating paper's simplified SSM (protocol §2.2), run by the `scalar_decay` core.

    h = x~_q + sum_{t=1..ell} exp(a (ell - t + 1)) (x~_q . x~_t) x~_t,   a = -exp(lambda),   f = w^T h

with tokens x~_t = (x_t, y~_t) in R^{d+1} and the query token x~_q = (x_q, 0). It is a single-head
Mamba-2 layer with identity Q/K/V and unit step: keys x_t are B, the query x_q is C, the per-step
decay is exp(a), and the query token reads the state after one more decay step, with x~_q as the
skip term and no write of its own. The context is one prefill (`scalar_decay_state`) and the query
token one `scalar_decay_step` (its decay), read by x_q, so the toy and the full models share the
recurrence.

Parameters (paths in the params pytree): `w` (d + 1,), initialised to 0, and `log_rate` = lambda
(scalar), initialised to `lambda0`. Decay quantities are derived from `log_rate`, never stored.

Because f is linear in h, the logit only needs the scalar value r_t = w^T x~_t per token: the core
then carries the state S = sum_t exp(a (ell - t)) r_t x_t in R^d instead of a (d+1) x d matrix, and
one context state answers a query at any position (`logits_at`). With a fixed dictionary of P keys
(`logits_indexed`) the state lives in the dictionary's basis: B_t is the one-hot index of key t, the
read is C = K x_q (the Gram column), so the recurrence has n = P channels instead of d.
`hidden_state` runs the full (d+1)-channel recurrence; the tests hold the three against each other
and against the formula.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ssmgate.cores import scalar_decay_state, scalar_decay_step
from ssmgate.tasks.perturbed_labels import IndexedBatch, LabelBatch, query


def retention(log_rate, distance):
    """alpha_Delta = exp(-Delta exp(lambda)): what a token `distance` steps back keeps of its write."""
    return jnp.exp(-distance * jnp.exp(log_rate))


class SimplifiedSSM(nn.Module):
    d: int
    lambda0: float = 0.0

    def setup(self):
        self.w = self.param("w", nn.initializers.zeros, (self.d + 1,))
        self.log_rate = self.param("log_rate", lambda _: jnp.asarray(self.lambda0, jnp.float32))

    def _decay(self):
        return -jnp.exp(self.log_rate)[None]  # A of the single head

    def _context_state(self, values_btp, keys_bld):
        """Runs the core over the context: values (b, ell, p) written along keys; returns (b, p, d)."""
        b, ell, _ = keys_bld.shape
        state = scalar_decay_state(values_btp[:, :, None, :], jnp.ones((b, ell, 1)), self._decay(), keys_bld[:, :, None, :])
        return state[:, 0]

    def _query_step(self, state_bpd):
        """The query token's step through the core: one decay, no write. Returns the state it reads,
        (b, p, d); every path below reads it with x_q (a dot product) and adds the skip w^T x~_q."""
        b, p, d = state_bpd.shape
        zeros = jnp.zeros((b, 1, d))
        _, decayed = scalar_decay_step(state_bpd[:, None], jnp.zeros((b, 1, p)), jnp.ones((b, 1)), self._decay(),
                                       zeros, zeros)
        return decayed[:, 0]

    def logits_at(self, keys_bld, labels_bl, query_pos_bk):
        """f for k queries per context (b, k): query j of row i is the key at position query_pos[i, j].
        The context state does not depend on the query, so k reads cost one matmul."""
        w_x, v = self.w[:-1], self.w[-1]
        values = keys_bld @ w_x + v * labels_bl  # r_t = w^T x~_t
        read = self._query_step(self._context_state(values[..., None], keys_bld))[:, 0]  # (b, d)
        x_q = jnp.take_along_axis(keys_bld, query_pos_bk[..., None], axis=1)  # (b, k, d)
        return jnp.einsum("bkd,bd->bk", x_q, read + w_x)

    def logits_indexed(self, keys_pd, batch: IndexedBatch):
        """f (b,) for a batch given by dictionary indices, computed in the dictionary's basis."""
        w_x, v = self.w[:-1], self.w[-1]
        key_values = keys_pd @ w_x  # w_x . x_i for every dictionary key
        values = key_values[batch.idx] + v * batch.labels
        onehot = jax.nn.one_hot(batch.idx, keys_pd.shape[0], dtype=values.dtype)
        read = self._query_step(self._context_state(values[..., None], onehot))[:, 0]  # (b, P): S = K^T read
        q_idx = jnp.take_along_axis(batch.idx, batch.query_pos[:, None], axis=1)[:, 0]
        gram_q = (keys_pd @ keys_pd.T)[q_idx]  # (b, P): x_i . x_q; P^2 d work instead of b P d
        return jnp.sum(read * gram_q, axis=-1) + key_values[q_idx]

    def __call__(self, batch: LabelBatch | IndexedBatch, keys_pd=None):
        """f (b,) for the batch's queries; an IndexedBatch needs the dictionary keys (P, d)."""
        if isinstance(batch, IndexedBatch):
            if keys_pd is None:
                raise ValueError("SimplifiedSSM: an IndexedBatch needs keys_pd, the dictionary keys (P, d)")
            return self.logits_indexed(keys_pd, batch)
        return self.logits_at(batch.keys, batch.labels, batch.query_pos[:, None])[:, 0]

    def hidden_state(self, batch: LabelBatch):
        """h (b, d + 1) of protocol §2.2 by the full (d+1)-channel recurrence."""
        tokens = jnp.concatenate([batch.keys, batch.labels[..., None]], axis=-1)
        read = self._query_step(self._context_state(tokens, batch.keys))  # (b, d + 1, d)
        x_q, _ = query(batch)
        skip = jnp.concatenate([x_q, jnp.zeros_like(x_q[:, :1])], axis=-1)
        return jnp.einsum("bpd,bd->bp", read, x_q) + skip


def logistic_loss(logits, targets):
    """mean log(1 + exp(-y f)), computed stably."""
    return jnp.mean(jax.nn.softplus(-targets * logits))


def margins(params, keys_pd, labels_p, distance):
    """(delta_m, delta_r) of protocol §2.6: (1 + alpha) mean_i y(x_i) (w_x . x_i) and alpha v, alpha at `distance`."""
    w = params["w"]
    alpha = retention(params["log_rate"], distance)
    delta_m = (1 + alpha) * jnp.mean(labels_p * (keys_pd @ w[:-1]))
    return delta_m, alpha * w[-1]
