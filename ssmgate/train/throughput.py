"""Tokens per second and model FLOPs utilisation (MFU) for the progress line.

MFU follows the PaLM paper's convention (Chowdhery et al. 2022, appendix B): the FLOPs the model
needs per token, 6 N for N parameters (forward 2N, backward 4N; the recurrence's and attention's
own terms are left out, so MFU is a slight underestimate for long sequences), divided by the
peak FLOP/s of the devices the run uses. Peaks are the vendors' dense bf16 figures per chip; on a
CPU there is no such figure, so the machine's float32 matmul rate is measured once per process.
An accelerator missing from the table gets no MFU rather than a guessed one.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

# Dense bf16 peak FLOP/s per chip (vendor datasheets), matched against jax.Device.device_kind.
# Longer keys first: "TPU v5 lite" must not match "TPU v5".
PEAK_BF16_FLOPS = {
    "TPU v6 lite": 918e12,   # Trillium
    "TPU v5 lite": 197e12,   # v5e
    "TPU v5p": 459e12,
    "TPU v5": 459e12,        # v5p reports "TPU v5"
    "TPU v4": 275e12,
    "TPU v3": 123e12,
    "H200": 989e12,          # SXM, dense
    "H100": 989e12,          # SXM, dense (PCIe: 756e12)
    "A100": 312e12,
    "L4": 121e12,
    "B200": 2250e12,
}


@dataclasses.dataclass(frozen=True)
class Throughput:
    """What one training step processes: tokens (all replicas of a sweep) and model FLOPs."""
    tokens_per_step: int
    model_flops_per_step: float = 0.0  # 0: no MFU

    @classmethod
    def for_lm(cls, n_params: int, batch: int, seq_len: int, replicas: int = 1) -> "Throughput":
        tokens = batch * seq_len * replicas
        return cls(tokens, 6.0 * n_params * tokens)


def peak_for_kind(kind: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS.items():
        if key.lower() in kind.lower():
            return flops
    return None


@functools.lru_cache(maxsize=1)
def measured_cpu_matmul_flops(n: int = 1024, seconds: float = 0.3) -> float:
    """FLOP/s of a float32 n x n matmul on the host CPU, best of repeated runs (all cores)."""
    a = jax.device_put(jnp.ones((n, n), jnp.float32), jax.local_devices(backend="cpu")[0])
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best


def peak_flops(devices=None) -> tuple[float | None, str]:
    """(peak FLOP/s of all `devices` together, how it was obtained); (None, why) if unknown."""
    devices = list(jax.devices() if devices is None else devices)
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        # Split CPU devices (--cpu_devices) share the same cores: the machine's rate is the peak.
        return measured_cpu_matmul_flops(), "measured float32 matmul on this CPU"
    per_chip = peak_for_kind(kind)
    if per_chip is None:
        return None, f"no peak FLOP/s known for {kind!r}"
    return per_chip * len(devices), f"{len(devices)} x {kind} at {per_chip / 1e12:.0f} TFLOP/s bf16"


def format_rate(tokens_per_s: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.1f}{unit}"
    return f"{tokens_per_s:.0f}"
