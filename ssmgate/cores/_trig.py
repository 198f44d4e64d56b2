"""cos and sin of the rotation cores' phases from elementwise arithmetic that XLA vectorizes.

XLA:CPU evaluates jnp.cos / jnp.sin at about 9 ns an element (13x jnp.exp, measured 2026-12-02 on
the 2-core CI VM class: 2.3 ms for the 262,144 phases of the benchmark's rotation), and fuses them
into every consumer, where they are evaluated again. The phases are reduced mod 2 pi
(`rotation.cumulative_phase`), so a short Cody-Waite reduction to [-pi/4, pi/4] and the classic
minimax polynomials of degree 7 (sin) and 8 (cos) on that interval give float32 results within
about 1 ulp of the exact values (tests/cores/test_trig.py), with multiplies and adds only. The
parallel forms use it (`rotation.phases_cos_sin`); the one-token steps keep jnp.cos / jnp.sin,
which measured ~10% faster inside the sequential scan, on a step's few phases.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# pi/2 = _P1 + _P2 + _P3; _P1 and _P2 have few significant bits, so k * _P1 and k * _P2 are exact
# for the small quadrant counts k of reduced phases.
_P1, _P2, _P3 = 1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8
_SIN = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)


def _sin_cos(phase):
    k = jnp.round(phase * (2.0 / np.pi))
    r = ((phase - k * _P1) - k * _P2) - k * _P3       # in [-pi/4, pi/4]
    z = r * r
    s = r + r * z * (_SIN[0] + z * (_SIN[1] + z * _SIN[2]))
    c = 1.0 - 0.5 * z + z * z * (_COS[0] + z * (_COS[1] + z * _COS[2]))
    quadrant = jnp.mod(k, 4.0)
    swap = (quadrant == 1.0) | (quadrant == 3.0)
    sin = jnp.where(swap, c, s)
    cos = jnp.where(swap, s, c)
    sin = jnp.where(quadrant >= 2.0, -sin, sin)
    cos = jnp.where((quadrant == 1.0) | (quadrant == 2.0), -cos, cos)
    return sin, cos


@jax.custom_jvp
def sin_cos(phase):
    """(sin(phase), cos(phase)) for float32/float64 phases; exact to float32 rounding for
    |phase| up to a few hundred radians (the cores pass phases reduced to [0, 2 pi)). float64
    inputs use jnp.sin / jnp.cos (the tests' float64 runs keep their full precision)."""
    if phase.dtype == jnp.float64:
        return jnp.sin(phase), jnp.cos(phase)
    return _sin_cos(phase)


@sin_cos.defjvp
def _sin_cos_jvp(primals, tangents):
    (phase,), (dphase,) = primals, tangents
    sin, cos = sin_cos(phase)
    return (sin, cos), (cos * dphase, -sin * dphase)
