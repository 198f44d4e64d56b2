"""Mamba-3 mixer block (protocol §1.3-1.5): the official SISO/MIMO block with swappable transitions.

    in_proj(u) -> z | x | B | C | dd_dt | dd_A | trap | ang      widths d_inner, d_inner, G N R,
                                                                 G N R, H, H, H, r_in
    dt = softplus(dd_dt + dt_bias)                   (b, t, H), no clamp
    A  = -max(act(dd_A), a_floor)                    act = heavy (default; mamba_ssm since 2026-06) or softplus
    trap = sigmoid(trap)                             trapezoid weight lambda
    B, C <- RMSNorm over N (own scale) + per-head per-rank per-channel bias (init 1)
    y = core(x, dt, A, B, C, ..., D, trap)           no conv; bias-free projections
    out = out_proj(y * silu(z))

cfg.transition picks what turns the state (everything else identical):
  native          theta = pi tanh(ang) per unit dt: `rotation` adds dt_t theta_t to the phase.
                  ang (b, t, r) is shared by the heads; r = cfg.n_rot_pairs, r_in = r.
  none            no rotation: no angle projection (r_in = 0), `rotation` with r = 0 pairs
                  (keeps the trapezoid; equals native with zero angles).
  static          per-token phase increment pi tanh(omega), omega = `static_angle` (H, r), learned,
                  independent of the input AND of dt (protocol §1.4). The core multiplies theta by dt,
                  so theta = pi tanh(omega) / dt is passed (exact up to one rounding; dt > 0 always).
                  r_in = 0.
  under|critical|over   `damped(x, dt, a = -A, nu = pi tanh(ang), ...)`, the companion-form
                  second-order cores of protocol §1.5; r_in = r (critical ignores nu's values).
MIMO (cfg.mimo_rank R > 1, transitions native/none/static): as the official module, per head
X_k = x * mimo_x[k], Z_k = z * mimo_z[k], the `rotation_mimo` core reads R columns of B/C and
returns Y (b, t, H, R, P) (D applied to X_k), and out = sum_k mimo_o[k] * Y_k * silu(Z_k).
One difference in layout: the official MIMO kernels rotate the state pairs (n, n + N/2), these
cores the interleaved (2n, 2n + 1) as in SISO; the two are the same model up to a permutation of
the N axis, which `ssmgate.interventions.convert_mamba3` applies to official MIMO checkpoints.

Parameters (paths relative to the mixer; H heads, P headdim, N d_state, R rank):
  in_proj/kernel   (d_model, 2 d_inner + 2 G N R + 3 H + r_in)  PyTorch Linear init, no bias
  dt_bias          (H,)        as Mamba-2 (gates.dt_bias_init)
  B_norm/scale, C_norm/scale   (N,) ones
  B_bias, C_bias   (H, R, N)   ones (R = 1 for SISO), the official layout
  D                (H,)        ones
  static_angle     (H, r)      transition 'static' only; N(0, 1/3), the spread of native's raw
                               angles at init (unit-RMS input through a U(+-1/sqrt(d)) projection)
  mimo_x, mimo_z, mimo_o       (H, R, P)  MIMO only; init 1/R, 1, 1/R (official), so R = 1 is SISO
  out_norm_scale   (d_inner,)  only with OfficialMamba3Cfg(outproj_norm=True): upstream's is_outproj_norm,
                               y -> RMSNorm_P(y) * scale before the silu(z) gate (per rank for MIMO)
  out_proj/kernel  (d_inner, d_model)
There is no A_log: A_t is data-dependent (gates.py edits Mamba-2 gates only).

Interventions: `hooks` (a static `ssmgate.models.hooks.PhaseHooks`, default none) edits the
angle increments, the B/C rotation and the head-to-decay assignment inside the forward pass
(protocol §8; phase edits need transition 'native', the decay permutation works for every transition).

Diagnostics: every call sows `intermediates/phase_increment` (b, t, H, r), the per-token phase
step in radians (dt * theta; for the damped cores the angle of the underdamped rotation, dt * nu),
and `intermediates/decay` (b, t, H), alpha_t = exp(dt_t A_t) (protocol §8.3's history factor),
read with `ssmgate.models.lm.sown_intermediates` (P2's phase-code probe, protocol §6.3).

`__call__(u_btd, cache=None) -> (y_btd, new_cache)`: the cache is the core's final state
(RotationState, DampedState or MimoState), so a sequence run in pieces equals one run; decoding
is t = 1 with the cache.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange

from ssmgate.cores import damped, rotation, rotation_mimo
from ssmgate.models import gates
from ssmgate.models.config import DAMPED, ModelCfg
from ssmgate.models.hooks import PhaseHooks
from ssmgate.models.layers import RMSNorm, dense, rms_normalize


def heavy(u):
    """1 + u for u >= 0, 1 / (1 - u) for u < 0: positive, C^1, linear growth (protocol §1.3)."""
    return jnp.where(u >= 0, 1.0 + u, 1.0 / (1.0 - jnp.minimum(u, 0.0)))


def _decay_rate(dd_A, cfg: ModelCfg):
    """-A_t = max(act(dd_A), a_floor) > 0, float32."""
    act = heavy if cfg.a_activation == "heavy" else jax.nn.softplus
    return jnp.maximum(act(dd_A.astype(jnp.float32)), cfg.a_floor)


class Mamba3Mixer(nn.Module):
    cfg: ModelCfg
    # None: MIMO iff cfg.mimo_rank > 1. True forces the MIMO path (with its mimo_* parameters) at
    # any rank, as the official `is_mimo`; used to check that R = 1 reproduces SISO.
    mimo: Optional[bool] = None
    hooks: Optional[PhaseHooks] = None   # forward-time interventions (protocol §8); None = native

    @nn.compact
    def __call__(self, u_btd, cache=None):
        cfg = self.cfg.validate()
        tr = cfg.transition
        cdt = jnp.dtype(cfg.dtype)
        b, t, _ = u_btd.shape
        h, p, g, n, d_inner, R = cfg.n_ssm_heads, cfg.headdim, cfg.n_groups, cfg.d_state, cfg.d_inner, cfg.mimo_rank
        use_mimo = R > 1 if self.mimo is None else self.mimo
        if use_mimo and tr in DAMPED:
            raise ValueError(f"Mamba3Mixer: MIMO (mimo_rank={R}) with transition {tr!r}; expected MIMO only "
                             "for transition 'native', 'none' or 'static'")
        r = 0 if tr == "none" else cfg.n_rot_pairs
        hooks = self.hooks or PhaseHooks()
        if hooks.touches_phase and tr != "native":
            raise ValueError(f"Mamba3Mixer: phase intervention {hooks} on transition {tr!r}; phase edits act "
                             "on the input-dependent angles of transition 'native' only")
        r_in = r if tr == "native" or tr in DAMPED else 0

        widths = [d_inner, d_inner, g * n * R, g * n * R, h, h, h, r_in]
        proj = dense(sum(widths), cdt, "in_proj")(u_btd.astype(cdt))
        z, x, B, C, dd_dt, dd_A, trap_raw, ang = jnp.split(proj, np.cumsum(widths)[:-1], axis=-1)

        dt_bias = self.param("dt_bias", lambda key: gates.dt_bias_init(cfg, key))
        dt_bth = jax.nn.softplus(dd_dt.astype(jnp.float32) + dt_bias)
        rate_bth = hooks.edit_rate(_decay_rate(dd_A, cfg))  # a_t = -A_t
        self.sow("intermediates", "decay", jnp.exp(-dt_bth * rate_bth))  # alpha_t per head (state diagnostics)
        trap_bth = jax.nn.sigmoid(trap_raw.astype(jnp.float32))
        D = self.param("D", nn.initializers.ones, (h,), jnp.float32)
        B_bthRn = self._bc(B, "B", g, R, n, h)
        C_bthRn = self._bc(C, "C", g, R, n, h)
        x_bthp, z_bthp = (rearrange(v, "b t (h p) -> b t h p", h=h, p=p) for v in (x, z))

        if tr in DAMPED:
            nu = jnp.broadcast_to((jnp.pi * jnp.tanh(ang.astype(jnp.float32)))[:, :, None, :], (b, t, h, r))
            self.sow("intermediates", "phase_increment", dt_bth[..., None] * nu)
            y, state = damped(x_bthp, dt_bth, rate_bth, nu, B_bthRn[:, :, :, 0], C_bthRn[:, :, :, 0], D,
                              regime=tr, overdamped_c=cfg.overdamped_c, trap=trap_bth,
                              initial_state=cache, algorithm=cfg.algorithm, chunk_size=cfg.chunk_size)
            gated = y * jax.nn.silu(z_bthp)
        else:
            theta = hooks.edit_theta(self._theta(tr, ang, dt_bth, b, t, h, r))
            phase0 = jnp.zeros((b, h, r), jnp.float32) if cache is None else cache.phase
            B_bthRn, C_bthRn = hooks.unrotate(B_bthRn, C_bthRn, dt_bth, theta, phase0)
            self.sow("intermediates", "phase_increment", dt_bth[..., None] * theta)
            kw = dict(trap=trap_bth, initial_state=cache, algorithm=cfg.algorithm, chunk_size=cfg.chunk_size)
            if use_mimo:
                gated, state = self._mimo(x_bthp, z_bthp, dt_bth, -rate_bth, B_bthRn, C_bthRn, theta, D, R, kw)
            else:
                y, state = rotation(x_bthp, dt_bth, -rate_bth, B_bthRn[:, :, :, 0], C_bthRn[:, :, :, 0], theta, D, **kw)
                gated = self._out_norm(y, h, p) * jax.nn.silu(z_bthp)
        out = dense(cfg.d_model, cdt, "out_proj")(rearrange(gated.astype(cdt), "b t h p -> b t (h p)"))
        return out, state

    def _bc(self, v, name, g, R, n, h):
        """(b, t, R G N) in the official (r g n) order -> RMSNorm over N -> per-head bias:
        (b, t, H, R, N) float32 (the bias makes B, C per head, so the core sees g = H)."""
        v = RMSNorm(self.cfg.norm_eps, dtype=jnp.float32, name=f"{name}_norm")(
            rearrange(v, "b t (R g n) -> b t R g n", R=R, g=g, n=n))
        v = jnp.repeat(jnp.swapaxes(v, 2, 3), h // g, axis=2)  # (b, t, H, R, N)
        bias = self.param(f"{name}_bias", nn.initializers.ones, (h, R, n), jnp.float32)
        return v + bias

    def _theta(self, tr, ang, dt_bth, b, t, h, r):
        """Angle per unit dt (b, t, H, r) for the rotation cores."""
        if tr == "native":
            return jnp.broadcast_to((jnp.pi * jnp.tanh(ang.astype(jnp.float32)))[:, :, None, :], (b, t, h, r))
        if tr == "static":
            omega = self.param("static_angle", nn.initializers.normal(3.0 ** -0.5), (h, r), jnp.float32)
            return jnp.pi * jnp.tanh(omega) / dt_bth[..., None]
        return jnp.zeros((b, t, h, 0), jnp.float32)  # none

    def _mimo(self, x_bthp, z_bthp, dt, A, B, C, theta, D, R, kw):
        h, p = x_bthp.shape[2], x_bthp.shape[3]
        mimo_x = self.param("mimo_x", nn.initializers.constant(1.0 / R), (h, R, p), jnp.float32)
        mimo_z = self.param("mimo_z", nn.initializers.ones, (h, R, p), jnp.float32)
        mimo_o = self.param("mimo_o", nn.initializers.constant(1.0 / R), (h, R, p), jnp.float32)
        X = x_bthp[:, :, :, None, :] * mimo_x.astype(x_bthp.dtype)
        Y, state = rotation_mimo(X, dt, A, B, C, theta, D, **kw)
        Z = z_bthp[:, :, :, None, :] * mimo_z.astype(z_bthp.dtype)
        if getattr(self.cfg, "outproj_norm", False):  # normalised per (head, rank), before the gate
            Y = jnp.swapaxes(self._out_norm(jnp.swapaxes(Y, 2, 3), h, p), 2, 3)
        gated = jnp.einsum("bthkp,hkp->bthp", Y * jax.nn.silu(Z), mimo_o.astype(Y.dtype))
        return gated, state

    def _out_norm(self, y, h, p):
        """Upstream's is_outproj_norm (OfficialMamba3Cfg.outproj_norm): y (..., H, P) RMS-normalised over P
        (eps 1e-5, upstream's fixed value) times a (H, P) scale; identity otherwise."""
        if not getattr(self.cfg, "outproj_norm", False):
            return y
        scale = self.param("out_norm_scale", nn.initializers.ones, (h * p,), jnp.float32)
        return (rms_normalize(y, 1e-5) * scale.reshape(h, p)).astype(y.dtype)
