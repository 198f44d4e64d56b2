"""Float64 numpy references written directly from the formulas of protocol §1.2, 1.3 and 1.5.

One token at a time, explicit loops over heads and pairs, nothing shared with ssmgate's code.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

TWO_PI = 2.0 * np.pi


def _f64(*arrays):
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


def _per_token(A, b, t, h):
    return np.broadcast_to(A, (b, t, h)) if A.ndim == 1 else A


def scalar_decay(x, dt, A, B, C, D=None, h0=None):
    x, dt, A, B, C, D, h0 = _f64(x, dt, A, B, C, D, h0)
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    A = _per_token(A, b, t, h)
    S = np.zeros((b, h, p, n)) if h0 is None else h0.copy()
    y = np.zeros((b, t, h, p))
    for k in range(t):
        for i in range(h):
            grp = i // (h // g)
            S[:, i] = np.exp(dt[:, k, i] * A[:, k, i])[:, None, None] * S[:, i] + \
                (dt[:, k, i, None] * x[:, k, i])[:, :, None] * B[:, k, grp][:, None, :]
            y[:, k, i] = np.einsum("bpn,bn->bp", S[:, i], C[:, k, grp])
            if D is not None:
                y[:, k, i] += D[i] * x[:, k, i]
    return y, S


def rot2(phi):
    return np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])


def rotation(x, dt, A, B, C, theta, D=None, trap=None, state=None):
    """state = (phase (b,h,r), S (b,h,p,n), B_prev (b,h,n), x_prev (b,h,p)) or None."""
    x, dt, A, B, C, theta, D, trap = _f64(x, dt, A, B, C, theta, D, trap)
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = theta.shape[3]
    A = _per_token(A, b, t, h)
    lam = np.ones((b, t, h)) if trap is None else trap
    if state is None:
        phase, S = np.zeros((b, h, r)), np.zeros((b, h, p, n))
        B_prev, x_prev = np.zeros((b, h, n)), np.zeros((b, h, p))
    else:
        phase, S, B_prev, x_prev = (np.array(s, dtype=np.float64) for s in state)
    y = np.zeros((b, t, h, p))
    for k in range(t):
        for bb in range(b):
            for i in range(h):
                grp = i // (h // g)
                phase[bb, i] = np.mod(phase[bb, i] + dt[bb, k, i] * theta[bb, k, i], TWO_PI)
                Bt, Ct = B[bb, k, grp].copy(), C[bb, k, grp].copy()
                for j in range(r):
                    R = rot2(phase[bb, i, j])
                    Bt[2 * j:2 * j + 2] = R @ Bt[2 * j:2 * j + 2]
                    Ct[2 * j:2 * j + 2] = R @ Ct[2 * j:2 * j + 2]
                a = np.exp(dt[bb, k, i] * A[bb, k, i])
                beta = (1 - lam[bb, k, i]) * dt[bb, k, i] * a
                gamma = lam[bb, k, i] * dt[bb, k, i]
                S[bb, i] = a * S[bb, i] + beta * np.outer(x_prev[bb, i], B_prev[bb, i]) + \
                    gamma * np.outer(x[bb, k, i], Bt)
                y[bb, k, i] = S[bb, i] @ Ct + (0.0 if D is None else D[i] * x[bb, k, i])
                B_prev[bb, i], x_prev[bb, i] = Bt, x[bb, k, i]
    return y, (phase, S, B_prev, x_prev)


def explicit_rotation(x, dt, A, B, C, theta):
    """protocol §1.3.1: the state itself is rotated, h_t = a_t R(-dt theta) h_{t-1} + dt B_t x_t^T on
    each rotated pair, read with the unrotated C. Equals `rotation` (Euler) by the RoPE trick."""
    x, dt, A, B, C, theta = _f64(x, dt, A, B, C, theta)
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = theta.shape[3]
    A = _per_token(A, b, t, h)
    S = np.zeros((b, h, n, p))
    y = np.zeros((b, t, h, p))
    for k in range(t):
        for bb in range(b):
            for i in range(h):
                grp = i // (h // g)
                M = np.eye(n) * np.exp(dt[bb, k, i] * A[bb, k, i])
                for j in range(r):
                    M[2 * j:2 * j + 2, 2 * j:2 * j + 2] = np.exp(dt[bb, k, i] * A[bb, k, i]) * \
                        rot2(-dt[bb, k, i] * theta[bb, k, i, j])
                S[bb, i] = M @ S[bb, i] + dt[bb, k, i] * np.outer(B[bb, k, grp], x[bb, k, i])
                y[bb, k, i] = C[bb, k, grp] @ S[bb, i]
    return y


def companion(a, kappa):
    return np.array([[0.0, 1.0], [-(a * a - kappa), -2.0 * a]])


def kappa_of(regime, a, nu, c=0.9):
    if regime == "under":
        return -nu * nu
    if regime == "critical":
        return 0.0
    return (c * a * np.tanh(nu)) ** 2


def damped(x, dt, a, nu, B, C, D=None, *, regime, c=0.9, trap=None, state=None):
    """Pairs evolve by scipy's expm of dt*A(kappa); rows >= 2r by exp(-dt a)."""
    x, dt, a, nu, B, C, D, trap = _f64(x, dt, a, nu, B, C, D, trap)
    b, t, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r = nu.shape[3]
    a = _per_token(a, b, t, h)
    lam = np.ones((b, t, h)) if trap is None else trap
    if state is None:
        S, B_prev, x_prev = np.zeros((b, h, p, n)), np.zeros((b, h, n)), np.zeros((b, h, p))
    else:
        S, B_prev, x_prev = (np.array(s, dtype=np.float64) for s in state)
    y = np.zeros((b, t, h, p))
    for k in range(t):
        for bb in range(b):
            for i in range(h):
                grp = i // (h // g)
                d, ak = dt[bb, k, i], a[bb, k, i]
                M = np.eye(n) * np.exp(-d * ak)
                for j in range(r):
                    kap = kappa_of(regime, ak, nu[bb, k, i, j], c)
                    M[2 * j:2 * j + 2, 2 * j:2 * j + 2] = scipy.linalg.expm(d * companion(ak, kap))
                carried = S[bb, i] + (1 - lam[bb, k, i]) * d * np.outer(x_prev[bb, i], B_prev[bb, i])
                S[bb, i] = carried @ M.T + lam[bb, k, i] * d * np.outer(x[bb, k, i], B[bb, k, grp])
                y[bb, k, i] = S[bb, i] @ C[bb, k, grp] + (0.0 if D is None else D[i] * x[bb, k, i])
                B_prev[bb, i], x_prev[bb, i] = B[bb, k, grp], x[bb, k, i]
    return y, (S, B_prev, x_prev)


def rotation_mimo(x, dt, A, B, C, theta, D=None, trap=None, state=None):
    """protocol §1.3.3, rank R: x (b,t,h,R,p), B/C (b,t,g,R,n); every rank column of B and C is rotated
    by the head's phase; the state (p, n) takes the rank-R write X^T B~ and gives R reads S C~^T.
    state = (phase (b,h,r), S (b,h,p,n), B_prev (b,h,R,n), x_prev (b,h,R,p)) or None."""
    x, dt, A, B, C, theta, D, trap = _f64(x, dt, A, B, C, theta, D, trap)
    b, t, h, R, p = x.shape
    g, n = B.shape[2], B.shape[4]
    r = theta.shape[3]
    A = _per_token(A, b, t, h)
    lam = np.ones((b, t, h)) if trap is None else trap
    if state is None:
        phase, S = np.zeros((b, h, r)), np.zeros((b, h, p, n))
        B_prev, x_prev = np.zeros((b, h, R, n)), np.zeros((b, h, R, p))
    else:
        phase, S, B_prev, x_prev = (np.array(s, dtype=np.float64) for s in state)
    y = np.zeros((b, t, h, R, p))
    for k in range(t):
        for bb in range(b):
            for i in range(h):
                grp = i // (h // g)
                phase[bb, i] = np.mod(phase[bb, i] + dt[bb, k, i] * theta[bb, k, i], TWO_PI)
                Bt, Ct = B[bb, k, grp].copy(), C[bb, k, grp].copy()  # (R, n): one row per rank
                for j in range(r):
                    Rm = rot2(phase[bb, i, j])
                    Bt[:, 2 * j:2 * j + 2] = Bt[:, 2 * j:2 * j + 2] @ Rm.T
                    Ct[:, 2 * j:2 * j + 2] = Ct[:, 2 * j:2 * j + 2] @ Rm.T
                a = np.exp(dt[bb, k, i] * A[bb, k, i])
                beta = (1 - lam[bb, k, i]) * dt[bb, k, i] * a
                gamma = lam[bb, k, i] * dt[bb, k, i]
                S[bb, i] = a * S[bb, i] + beta * x_prev[bb, i].T @ B_prev[bb, i] + gamma * x[bb, k, i].T @ Bt
                y[bb, k, i] = Ct @ S[bb, i].T + (0.0 if D is None else D[i] * x[bb, k, i])
                B_prev[bb, i], x_prev[bb, i] = Bt, x[bb, k, i]
    return y, (phase, S, B_prev, x_prev)
