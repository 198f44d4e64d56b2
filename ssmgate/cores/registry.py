"""The one list of the recurrent cores, for what runs every core by name: the core benchmark
(`python -m ssmgate.bench cores`), the device checks and the TPU cost estimates.

An entry says how to call the core from a dict of named inputs, which exact algorithms it has, the
shapes and value ranges of its inputs (over the benchmark's sizes b, t, h, p, n, g, r and the MIMO
rank k) and, where modelled, its forward FLOP count. A core added here is benchmarked, checked
against its float64 sequential run and estimated on TPU without further edits (docs/extending.md,
"Adding a core").
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from ssmgate.cores.damped import damped
from ssmgate.cores.mimo import rotation_mimo
from ssmgate.cores.rotation import rotation
from ssmgate.cores.scalar_decay import scalar_decay

# How an input is drawn for benchmarks and checks: the ranges a trained Mamba-2/3 layer sees.
DRAWS = ("normal", "normal_over_sqrt_n", "log_uniform_dt", "minus_uniform_1_16", "uniform_1_16", "pi_tanh_normal",
         "sigmoid_normal")


@dataclasses.dataclass(frozen=True)
class Input:
    name: str
    axes: str   # over b t h p n g r k, e.g. "bthp"
    draw: str   # one of DRAWS


@dataclasses.dataclass(frozen=True)
class Core:
    name: str
    fn: Callable
    positional: tuple[str, ...]          # the inputs passed by position, in the core's order
    inputs: tuple[Input, ...]            # every input, in the order they are drawn
    algorithms: tuple[str, ...]          # its exact algorithms; "sequential" (the reference) first
    keyword: tuple[str, ...] = ()        # inputs passed by keyword
    options: tuple[tuple[str, object], ...] = ()   # fixed keyword options of the benchmark's call
    flops: Optional[Callable[..., float]] = None   # forward FLOPs (algorithm, chunk, b, t, h, p, n, g, r)
    short_chunks: bool = False           # its chunked form costs O(chunk^2) per chunk: shorter chunks are tried

    def call(self, algorithm: str, chunk_size=None) -> Callable[[dict], tuple]:
        """f(inputs) -> (y, final_state) with this algorithm and the fixed options."""
        def run(i: dict):
            return self.fn(*[i[a] for a in self.positional], **{k: i[k] for k in self.keyword},
                           **dict(self.options), algorithm=algorithm, chunk_size=chunk_size)
        return run


def _chunked_ssd_flops(cb_per_token: float, q: int, b, t, h, p, n) -> float:
    return float(b * t * (cb_per_token + 2 * q * h * p + 4 * h * p * n))


def _sequential_flops(algorithm: str, b, t, per_token: float) -> float:
    # the associative scan's up- and down-sweeps each combine ~t elements
    return float(b * t * per_token * (2 if algorithm == "associative" else 1))


# Multiply-adds count as 2 FLOPs. Elementwise work counts where it is of the order of the matmuls
# (the sequential update) and is ignored where it is O(t h) or O(t h Q).
def scalar_decay_flops(algorithm, chunk, b, t, h, p, n, g, r) -> float:
    if algorithm == "chunked":
        return _chunked_ssd_flops(2 * chunk * n * g, chunk, b, t, h, p, n)
    return _sequential_flops(algorithm, b, t, 3 * h * p * n + 2 * h * p * n)  # a*h + u B^T, then h C


def rotation_flops(algorithm, chunk, b, t, h, p, n, g, r) -> float:
    if algorithm == "chunked":  # the rotated pairs' C B products are per head
        return _chunked_ssd_flops(2 * chunk * (2 * r * h + (n - 2 * r) * g), chunk, b, t, h, p, n)
    return _sequential_flops(algorithm, b, t, 3 * h * p * n + 2 * h * p * n)


def damped_flops(algorithm, chunk, b, t, h, p, n, g, r) -> float:
    if algorithm == "chunked":
        q, rest = chunk, n - 2 * r
        # Per head and pair: the transports (Q + 1 2x2 products per token), Phi B (2x2 by 2-vector
        # for Q sources) and the kernel's C reads; then the SSD-like matmuls on the 2r pair channels,
        # and the scalar-decay SSD of the other channels.
        pairs = (h * r * (16 * (q + 1) + 12 * q + 8) + 2 * q * h * p + 8 * h * p * r) if r else 0
        others = (2 * q * rest * g + 2 * q * h * p + 4 * h * p * rest) if rest else 0
        return float(b * t * (pairs + others))
    # 2x2 pair update (4 mul-add per pair entry) on 2r rows, decay on the rest, readout.
    return _sequential_flops(algorithm, b, t, h * p * (2 * 2 * 2 * r + (n - 2 * r)) + 4 * h * p * n)


# x, dt, B, C, D: what every core of the Mamba family reads
SHARED_INPUTS = (Input("x", "bthp", "normal"), Input("dt", "bth", "log_uniform_dt"),
                 Input("B", "btgn", "normal_over_sqrt_n"), Input("C", "btgn", "normal_over_sqrt_n"),
                 Input("D", "h", "normal"))
ROTATING_INPUTS = (Input("A", "h", "minus_uniform_1_16"), Input("theta", "bthr", "pi_tanh_normal"),
                   Input("trap", "bth", "sigmoid_normal"))
_MIMO_SHAPES = {"x": "bthkp", "B": "btgkn", "C": "btgkn"}

CORES = {c.name: c for c in (
    Core("scalar_decay", scalar_decay, ("x", "dt", "A", "B", "C", "D"),
         SHARED_INPUTS + (Input("A", "h", "minus_uniform_1_16"),),
         ("sequential", "associative", "chunked", "pallas"), flops=scalar_decay_flops),
    Core("rotation", rotation, ("x", "dt", "A", "B", "C", "theta", "D"), SHARED_INPUTS + ROTATING_INPUTS,
         ("sequential", "associative", "chunked", "pallas"), keyword=("trap",), flops=rotation_flops),
    Core("damped", damped, ("x", "dt", "a", "nu", "B", "C", "D"),
         SHARED_INPUTS + (Input("a", "h", "uniform_1_16"), Input("nu", "bthr", "pi_tanh_normal"),
                    Input("trap", "bth", "sigmoid_normal")),
         ("sequential", "associative", "chunked"), keyword=("trap",), options=(("regime", "under"),),
         flops=damped_flops, short_chunks=True),
    # Mamba-3's MIMO form: no FLOP model yet, so the CPU benchmark leaves it out (`benchmarked`).
    Core("rotation_mimo", rotation_mimo, ("x", "dt", "A", "B", "C", "theta", "D"),
         tuple(dataclasses.replace(i, axes=_MIMO_SHAPES.get(i.name, i.axes))
               for i in SHARED_INPUTS + ROTATING_INPUTS),
         ("sequential", "associative", "chunked"), keyword=("trap",)),
)}


def get(name: str) -> Core:
    if name not in CORES:
        raise ValueError(f"unknown core {name!r}; expected one of {', '.join(CORES)}")
    return CORES[name]


def benchmarked() -> tuple[str, ...]:
    """The cores with a FLOP model: what `python -m ssmgate.bench cores` times by default."""
    return tuple(name for name, c in CORES.items() if c.flops is not None)


def with_kernel() -> tuple[str, ...]:
    """The cores with a Pallas kernel."""
    return tuple(name for name, c in CORES.items() if "pallas" in c.algorithms)
