"""The chunked SSD recurrence h_t = exp(l_t) h_{t-1} + xs_t B_t^T, y_t = h_t C_t (+ (C_t . B_t)
xdiag_t) as a Pallas kernel, forward and backward.

One program per (batch, head, block of `block_p` state rows) walks its sequence chunk by chunk,
carrying its (block_p, n) slice of the state in float32: per chunk of Q tokens

  seg[t, s] = l_{s+1} + ... + l_t       summed term by term (a matmul of the causal mask with the
                                        masked log-decays), never a difference of cumulative sums
  y   = ((C B^T) * exp(seg)) @ xs + exp(cum) * (C @ S^T)
  S  <- exp(total) S + (exp(after) * xs)^T @ B

which is `ssmgate.cores._ssd.chunked_ssd` with its inter-chunk scan fused into the loop. The
backward kernel walks the chunks in reverse, carrying dL/dS, from the chunk-start states the
forward pass saved; it returns per-program partial gradients of B, C and l that the wrapper sums
over the heads of a group and the blocks of p. Derivation of every term: docs/cores.md "pallas".

Layouts are head-major inside (x (b, h, T, p), B/C (b, g, T, n)) so that every block is a 2-D
(tokens, channels) tile; the wrapper transposes, pads t to a multiple of Q (log-decay 0 and no
write: inert), and pads p and n to powers of two >= 16 (zero channels: inert), which Triton's tiles
and dots require. Matmuls accumulate in float32; with `mm_dtype` (bf16/fp16 inputs) the operands of
the data products are cast to it, the segment sums and the state products stay float32.

Backends: 'interpret' (Pallas' interpreter: any machine, the tests), 'gpu' (Triton lowering),
'tpu' (Mosaic). None (the cores' `algorithm="pallas"`) stages all three with
`lax.platform_dependent` and lets the lowering platform choose: interpret on cpu (and any platform
not named), Triton on cuda/rocm, Mosaic on tpu. The choice is made when the function is lowered,
not from `jax.default_backend()` when it is traced, so `jax.export(..., platforms=["cuda"])` on a
CPU-only machine lowers the Triton kernel and a jitted call on a GPU never sees the interpreter.
A program holds its whole sequence in VMEM on TPU; where that would not fit (tpu_vmem.py) the tpu
branch is the chunked form instead, so every TPU generation compiles every length.

A Mosaic or Triton kernel is a custom call that XLA cannot partition: inside a program sharded
over several devices (a pod's training step) JAX refuses to lower it. With backend=None, a
program traced in a process with more than one device (or inside `partitioned_over(n)`, n > 1:
compiling for a TPU slice from a host with one CPU device) therefore lowers the chunked form on
gpu and tpu, with a warning; wrapping the kernel in a shard_map over the batch would keep it there,
and is not implemented.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from ssmgate.cores._ssd import chunked_ssd, pad_axis
from ssmgate.cores.pallas import tpu_vmem

BACKENDS = ("interpret", "gpu", "tpu")
# Devices the program being traced is partitioned over; None: this process's devices.
_SPAN = contextvars.ContextVar("ssmgate_pallas_span", default=None)
MIN_TILE = 16   # Triton's dots need every dimension >= 16


def _pow2_at_least(v: int, floor: int = MIN_TILE) -> int:
    return max(floor, 1 << (int(v) - 1).bit_length())


def resolve_backend(backend: str | None) -> str | None:
    """The explicit backend, validated; None stays None (chosen per lowering platform)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"pallas_ssd: unknown backend {backend!r}; expected None or one of {BACKENDS}")
    return backend


# Lowering platform -> kernel backend for backend=None; any other platform interprets (correct, slow).
PLATFORM_BACKENDS = {"cpu": "interpret", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


def _block_p_error(backend: str, block_p: int, P: int) -> str | None:
    """Why block_p cannot be this backend's rows per program for the padded p = P (None if it can)."""
    bp = int(block_p)
    if bp < MIN_TILE or bp & (bp - 1) or P % bp or (backend == "tpu" and bp != P and bp % 128):
        lanes = " that is the padded p or a multiple of 128 (TPU lanes)" if backend == "tpu" else ""
        return f"expected a power of two >= {MIN_TILE} dividing the padded p = {P}{lanes}"
    return None


def _default_block_p(backend: str, P: int) -> int:
    return min(P, 128 if backend == "tpu" else 64)


def _compiler_params(backend: str):
    if backend == "gpu":
        from jax.experimental.pallas import triton as pltriton
        return pltriton.CompilerParams(num_warps=4, num_stages=2)
    if backend == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))
    return None


# ----------------------------------------------------------------------------- in-kernel math

def _dot(a, b, contract, acc, mm_dtype=None):
    """2-D a . b contracting a's axis contract[0] with b's axis contract[1], accumulated in acc.
    Without mm_dtype the operands stay in acc at full precision (no TF32 on GPU)."""
    if mm_dtype is not None:
        a, b, precision = a.astype(mm_dtype), b.astype(mm_dtype), lax.Precision.DEFAULT
    else:
        a, b, precision = a.astype(acc), b.astype(acc), lax.Precision.HIGHEST
    dims = (((contract[0],), (contract[1],)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=acc)


def _chunk_decays(lcol, lrow, q, acc):
    """From the chunk's log-decays as a column (Q, 1) and a row (1, Q): the decay matrix
    L[t, s] = exp(l_{s+1} + ... + l_t) for s <= t (0 above), exp of the cumulative sums
    (Q, 1), each token's decay to the chunk's end exp(l_{s+1} + ... + l_{Q-1}) (Q, 1), and the
    chunk's whole decay (a scalar). Every sum is of same-signed terms: nothing cancels."""
    t_idx = lax.broadcasted_iota(jnp.int32, (q, q), 0)
    s_idx = lax.broadcasted_iota(jnp.int32, (q, q), 1)
    causal = t_idx >= s_idx
    later = jnp.where(t_idx > s_idx, lcol, 0.0)                 # [k, s] = l_k for k > s
    seg = _dot(causal.astype(acc), later, (1, 0), acc)          # [t, s] = sum_{s<k<=t} l_k
    decay = jnp.exp(jnp.where(causal, seg, -jnp.inf))
    cum = jnp.sum(jnp.where(causal, lrow, 0.0), axis=1, keepdims=True)          # sum_{k<=t} l_k
    after = jnp.sum(jnp.where(s_idx > t_idx, lrow, 0.0), axis=1, keepdims=True)  # sum_{k>t} l_k
    return decay, jnp.exp(cum), jnp.exp(after), jnp.exp(jnp.sum(lrow)), t_idx, s_idx


def _fwd_kernel(*refs, q, nc, bp, has_xdiag, save_starts, acc, mm_dtype):
    xs_ref, lcol_ref, lrow_ref, B_ref, C_ref, h0_ref, *rest = refs
    xdiag_ref = rest.pop(0) if has_xdiag else None
    y_ref, hT_ref = rest[0], rest[1]
    starts_ref = rest[2] if save_starts else None

    def chunk(c, S):
        rows = pl.ds(pl.multiple_of(c * q, q), q)
        u = xs_ref[rows, :].astype(acc)
        Bc, Cc = B_ref[rows, :].astype(acc), C_ref[rows, :].astype(acc)
        decay, ecum, eafter, etotal, _, _ = _chunk_decays(
            lcol_ref[rows, :].astype(acc), lrow_ref[pl.ds(c, 1), :].astype(acc), q, acc)
        M = _dot(Cc, Bc, (1, 1), acc, mm_dtype) * decay
        y = _dot(M, u, (1, 0), acc, mm_dtype) + ecum * _dot(Cc, S, (1, 1), acc)
        if has_xdiag:
            y = y + jnp.sum(Cc * Bc, axis=1, keepdims=True) * xdiag_ref[rows, :].astype(acc)
        y_ref[rows, :] = y.astype(y_ref.dtype)
        if save_starts:
            starts_ref[pl.ds(pl.multiple_of(c * bp, bp), bp), :] = S
        return etotal * S + _dot(u * eafter, Bc, (0, 0), acc, mm_dtype)

    hT_ref[...] = lax.fori_loop(0, nc, chunk, h0_ref[...].astype(acc))


def _bwd_kernel(*refs, q, nc, bp, has_xdiag, acc, mm_dtype):
    xs_ref, lcol_ref, lrow_ref, B_ref, C_ref, starts_ref, dy_ref, dhT_ref, *rest = refs
    xdiag_ref = rest.pop(0) if has_xdiag else None
    dxs_ref, dl_ref, dB_ref, dC_ref, dh0_ref = rest[:5]
    dxdiag_ref = rest[5] if has_xdiag else None

    ones = jnp.ones((q, 1), acc)

    def chunk(k, dS):                      # dS: dLoss / d(state at the chunk's end), (bp, n)
        c = nc - 1 - k
        rows = pl.ds(pl.multiple_of(c * q, q), q)
        u = xs_ref[rows, :].astype(acc)
        Bc, Cc = B_ref[rows, :].astype(acc), C_ref[rows, :].astype(acc)
        S = starts_ref[pl.ds(pl.multiple_of(c * bp, bp), bp), :]
        dy = dy_ref[rows, :].astype(acc)
        decay, ecum, eafter, etotal, t_idx, s_idx = _chunk_decays(
            lcol_ref[rows, :].astype(acc), lrow_ref[pl.ds(c, 1), :].astype(acc), q, acc)
        M = _dot(Cc, Bc, (1, 1), acc, mm_dtype) * decay
        # y = M u + ecum (C S^T) [+ diag(C B^T) xdiag] ;  S' = etotal S + (eafter u)^T B
        BdS = _dot(Bc, dS, (1, 1), acc)                          # (Q, bp) = B dS^T
        dxs_ref[rows, :] = (_dot(M, dy, (0, 0), acc, mm_dtype) + eafter * BdS).astype(dxs_ref.dtype)
        dM = _dot(dy, u, (1, 1), acc, mm_dtype)                  # (Q, Q), only its causal part is used
        dG = dM * decay
        CS = _dot(Cc, S, (1, 1), acc)                            # (Q, bp)
        dC = _dot(dG, Bc, (1, 0), acc, mm_dtype) + ecum * _dot(dy, S, (1, 0), acc)
        dB = _dot(dG, Cc, (0, 0), acc, mm_dtype) + eafter * _dot(u, dS, (1, 0), acc)
        if has_xdiag:
            xd = xdiag_ref[rows, :].astype(acc)
            dxdiag_ref[rows, :] = (jnp.sum(Cc * Bc, axis=1, keepdims=True) * dy).astype(dxdiag_ref.dtype)
            e = jnp.sum(dy * xd, axis=1, keepdims=True)
            dC, dB = dC + e * Bc, dB + e * Cc
        dC_ref[rows, :] = dC
        dB_ref[rows, :] = dB
        # dL/dl_k: the decay matrix (pairs t >= k > s), the inter-chunk read (t >= k), the chunk's
        # whole decay (every k) and the decays to the end (s < k). Every per-token sum stays a (Q, 1)
        # column and crosses tokens by a masked matmul: laying a row-sum out as a row (`v[None, :]`)
        # lowers to a sublane gather, which Mosaic cannot emit for TPU v4.
        P = dM * M
        before_k = _dot(P, (t_idx < s_idx).astype(acc), (1, 0), acc)   # [t, k] = sum_{s<k} P[t, s]
        from_L = _dot(jnp.where(t_idx >= s_idx, before_k, 0.0), ones, (0, 0), acc)    # sum_{t>=k}
        read = jnp.sum(dy * ecum * CS, axis=1, keepdims=True)                       # indexed by t
        from_read = _dot((s_idx >= t_idx).astype(acc), read, (1, 0), acc)           # sum_{t>=k}
        to_end = jnp.sum(u * BdS, axis=1, keepdims=True) * eafter                   # indexed by s
        from_end = _dot((s_idx < t_idx).astype(acc), to_end, (1, 0), acc)           # sum_{s<k}
        from_total = jnp.sum(dS * S) * etotal
        dl_ref[rows, :] = from_L + from_read + from_end + from_total
        return etotal * dS + _dot(dy * ecum, Cc, (0, 0), acc)

    dh0_ref[...] = lax.fori_loop(0, nc, chunk, dhT_ref[...].astype(acc))


# ----------------------------------------------------------------------------- pallas_calls

class _Grid:
    """The launch geometry of one kernel call: sizes, the grid (b, h, blocks of p) and block specs."""

    def __init__(self, cfg, xs, B):
        self.q, self.bp, self.backend, self.acc, self.mm_dtype = cfg
        self.b, self.h, self.T, self.P = xs.shape
        g, self.n = B.shape[1], B.shape[3]
        self.nc, self.npb = self.T // self.q, self.P // self.bp
        b, h, T, P, n, bp, nc, rep = self.b, self.h, self.T, self.P, self.n, self.bp, self.nc, self.h // g
        # (lax.div: a floor division lowers through sign(), which Mosaic resolves per TPU generation)
        self.row = pl.BlockSpec((None, None, T, bp), lambda i, j, k: (i, j, 0, k))
        self.chan = pl.BlockSpec((None, None, T, n), lambda i, j, k: (i, lax.div(j, jnp.int32(rep)), 0, 0))
        self.lcol = pl.BlockSpec((None, None, T, 1), lambda i, j, k: (i, j, 0, 0))
        self.lrow = pl.BlockSpec((None, None, nc, self.q), lambda i, j, k: (i, j, 0, 0))
        self.state = pl.BlockSpec((None, None, bp, n), lambda i, j, k: (i, j, k, 0))
        self.starts = pl.BlockSpec((None, None, None, nc * bp, n), lambda i, j, k: (i, j, k, 0, 0))
        self.partial_chan = pl.BlockSpec((None, None, None, T, n), lambda i, j, k: (i, j, k, 0, 0))
        self.partial_l = pl.BlockSpec((None, None, None, T, 1), lambda i, j, k: (i, j, k, 0, 0))

    def decays(self, l):
        """l (b, h, T) as the kernels read it: a column per token and a row per chunk."""
        return [l[..., None], l.reshape(self.b, self.h, self.nc, self.q)]

    def shape(self, *dims):
        return jax.ShapeDtypeStruct(dims, self.acc)

    def launch(self, kernel, name, in_specs, args, out_shape, out_specs, **static):
        kernel = functools.partial(kernel, q=self.q, nc=self.nc, bp=self.bp, acc=self.acc,
                                   mm_dtype=self.mm_dtype, **static)
        return pl.pallas_call(
            kernel, out_shape=out_shape, grid=(self.b, self.h, self.npb), in_specs=in_specs,
            out_specs=out_specs, interpret=self.backend == "interpret",
            compiler_params=_compiler_params(self.backend), name=name)(*args)


def _forward_call(cfg, xs, l, B, C, h0, xdiag, save_starts):
    k = _Grid(cfg, xs, B)
    in_specs = [k.row, k.lcol, k.lrow, k.chan, k.chan, k.state] + ([k.row] if xdiag is not None else [])
    args = [xs, *k.decays(l), B, C, h0] + ([xdiag] if xdiag is not None else [])
    out_shape = [k.shape(k.b, k.h, k.T, k.P), k.shape(k.b, k.h, k.P, k.n)]
    out_specs = [k.row, k.state]
    if save_starts:
        out_shape.append(k.shape(k.b, k.h, k.npb, k.nc * k.bp, k.n))
        out_specs.append(k.starts)
    return k.launch(_fwd_kernel, "ssmgate_ssd_fwd", in_specs, args, out_shape, out_specs,
                    has_xdiag=xdiag is not None, save_starts=save_starts)


def _backward_call(cfg, xs, l, B, C, starts, dy, dhT, xdiag):
    k = _Grid(cfg, xs, B)
    in_specs = [k.row, k.lcol, k.lrow, k.chan, k.chan, k.starts, k.row, k.state]
    args = [xs, *k.decays(l), B, C, starts, dy, dhT]
    out_shape = [k.shape(k.b, k.h, k.T, k.P), k.shape(k.b, k.h, k.npb, k.T, 1),
                 k.shape(k.b, k.h, k.npb, k.T, k.n), k.shape(k.b, k.h, k.npb, k.T, k.n), k.shape(k.b, k.h, k.P, k.n)]
    out_specs = [k.row, k.partial_l, k.partial_chan, k.partial_chan, k.state]
    if xdiag is not None:
        in_specs.append(k.row)
        args.append(xdiag)
        out_shape.append(k.shape(k.b, k.h, k.T, k.P))
        out_specs.append(k.row)
    return k.launch(_bwd_kernel, "ssmgate_ssd_bwd", in_specs, args, out_shape, out_specs,
                    has_xdiag=xdiag is not None)


@functools.lru_cache(maxsize=None)
def _kernel_fn(cfg, has_xdiag: bool):
    """The kernel pair as one differentiable function of head-major, padded arrays:
    (xs (b,h,T,P), l (b,h,T), B, C (b,g,T,n), h0 (b,h,P,n)[, xdiag (b,h,T,P)]) -> (y, h_T)."""

    @jax.custom_vjp
    def ssd(*arrays):
        xs, l, B, C, h0, xdiag = _unpack(arrays, has_xdiag)
        y, hT = _forward_call(cfg, xs, l, B, C, h0, xdiag, save_starts=False)
        return y, hT

    def fwd(*arrays):
        xs, l, B, C, h0, xdiag = _unpack(arrays, has_xdiag)
        y, hT, starts = _forward_call(cfg, xs, l, B, C, h0, xdiag, save_starts=True)
        return (y, hT), (xs, l, B, C, starts, xdiag)

    def bwd(res, cotangents):
        xs, l, B, C, starts, xdiag = res
        dy, dhT = cotangents
        outs = _backward_call(cfg, xs, l, B, C, starts, dy.astype(cfg[3]), dhT.astype(cfg[3]), xdiag)
        dxs, dl, dB, dC, dh0 = outs[:5]
        b, h, g = xs.shape[0], xs.shape[1], B.shape[1]
        group_sum = lambda d: d.sum(axis=2).reshape(b, g, h // g, *d.shape[3:]).sum(axis=2)
        grads = [dxs.astype(xs.dtype), dl.sum(axis=(2, 4)).astype(l.dtype),
                 group_sum(dB).astype(B.dtype), group_sum(dC).astype(C.dtype), dh0]
        if has_xdiag:
            grads.append(outs[5].astype(xdiag.dtype))
        return tuple(grads)

    ssd.defvjp(fwd, bwd)
    return ssd


def _unpack(arrays, has_xdiag):
    return (*arrays[:5], arrays[5] if has_xdiag else None)


@functools.lru_cache(maxsize=None)
def _chunked_fn(q: int, has_xdiag: bool):
    """`chunked_ssd` on the kernels' head-major, padded arrays (the padding is inert there too)."""
    def ssd(*arrays):
        xs, l, B, C, h0, xdiag = _unpack(arrays, has_xdiag)
        tokens_first = lambda a: None if a is None else jnp.swapaxes(a, 1, 2)
        y, hT = chunked_ssd(tokens_first(xs), tokens_first(l), [(tokens_first(B), tokens_first(C))], h0, q,
                            tokens_first(xdiag))
        return tokens_first(y), hT
    return ssd


@functools.lru_cache(maxsize=None)
def _warn_tpu_chunked(T: int, q: int, bp: int, N: int, has_xdiag: bool) -> None:
    need = tpu_vmem.kernel_bytes(T, q, bp, N, has_xdiag) / 2**20
    warnings.warn(f"pallas_ssd: lowered for TPU, {T} tokens (chunk {q}, {bp} x {N} state rows per program) "
                  f"would need ~{need:.1f} MiB of VMEM per kernel program, over the "
                  f"{tpu_vmem.BUDGET / 2**20:.0f} MiB that every TPU generation gives it; the TPU program runs "
                  "the chunked form (same result) instead", stacklevel=5)


@contextlib.contextmanager
def partitioned_over(n_devices: int):
    """Kernels traced inside are lowered for a program partitioned over `n_devices` devices (as with
    auto.for_backend, a function jit traced before keeps its first trace)."""
    token = _SPAN.set(int(n_devices))
    try:
        yield
    finally:
        _SPAN.reset(token)


def _span() -> int:
    n = _SPAN.get()
    return jax.device_count() if n is None else n


@functools.lru_cache(maxsize=None)
def _warn_partitioned(n_devices: int) -> None:
    warnings.warn(f"pallas_ssd: the gpu and tpu kernels are custom calls XLA cannot partition, and this program may "
                  f"span {n_devices} devices; on gpu and tpu it runs the chunked form (same result) instead",
                  stacklevel=5)


# ----------------------------------------------------------------------------- public entry

def pallas_ssd(xs_bthp, logdecay_bth, B_btgn, C_btgn, h0_bhpn, chunk: int, xdiag_bthp=None, *,
               backend: str | None = None, block_p: int | None = None, mm_dtype=None):
    """The drop-in kernel form of `chunked_ssd` for one (B, C) block (G groups, G dividing h).

    xs: inputs times their write scale (b, t, h, p); logdecay (b, t, h) <= 0; B, C (b, t, G, n);
    h0 (b, h, p, n); xdiag optional (b, t, h, p), adds (C_t . B_t) xdiag_t to y_t. chunk: tokens
    per chunk (rounded up to a power of two >= 16). block_p: state rows per program, a power of
    two >= 16 dividing the padded p (default min(64, padded p); on TPU, whose tiles are 128 lanes
    wide, the padded p or a multiple of 128: default min(128, padded p); with backend=None a
    block_p Mosaic cannot tile falls back to that default on TPU only). mm_dtype: operand dtype of
    the data matmuls (e.g. jnp.bfloat16 for bf16 models), None for the compute dtype at full
    precision. backend: None (the kernel of the platform this is lowered for, see the module
    docstring) or one of BACKENDS for that kernel alone. The kernels hold whole sequences in VMEM:
    with backend=None, a length whose TPU kernel would not fit (tpu_vmem.py) lowers for TPU as the
    chunked form instead, with a warning; an explicit backend='tpu' keeps the kernel. So does a
    program partitioned over several devices (`partitioned_over`), on gpu and tpu.
    Returns y (b, t, h, p) and the final state (b, h, p, n), in the compute dtype of xs.
    """
    backend = resolve_backend(backend)
    b, t, h, p = xs_bthp.shape
    G, n = B_btgn.shape[2], B_btgn.shape[3]
    acc = jnp.dtype(xs_bthp.dtype)
    q = _pow2_at_least(chunk)
    T = -(-t // q) * q
    P, N = _pow2_at_least(p), _pow2_at_least(n)
    if block_p is not None:
        # An explicit backend is held to its rule; with backend=None the Triton/interpret rule is, and
        # the TPU branch below replaces a block_p Mosaic cannot tile by its default (same result).
        error = _block_p_error(backend or "gpu", block_p, P)
        if error:
            raise ValueError(f"pallas_ssd: block_p = {block_p!r}; {error}")
    mm = None if mm_dtype is None else jnp.dtype(mm_dtype)

    def run_on(kernel_backend):
        bp = block_p
        if bp is None or _block_p_error(kernel_backend, bp, P):
            bp = _default_block_p(kernel_backend, P)
        if backend is None and kernel_backend != "interpret" and _span() > 1:
            _warn_partitioned(_span())
            return _chunked_fn(q, xdiag_bthp is not None)
        if backend is None and kernel_backend == "tpu" and not tpu_vmem.fits(T, q, bp, N, xdiag_bthp is not None,
                                                                             acc.itemsize):
            _warn_tpu_chunked(T, q, bp, N, xdiag_bthp is not None)
            return _chunked_fn(q, xdiag_bthp is not None)
        return _kernel_fn((q, int(bp), kernel_backend, acc, mm), xdiag_bthp is not None)

    def heads_first(arr, channels):          # (b, t, k, c) -> (b, k, T, C): padded, head-major
        return pad_axis(pad_axis(jnp.swapaxes(arr, 1, 2), 2, T), 3, channels)

    arrays = [heads_first(xs_bthp, P), pad_axis(jnp.swapaxes(logdecay_bth, 1, 2), 2, T),
              heads_first(B_btgn.astype(acc), N), heads_first(C_btgn.astype(acc), N),
              pad_axis(pad_axis(h0_bhpn.astype(acc), 2, P), 3, N)]
    if xdiag_bthp is not None:
        arrays.append(heads_first(xdiag_bthp.astype(acc), P))
    if backend is not None:
        y, hT = run_on(backend)(*arrays)
    else:
        # One branch per kernel backend (the same callable for cuda and rocm, so they share one; cpu
        # is the interpreting default); lowering keeps only the lowering platform's branch.
        kernels = {kb: run_on(kb) for kb in sorted(set(PLATFORM_BACKENDS.values()))}
        branches = {platform: kernels[kb] for platform, kb in PLATFORM_BACKENDS.items() if kb != "interpret"}
        y, hT = lax.platform_dependent(*arrays, default=kernels["interpret"], **branches)
    return jnp.swapaxes(y[:, :, :t, :p], 1, 2), hT[:, :, :p, :n]
