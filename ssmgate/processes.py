"""Whether a process of this host is alive: the test of lock and temporary files that carry their
writer's pid (the run lock without flock, a prepare's temporary shards)."""
from __future__ import annotations

import os


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
