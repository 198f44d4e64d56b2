"""XLA flags that ssmgate sets by default, before any JAX backend starts (`import ssmgate` does it).

Each default is added to `XLA_FLAGS` only when `XLA_FLAGS` does not name that flag already, so a
user's own setting wins; a backend that was already initialized keeps the flags it started with.

- `--xla_cpu_enable_concurrency_optimized_scheduler=false`: XLA:CPU's default scheduler orders a
  program for as many concurrently running operations as possible, which on a 2-core machine makes
  them compete for the cores and the caches. Measured 2026-12-01 on the 2-core CI VM class: P1's
  quick KV training step (2-layer Mamba-2, 2 replicas x 32 x 201 tokens) 210 ms against 256-285,
  the Mamba-2 mixer's gradient 40-43 ms against 56-59; P2's state-tracking rows unchanged; same
  losses to the last printed digit (only the order of operations changes). The flag acts on XLA:CPU
  only.
"""
from __future__ import annotations

import os
import re

DEFAULTS = {"xla_cpu_enable_concurrency_optimized_scheduler": "false"}


def with_flag(xla_flags: str, name: str, value: str) -> str:
    """xla_flags with `--name=value` appended, unless it sets the flag already."""
    if re.search(rf"--{re.escape(name)}(=|\s|$)", xla_flags):
        return xla_flags
    return f"{xla_flags} --{name}={value}".strip()


def apply_defaults(environ=os.environ) -> None:
    """Adds DEFAULTS to XLA_FLAGS; SSMGATE_XLA_DEFAULTS=0 adds none (e.g. on an accelerator machine
    whose jaxlib may not know an XLA:CPU flag: launch/device_bench.sh)."""
    if environ.get("SSMGATE_XLA_DEFAULTS", "1") == "0":
        return
    flags = environ.get("XLA_FLAGS", "")
    for name, value in DEFAULTS.items():
        flags = with_flag(flags, name, value)
    environ["XLA_FLAGS"] = flags


CPU_DEVICES_FLAG = "xla_force_host_platform_device_count"


def set_cpu_devices(n: int, environ=os.environ) -> None:
    """Splits the host CPU into `n` XLA devices (JAX's `jax_num_cpu_devices`), so that a mesh axis
    over them, e.g. a sweep's replica axis, runs its shards on the cores side by side. Must run
    before a JAX backend starts. An XLA_FLAGS that sets --xla_force_host_platform_device_count to
    another count is an error (JAX's setting would silently override it)."""
    if n < 1:
        raise ValueError(f"--cpu_devices={n}: expected an integer >= 1")
    given = re.search(rf"--{CPU_DEVICES_FLAG}=(\d+)", environ.get("XLA_FLAGS", ""))
    if given and int(given.group(1)) != n:
        raise ValueError(f"--cpu_devices={n}: XLA_FLAGS already sets --{CPU_DEVICES_FLAG}={given.group(1)}; "
                         "expected one of the two, or the same count in both")
    import jax
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # JAX refuses once a backend has started
        have = len(jax.devices("cpu"))
        if have != n:
            raise RuntimeError(f"--cpu_devices={n}: the JAX backend of this process has already started with {have} "
                               "CPU device(s); the count can only be set before the first JAX computation") from None
