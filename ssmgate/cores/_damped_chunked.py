"""Chunked form of the damped core's 2x2 block recurrence, without inverses.

SSD writes the transport between tokens s < t of a chunk as P_t P_s^{-1} of cumulative products,
which cancels catastrophically for a 2x2 block with a growing mode (ssmgate/cores/damped.py). Here
the transports Phi(t, s) = M_t ... M_{s+1} of every pair (t, s) of a chunk are instead built forward,
one token at a time: Phi(t, .) = M_t Phi(t-1, .), with Phi(t, t) = I. Nothing is inverted, and
every transition has spectral radius < 1 (the products are the decaying transports themselves),
so no factor grows and no difference cancels.
The cost is O(Q^2 r) per chunk and head for those products, against the O(Q p n) of the state work,
so chunks stay short (16-32). With the transports the chunk is computed as SSD does: an
attention-like kernel K[t, s] = sum_i C_t,i^T Phi_i(t, s) B_s,i inside the chunk, each chunk's state
contribution, and a short scan over chunks. Channels >= 2r decay by a scalar and go through
`chunked_ssd` unchanged.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from einops import rearrange

from ssmgate.cores._ssd import chunk_time, chunked_ssd


def _pad_identity(m, chunk: int):
    """Entries (m00, m01, m10, m11) (b, t, h, r) chunked to (b, c, q, h, r), padded tokens = I."""
    m00, m01, m10, m11 = m
    return (chunk_time(m00 - 1.0, chunk) + 1.0, chunk_time(m01, chunk), chunk_time(m10, chunk),
            chunk_time(m11 - 1.0, chunk) + 1.0)


def _transports(m_bcqhr, q: int):
    """Phi (b, c, h, r, q_t, q + 1, 2, 2): slot 0 is the transport from the chunk's entry,
    M_t ... M_0; slot 1 + s is Phi(t, s), the identity at s = t and zero above the diagonal."""
    M = jnp.stack([jnp.stack(m_bcqhr[:2], -1), jnp.stack(m_bcqhr[2:], -1)], -2)  # (b, c, q, h, r, 2, 2)
    eye = jnp.eye(2, dtype=M.dtype)
    P0 = jnp.zeros((M.shape[0], M.shape[1], *M.shape[3:5], q + 1, 2, 2), M.dtype).at[..., 0, :, :].set(eye)
    slots = jnp.arange(q + 1)[:, None, None]

    def advance(P, inputs):
        M_t, t = inputs
        P = jnp.einsum("bchrij,bchrsjk->bchrsik", M_t, P)
        P = jnp.where(slots == t + 1, eye, P)
        return P, P

    _, rows = jax.lax.scan(advance, P0, (jnp.moveaxis(M, 2, 0), jnp.arange(q)))
    return jnp.moveaxis(rows, 0, 4)


def chunked_pairs(xs_bthp, m, B_bthk, C_bthk, h0_bhpk, chunk: int, xdiag_bthp=None):
    """y_t = h_t C_t for h_t = M_t h_{t-1} + xs_t B_t^T on interleaved pairs (k = 2r channels,
    per-head B and C), M_t from the entries m (each (b, t, h, r)). xdiag adds (C_t . B_t) xdiag_t.
    Returns y (b, t, h, p) and the final state (b, h, p, k)."""
    b, t, h, p = xs_bthp.shape
    q = chunk
    xs = chunk_time(xs_bthp, q)                                   # (b, c, q, h, p)
    Bp, Cp = (rearrange(chunk_time(v, q), "b c q h (r i) -> b c q h r i", i=2) for v in (B_bthk, C_bthk))
    phi = _transports(_pad_identity(m, q), q)                     # (b, c, h, r, q_t, q + 1, 2, 2)

    # Intra-chunk kernel K[t, s] = sum_i C_t,i^T Phi_i(t, s) B_s,i.
    PB = jnp.einsum("bchrtsij,bcshrj->bchrtsi", phi[..., 1:, :, :], Bp)
    kernel = jnp.einsum("bcthri,bchrtsi->bchts", Cp, PB)
    y = jnp.einsum("bchts,bcshp->bcthp", kernel, xs)

    # Each chunk's contribution to the state at its end, and the transport across the chunk.
    states = jnp.einsum("bchrsi,bcshp->bchrip", PB[..., q - 1, :, :], xs)
    across = phi[..., q - 1, 0, :, :]                              # (b, c, h, r, 2, 2)
    h0 = rearrange(h0_bhpk, "b h p (r i) -> b h r i p", i=2)

    def carry_state(state, inputs):
        across_c, s_c = inputs
        return jnp.einsum("bhrij,bhrjp->bhrip", across_c, state) + s_c, state

    final, starts = jax.lax.scan(carry_state, h0, (jnp.moveaxis(across, 1, 0), jnp.moveaxis(states, 1, 0)))
    starts = jnp.moveaxis(starts, 0, 1)                            # (b, c, h, r, 2, p)
    # Reads of the entering state: C_t^T Phi(t, entry) state.
    C_entry = jnp.einsum("bchrtji,bcthrj->bchrti", phi[..., 0, :, :], Cp)
    y = y + jnp.einsum("bchrti,bchrip->bcthp", C_entry, starts)

    if xdiag_bthp is not None:
        cb_diag = jnp.sum(Cp * Bp, axis=(-2, -1))                  # (b, c, q, h)
        y = y + cb_diag[..., None] * chunk_time(xdiag_bthp, q)
    y = rearrange(y, "b c q h p -> b (c q) h p")[:, :t]
    return y, rearrange(final, "b h r i p -> b h p (r i)")


def chunked_damped(xs_bthp, m, logdecay_bth, B_bthn, C_bthn, B_grouped, C_grouped, h0_bhpn, chunk: int,
                   xdiag_bthp=None):
    """The damped recurrence: pairs i < r through `chunked_pairs`, channels >= 2r by their scalar
    decay through `chunked_ssd` (grouped B/C). B_bthn, C_bthn: per-head (b, t, h, n)."""
    r = m[0].shape[-1]
    n = h0_bhpn.shape[-1]
    y, final = 0.0, []
    if r:
        y_p, f_p = chunked_pairs(xs_bthp, m, B_bthn[..., : 2 * r], C_bthn[..., : 2 * r], h0_bhpn[..., : 2 * r],
                                 chunk, xdiag_bthp)
        y, final = y + y_p, final + [f_p]
    if 2 * r < n:
        y_s, f_s = chunked_ssd(xs_bthp, logdecay_bth, [(B_grouped[..., 2 * r:], C_grouped[..., 2 * r:])],
                               h0_bhpn[..., 2 * r:], chunk, xdiag_bthp)
        y, final = y + y_s, final + [f_s]
    return y, final[0] if len(final) == 1 else jnp.concatenate(final, axis=-1)
