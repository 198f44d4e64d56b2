"""glibc malloc settings for ssmgate's command-line programs, applied by re-executing them once.

XLA:CPU allocates the temporaries of every run of a compiled program with malloc. glibc serves
large blocks with fresh pages from the kernel and gives them back when they are freed, so each
training step faults all its temporaries in again, 4 KiB at a time. Measured 2026-12-02 on the
2-core CI VM class (a firecracker VM, where a fault is expensive): one step of P2's parity row
(native Mamba-3, 2 replicas x 128 x 127 tokens) took 68,000 minor page faults and 350-372 ms; with
TUNABLES, 460 faults and 270-287 ms. A sweep of 16 small Mamba-2 models (bench sweep, small size)
went from 123-155 to 101-114 ms per step; the single runs it is compared with, whose temporaries
are small, stayed the same (5.6-6.0 ms).

TUNABLES keep freed memory in the process (no separately mapped blocks, no trimming) and back
malloc's heap with transparent huge pages where the kernel allows them (`madvise` mode). The cost:
the resident set does not shrink after a peak. `python -m ssmgate.main | ssmgate.reproduce |
ssmgate.bench` re-execute themselves once with them added to GLIBC_TUNABLES (names the user set
there win) at `import ssmgate`, before anything else has run; SSMGATE_MALLOC_TUNING=0 turns this
off. Library imports, pytest and other entry points are left alone.
"""
from __future__ import annotations

import os
import platform
import sys
from typing import Mapping, Optional, Sequence

TUNABLES = {"glibc.malloc.hugetlb": "1", "glibc.malloc.mmap_max": "0",
            "glibc.malloc.trim_threshold": str(64 << 30)}
ENTRY_POINTS = ("ssmgate.main", "ssmgate.reproduce", "ssmgate.bench")
OPT_OUT = "SSMGATE_MALLOC_TUNING"


def _items(value: str) -> list[str]:
    return [item for item in value.split(":") if item]


def with_tunables(value: str) -> str:
    """A GLIBC_TUNABLES value with TUNABLES appended for the names it does not set."""
    items = _items(value)
    named = {item.split("=", 1)[0] for item in items}
    return ":".join(items + [f"{k}={v}" for k, v in TUNABLES.items() if k not in named])


def without_tunables(value: str) -> str:
    """A GLIBC_TUNABLES value with exactly TUNABLES' settings removed (a user's own values kept)."""
    ours = {f"{k}={v}" for k, v in TUNABLES.items()}
    return ":".join(item for item in _items(value) if item not in ours)


def entry_module(orig_argv: Sequence[str]) -> Optional[str]:
    """The module of `python [options] -m module ...`, or None for any other command line."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg.startswith("-m"):
            return arg[2:]
        if arg in ("-X", "-W"):
            next(args, None)  # the option's value
        elif arg.startswith("-c") or arg == "-" or not arg.startswith("-"):
            return None  # a command string, stdin or a script
    return None


def reexec_env(orig_argv: Sequence[str], environ: Mapping[str, str], libc: str) -> Optional[dict]:
    """The environment to re-execute this process with, or None when it should run as it is."""
    if libc != "glibc" or environ.get(OPT_OUT, "1") == "0" or entry_module(orig_argv) not in ENTRY_POINTS:
        return None
    value = environ.get("GLIBC_TUNABLES", "")
    tuned = with_tunables(value)
    if tuned == value:  # already set (also after the re-execution: no loop)
        return None
    return {**environ, "GLIBC_TUNABLES": tuned}


def reexec_if_needed() -> None:
    """Replaces this process by the same command line with TUNABLES, where reexec_env says so."""
    orig_argv = getattr(sys, "orig_argv", None)  # Python >= 3.10
    if not orig_argv or sys.platform != "linux":
        return
    env = reexec_env(orig_argv, os.environ, platform.libc_ver()[0])
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, list(orig_argv), env)
