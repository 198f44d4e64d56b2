"""Whether the SSD kernels fit a TPU core's VMEM, from the sizes of their blocks.

Each program of `ssd.py` holds its whole sequence in VMEM: (T, channels) blocks of x, B, C, the
log-decays, dy and the gradients, each double-buffered by Pallas' pipeline, laid out in tiles of 8
sublanes x 128 lanes (a (T, 1) column takes T x 128 words). The backward kernel holds the most, and
its footprint grows with T. BUDGET leaves room for the kernels' temporaries under the smallest VMEM
of the generations we compile for; where the estimate and the compiler's verdict were compared,
and how far the budget reaches at the models' shapes: docs/cores.md "pallas". The TPU compile tests
(tests/cores/test_tpu_compile.py) compile on both sides of the line.
"""
from __future__ import annotations

VMEM_BYTES = 16 << 20    # TPU v4's VMEM per core; the scoped default of v5e, v5p and v6e
BUDGET = 14 << 20        # the rest: the kernels' (Q, Q) and (Q, channels) temporaries, Mosaic's own
SUBLANES, LANES = 8, 128


def _tile(rows: int, cols: int, itemsize: int) -> int:
    return -(-rows // SUBLANES) * SUBLANES * -(-cols // LANES) * LANES * itemsize


def kernel_bytes(T: int, q: int, bp: int, N: int, has_xdiag: bool, itemsize: int = 4) -> int:
    """VMEM of the backward kernel's program (the larger of the pair), buffers and temporaries."""
    nc = T // q
    row, col, chan, state = _tile(T, bp, itemsize), _tile(T, 1, itemsize), _tile(T, N, itemsize), _tile(bp, N, itemsize)
    blocks = (2 * row + 2 * col + 4 * chan + 2 * state + _tile(nc, q, itemsize) + _tile(nc * bp, N, itemsize)
              + (2 * row if has_xdiag else 0))     # in: xs, dy, l, B, C, dhT, lrow, starts; out: dxs, dl, dB, dC, dh0
    temporaries = 16 * _tile(q, max(q, N, bp), itemsize)
    return 2 * blocks + temporaries


def fits(T: int, q: int, bp: int, N: int, has_xdiag: bool, itemsize: int = 4) -> bool:
    return kernel_bytes(T, q, bp, N, has_xdiag, itemsize) <= BUDGET
