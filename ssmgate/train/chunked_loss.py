"""Next-token cross-entropy scored a piece of the sequence at a time (`--mesh_loss_chunk`).

A language model's head turns each position into float32 logits over the whole vocabulary: with
P2's 128k-token vocabulary that is 1 GiB for one 2,048-token row, and the loss's log-softmax and
its gradient hold several such arrays. Here the head runs on `chunk` positions at a time inside a
scan whose body is rematerialised (jax.checkpoint), so the forward keeps only per-chunk sums and
the backward recomputes one chunk's logits at a time: memory for one chunk's logits instead of the
sequence's, for one more head matmul. The values are `text_loss`'s (the same per-token terms,
summed in another order), so a run may switch it on or off between checkpoints.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp


def chunked_text_loss(h_btd: jax.Array, head_dv: jax.Array, batch, chunk: int,
                      pin: Optional[Callable] = None) -> tuple[jax.Array, dict]:
    """text_loss(h_btd @ head_dv, batch) without the whole (b, t, vocab) logits: the final-norm
    hidden states `h_btd` and the head (d, vocab) scored `chunk` positions at a time. `pin`, the
    model's activation constraint, is applied to each chunk's logits as the model applies it to
    its own."""
    if chunk < 1:
        raise ValueError(f"--mesh_loss_chunk={chunk}: expected a number of positions >= 1 (0 scores the whole "
                         "sequence at once, outside this function)")
    b, t, d = h_btd.shape
    n = -(-t // chunk)
    pad = n * chunk - t  # padded positions carry mask 0: they add nothing to any sum
    h = jnp.pad(h_btd, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(batch.targets, ((0, 0), (0, pad)))
    mask = jnp.pad(batch.mask.astype(jnp.float32), ((0, 0), (0, pad)))
    # (n, b, chunk, ...): the scan walks the chunks.
    h = h.reshape(b, n, chunk, d).swapaxes(0, 1)
    targets = targets.reshape(b, n, chunk).swapaxes(0, 1)
    mask = mask.reshape(b, n, chunk).swapaxes(0, 1)
    head = head_dv.astype(h_btd.dtype)
    pin = pin or (lambda x: x)

    @jax.checkpoint
    def piece_sums(h_bcd, targets_bc, mask_bc):
        # bf16 operands, float32 accumulation and result, as the model's head.
        logits = pin(jnp.einsum("bcd,dv->bcv", h_bcd, head, preferred_element_type=jnp.float32))
        lse = jax.nn.logsumexp(logits, axis=-1)
        target_logit = jnp.take_along_axis(logits, targets_bc[..., None], axis=-1)[..., 0]
        nll = (lse - target_logit) * mask_bc
        correct = (jnp.argmax(logits, axis=-1) == targets_bc).astype(jnp.float32) * mask_bc
        return nll.sum(), correct.sum()

    def body(carry, piece):
        nll, correct = piece_sums(*piece)
        return (carry[0] + nll, carry[1] + correct), None

    zero = jnp.zeros((), jnp.float32)
    (nll_sum, n_correct), _ = jax.lax.scan(body, (zero, zero), (h, targets, mask))
    n_tokens = mask.sum()
    denom = jnp.maximum(n_tokens, 1.0)
    return nll_sum / denom, {"accuracy": n_correct / denom, "nll_sum": nll_sum, "n_tokens": n_tokens,
                             "n_correct": n_correct}
