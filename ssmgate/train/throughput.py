"""Tokens per second and model FLOPs utilisation (MFU) for the progress line.

MFU is the model's training FLOPs per step (`model_flops`: 6 FLOPs per token for every
non-embedding matmul parameter and the head, as in the PaLM paper's appendix B, plus the sequence
mixing: attention's scores and values, or the SSM state's write and read, x3 for forward and
backward) per second, over the peak FLOP/s of the devices the run uses. Peaks are the vendors'
dense bf16 figures per chip; on a CPU there is no such figure, so the machine's float32 matmul
rate is measured once per process. An accelerator missing from the table gets no MFU rather than
a guessed one. The benchmarks (`ssmgate.bench`) use the same `model_flops`.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

from ssmgate.models.config import ModelCfg
from ssmgate.models.presets import count_breakdown

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
    def for_lm(cls, cfg: ModelCfg, batch: int, seq_len: int, replicas: int = 1) -> "Throughput":
        return cls(batch * seq_len * replicas, model_flops(cfg, batch, seq_len) * replicas)


def model_flops(cfg: ModelCfg, b: int, t: int) -> float:
    """Training FLOPs of one step of `b` sequences of `t` tokens: 6 N per token (N: non-embedding
    matmul parameters and the head's matmul) plus the sequence mixing (attention scores and values;
    the SSM state update and read), x3 for forward + backward."""
    counts = count_breakdown(cfg)
    dense = 6.0 * (counts["mixers"] + counts["mlp"] + cfg.vocab_size * cfg.d_model) * b * t
    if cfg.block in ("gpt_neox", "llama"):
        mixing = 2.0 * 2 * b * t * t * cfg.d_model / 2 * cfg.n_layers  # causal: half the t x t scores
    else:
        mixing = 2.0 * 2 * b * t * cfg.d_inner * cfg.d_state * cfg.n_layers  # write and read of the state
    return dense + 3.0 * mixing


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
