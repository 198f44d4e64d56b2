"""TPU slices without a TPU: the compile-only devices of a named topology, and each chip's figures.

A slice is named as Cloud TPU names it (`v5p-8`, `v5e-16`, `v6e-64`, `v4-32`) or as libtpu does
(`v5e:4x4`, `v5p:2x2x2`). With libtpu installed, `jax.experimental.topologies` describes the slice's
devices on any machine (hosts included: `v5e-16` is four hosts of four chips); nothing runs on them,
but `jit(...).lower(...).compile()` runs the real XLA:TPU and Mosaic compilers for them.

Cloud TPU's slice names count TensorCores for v4 and v5p (two per chip: `v5p-8` is 4 chips) and
chips for v5e and v6e. libtpu 0.0.42.1 names a slice by its chips per axis (3-D for v4/v5p, 2-D for
v5e/v6e). Compile-only v4 devices are TensorCores (two per chip, each with half the chip's HBM);
the others are chips.

Chip figures are the vendors' (Cloud TPU system architecture pages): HBM per chip, HBM bandwidth
and dense bf16 peak FLOP/s (the peak shared with the progress line's MFU, ssmgate.train.throughput).
What a program may hold is the compiler's figure instead: the HBM XLA:TPU says it can use on one
compile-only device, which it states when it refuses a program ("exceeds available HBM (15.75G)",
libtpu 0.0.42.1; tests/train/test_compile_step.py checks each generation's against libtpu): less
than the vendor's HBM for v4, v5e and v6e, more than the vendor's 95 GiB for v5p.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re

from ssmgate import platform_env
from ssmgate.train.throughput import peak_for_kind

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    hbm_bytes: int            # per chip, the vendor's figure
    usable_bytes: int         # per compile-only device, what XLA:TPU says it can use (to 0.01 GiB)
    hbm_bytes_per_s: float    # per chip
    cores_per_chip: int       # TensorCores; Cloud TPU's slice names count these for v4 and v5p
    dims: int                 # axes of libtpu's topology name
    device_kind: str          # jax.Device.device_kind, for the peak FLOP/s table


CHIPS = {
    "v4": Chip(32 * GIB, int(15.25 * GIB), 1.2e12, 2, 3, "TPU v4"),
    "v5e": Chip(16 * GIB, int(15.75 * GIB), 8.19e11, 1, 2, "TPU v5 lite"),
    "v5p": Chip(95 * GIB, int(95.74 * GIB), 2.765e12, 2, 3, "TPU v5"),
    "v6e": Chip(32 * GIB, int(31.25 * GIB), 1.64e12, 1, 2, "TPU v6 lite"),
}
# Chips per axis of the slices Cloud TPU sells (the smallest of each size).
GRID_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
GRID_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
           512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str         # as given
    generation: str   # v4, v5e, v5p, v6e
    libtpu_name: str  # e.g. v5p:2x2x1

    @property
    def chip(self) -> Chip:
        return CHIPS[self.generation]

    @property
    def chips(self) -> int:
        return math.prod(int(x) for x in self.libtpu_name.split(":")[1].split("x"))

    @property
    def peak_flops_per_chip(self) -> float:
        return peak_for_kind(self.chip.device_kind)

    def per_device(self, n_devices: int) -> tuple[int, float, float]:
        """(usable HBM bytes, peak FLOP/s, HBM bytes/s) of one of the slice's `n_devices` compile-only
        devices: a chip's, or a v4 TensorCore's half of it. The HBM is the compiler's usable figure."""
        share = n_devices // self.chips
        return self.chip.usable_bytes, self.peak_flops_per_chip / share, self.chip.hbm_bytes_per_s / share


def parse(name: str) -> Topology:
    """`v5p-8` (Cloud TPU) or `v5p:2x2x1` (libtpu) -> Topology; a ValueError names what is accepted."""
    accepted = (f"expected <generation>-<size> as Cloud TPU names slices (v5p-8, v5e-16, v6e-64, v4-32; "
                f"generations {', '.join(CHIPS)}) or libtpu's <generation>:<chips per axis> (v5e:4x4, v5p:2x2x2)")
    m = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod)([-:])([0-9x]+)", name.strip())
    if not m:
        raise ValueError(f"--topology={name}: unknown topology; {accepted}")
    generation = "v5e" if m.group(1) == "v5litepod" else m.group(1)
    chip = CHIPS[generation]
    if m.group(2) == ":":
        axes = m.group(3).split("x")
        if len(axes) != chip.dims or not all(a.isdigit() and int(a) > 0 for a in axes):
            raise ValueError(f"--topology={name}: {generation} takes {chip.dims} axes of chips; {accepted}")
        return Topology(name, generation, f"{generation}:{m.group(3)}")
    if not m.group(3).isdigit():
        raise ValueError(f"--topology={name}: the size after '-' is a count; {accepted}")
    size = int(m.group(3))
    chips, rest = divmod(size, chip.cores_per_chip)
    grid = (GRID_3D if chip.dims == 3 else GRID_2D).get(chips)
    if rest or grid is None:
        unit = "TensorCores (2 per chip)" if chip.cores_per_chip == 2 else "chips"
        sizes = sorted(k * chip.cores_per_chip for k in (GRID_3D if chip.dims == 3 else GRID_2D))
        raise ValueError(f"--topology={name}: {generation}-N counts {unit}; expected N in {sizes}")
    return Topology(name, generation, f"{generation}:{grid}")


# libtpu's host description, set for compile-only processes (children inherit it; any value keeps
# libtpu's start-up quiet).
NOMINAL_HOST = {"TPU_ACCELERATOR_TYPE": "v5p-8", "TPU_WORKER_HOSTNAMES": "localhost"}


@functools.lru_cache(maxsize=None)
def devices(libtpu_name: str) -> tuple:
    """The compile-only devices of a slice (all hosts'), in libtpu's order."""
    if not platform_env.libtpu_installed():
        raise RuntimeError("compiling for a TPU topology needs libtpu: `pip install 'jax[tpu]'` at the pinned jax "
                           "(make venv installs it)")
    if not platform_env.has_tpu_chip():
        # libtpu refuses a second process on the machine (a lock file) even when none runs on a chip;
        # compiling touches no chip, so compiling processes may share it.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        # libtpu's start-up looks for this host's accelerator and workers and, finding none, prints
        # warnings and an error trace, then goes on. A nominal single-host description (a user's own
        # values win) keeps it quiet; the compiled programs are the same (tests/test_platform_env.py).
        for name, value in NOMINAL_HOST.items():
            os.environ.setdefault(name, value)
    from jax.experimental import topologies
    return tuple(topologies.get_topology_desc(platform="tpu", topology_name=libtpu_name).devices)
