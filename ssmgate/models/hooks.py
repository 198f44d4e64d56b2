"""Forward-time edits of one Mamba-3 layer (protocol §8.1-8.4), as static options of its forward pass.

`PhaseHooks` is what one layer applies, at the hook points of protocol §8 (forward order):

    angle projection -> theta  [phase: zero | reverse | shuffle act on the increments, before the
                                cumulative sum]
    -> rotation of B~, C~      [unrotate_B / unrotate_C: write / read with the normalised + biased
                                B, C not rotated, on every position or only on the last `last_k`]
    -> A_t dt_t                [decay: the head permutation of A, each head keeping its own dt]
    -> core

The user-facing grid (which layers, which intervention) is `ssmgate.interventions`; this module
holds the edits themselves so the model can apply them without importing that package.

Unrotating B at position t is done by handing the core R(-phi_t) B_t, which the core rotates by
phi_t back to B_t (to float32 rounding, ~1e-7): the core's own rotation is untouched, the phase
keeps evolving, and the trapezoid term of the next position reads whatever B~ was used.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from ssmgate.cores.rotation import cumulative_phase, rotate_pairs

PHASE_EDITS = ("native", "zero", "reverse", "shuffle", "shuffle_identity")
DECAY_EDITS = ("native", "cyclic", "identity")


@dataclasses.dataclass(frozen=True)
class PhaseHooks:
    """The edits of one layer. `phase`: 'zero' (theta = 0), 'reverse' (theta -> -theta),
    'shuffle' (per head and token, a random permutation of the r increments across pairs, from
    (seed, layer)), 'shuffle_identity' (the same code path with identity permutations: a check).
    `decay`: 'cyclic' (head h decays with A of head (h + 1) mod H) or 'identity' (a check).
    `unrotate_B` / `unrotate_C`: on the last `last_k` positions of the call (None: all)."""

    phase: str = "native"
    decay: str = "native"
    unrotate_B: bool = False
    unrotate_C: bool = False
    last_k: Optional[int] = None
    seed: int = 0
    layer: int = 0

    def __post_init__(self):
        if self.phase not in PHASE_EDITS:
            raise ValueError(f"PhaseHooks: phase={self.phase!r}; expected one of {PHASE_EDITS}")
        if self.decay not in DECAY_EDITS:
            raise ValueError(f"PhaseHooks: decay={self.decay!r}; expected one of {DECAY_EDITS}")
        if self.last_k is not None and self.last_k < 1:
            raise ValueError(f"PhaseHooks: last_k={self.last_k}; expected None (every position) or >= 1")

    @property
    def touches_phase(self) -> bool:
        return self.phase != "native" or self.unrotate_B or self.unrotate_C

    def edit_theta(self, theta_bthr):
        """The angle per unit dt after the phase edit (b, t, H, r)."""
        if self.phase == "zero":
            return jnp.zeros_like(theta_bthr)
        if self.phase == "reverse":
            return -theta_bthr
        if self.phase in ("shuffle", "shuffle_identity"):
            _, t, h, r = theta_bthr.shape
            if self.phase == "shuffle":
                key = jax.random.fold_in(jax.random.PRNGKey(self.seed), self.layer)
                perm_thr = jnp.argsort(jax.random.uniform(key, (t, h, r)), axis=-1)
            else:
                perm_thr = jnp.broadcast_to(jnp.arange(r), (t, h, r))
            return jnp.take_along_axis(theta_bthr, jnp.broadcast_to(perm_thr, theta_bthr.shape), axis=-1)
        return theta_bthr

    def edit_rate(self, rate_bth):
        """-A_t per head after the decay permutation (b, t, H); dt is not touched."""
        if self.decay == "native":
            return rate_bth
        h = rate_bth.shape[-1]
        source = (jnp.arange(h) + 1) % h if self.decay == "cyclic" else jnp.arange(h)
        return jnp.take(rate_bth, source, axis=-1)

    def unrotate(self, B, C, dt_bth, theta_bthr, phase0_bhr):
        """B, C (b, t, H, [R,] N) counter-rotated by the cumulative phase where asked, so the core's
        rotation leaves them unrotated there. phase0: the phase before the first token (b, H, r)."""
        if not (self.unrotate_B or self.unrotate_C) or theta_bthr.shape[-1] == 0:
            return B, C
        phase = cumulative_phase(dt_bth[..., None] * theta_bthr, phase0_bhr)  # (b, t, H, r), the core's phi_t
        t = phase.shape[1]
        k = t if self.last_k is None else min(self.last_k, t)
        where_t = (jnp.arange(t) >= t - k)[None, :, None, None]
        if B.ndim == 5:  # MIMO: the same phase for every rank column
            phase, where_t = phase[:, :, :, None, :], where_t[..., None]
        cos, sin = jnp.cos(phase), -jnp.sin(phase)
        keep = lambda v: jnp.where(where_t, rotate_pairs(v, cos, sin), v)
        return (keep(B) if self.unrotate_B else B), (keep(C) if self.unrotate_C else C)
