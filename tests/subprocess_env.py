"""The environment of a child process with fake CPU devices."""
import os


def with_cpu_devices(n: int, **extra: str) -> dict:
    """os.environ plus `n` host-platform devices in XLA_FLAGS, keeping the flags already there
    (tests/conftest.py's), plus `extra` variables."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
    return dict(os.environ, XLA_FLAGS=flags, **extra)
