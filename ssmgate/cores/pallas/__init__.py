"""Pallas kernels for the chunked cores (issue #9): `ssd.pallas_ssd` is the chunked SSD of
`ssmgate.cores._ssd.chunked_ssd` as one kernel per (batch, head, block of p) with a `custom_vjp`
whose backward pass is a second kernel. `scalar_decay` and `rotation` reach it with
`algorithm="pallas"`; on CPU it runs in Pallas' interpret mode (correct, slow: for tests)."""
from ssmgate.cores.pallas.ssd import BACKENDS, pallas_ssd

__all__ = ["pallas_ssd", "BACKENDS"]
