"""One writer per run directory: an exclusive lock on <run_dir>/.lock, held for the whole run.

The lock is an `fcntl.flock`, which the kernel releases when its process ends however it ends, so
a killed holder never leaves a stale lock behind; the file keeps the last holder's pid, host and
start time for the error message. Run directories on a bucket (gs://) cannot be locked this way:
there the lock is skipped with a warning, and one writer is the user's part.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from ssmgate.train.run_dir import RunDir


class RunDirBusy(RuntimeError):
    """Another process holds the run directory."""


class RunLock:
    def __init__(self, run_dir: RunDir):
        self.run_dir, self._fd = run_dir, None

    def __enter__(self) -> "RunLock":
        if not self.run_dir.local:
            print(f"[ssmgate] warning: {self.run_dir.path} is not a local path; it is not locked (one writer "
                  f"at a time is up to you)", flush=True)
            return self
        path = self.run_dir.file(".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip()
            os.close(fd)
            try:
                h = json.loads(holder)
                who = f"pid {h['pid']} on {h['host']} since {h['since']}"
            except (ValueError, KeyError, TypeError):
                who = "another process"
            raise RunDirBusy(f"--run_dir={self.run_dir.path} is in use by {who} (lock {path}); wait for that run "
                             f"to end or choose another --run_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
