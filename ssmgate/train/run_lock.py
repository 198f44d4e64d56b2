"""One writer per run directory: an exclusive lock on <run_dir>/.lock, held for the whole run.

The lock is an `fcntl.flock`, which the kernel releases when its process ends however it ends, so
a killed holder never leaves a stale lock behind; the file keeps the last holder's pid, host and
start time for the error message. Run directories on a bucket (gs://) cannot be locked this way:
there the lock is skipped with a warning, and one writer is the user's part.

Some shared filesystems have no flock (Lustre mounted without `flock`: ENOSYS; NFSv3 without
lockd: ENOLCK). There the lock is a file created with O_EXCL, `<run_dir>/.lock.excl`, holding the
holder's pid, host, start time and SLURM job id, and removed when the run ends. A holder killed
hard leaves it behind; the next run takes it over when the holder is provably gone (its pid is not
alive on this host, or it was an earlier start of this same SLURM job, which a requeue restarts
only after the old one ended) and otherwise refuses, naming the holder and the file to delete.
A lock file that cannot be written (a read-only filesystem, a full disk) is one `StorageError` line.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time

from ssmgate.processes import alive
from ssmgate.storage_error import StorageError, cause
from ssmgate.train.run_dir import RunDir

NO_FLOCK = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)
EXCL_NAME = ".lock.excl"


class RunDirBusy(RuntimeError):
    """Another process holds the run directory."""


def _holder() -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "slurm_job": os.environ.get("SLURM_JOB_ID")}).encode()


def _describe(text: str) -> tuple[dict, str]:
    try:
        h = json.loads(text)
        return h, f"pid {h['pid']} on {h['host']} since {h['since']}"
    except (ValueError, KeyError, TypeError):
        return {}, "another process"


class RunLock:
    def __init__(self, run_dir: RunDir):
        self.run_dir, self._fd, self._excl = run_dir, None, None

    def _busy(self, who: str, path) -> RunDirBusy:
        return RunDirBusy(f"--run_dir={self.run_dir.path} is in use by {who} (lock {path}); wait for that run to end "
                          f"or choose another --run_dir")

    def _unwritable(self, path, e: OSError) -> StorageError:
        return StorageError(f"--run_dir={self.run_dir.path}: cannot write the run lock {path}: {cause(e)}; nothing "
                            f"in the run directory was changed")

    def __enter__(self) -> "RunLock":
        if not self.run_dir.local:
            print(f"[ssmgate] warning: {self.run_dir.path} is not a local path; it is not locked (one writer "
                  f"at a time is up to you)", flush=True)
            return self
        path = self.run_dir.file(".lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self._unwritable(path, e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip()
            os.close(fd)
            raise self._busy(_describe(holder)[1], path) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in NO_FLOCK:
                raise self._unwritable(path, e) from e
            self._lock_excl(e)
            return self
        try:
            os.ftruncate(fd, 0)
            os.write(fd, _holder())
        except OSError as e:
            os.close(fd)
            raise self._unwritable(path, e) from e
        self._fd = fd
        return self

    def _lock_excl(self, why: OSError) -> None:
        """The O_EXCL lock file, where the filesystem has no flock."""
        path = self.run_dir.file(EXCL_NAME)
        print(f"[ssmgate] the filesystem of {self.run_dir.path} has no flock ({errno.errorcode.get(why.errno)}): "
              f"locking it with {path} instead", flush=True)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._take_over_if_gone(path)
                continue
            except OSError as e:
                raise self._unwritable(path, e) from e
            try:
                os.write(fd, _holder())
            except OSError as e:
                path.unlink(missing_ok=True)
                raise self._unwritable(path, e) from e
            finally:
                os.close(fd)
            self._excl = path
            return
        raise self._busy("another process that took the lock at the same moment", path)

    def _take_over_if_gone(self, path) -> None:
        """Removes a lock file whose holder is provably gone; raises RunDirBusy otherwise."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return  # released meanwhile: try again
        h, who = _describe(text)
        here = h.get("host") == socket.gethostname()
        job = os.environ.get("SLURM_JOB_ID")
        if here and isinstance(h.get("pid"), int) and not alive(h["pid"]):
            gone = "its process is gone"
        elif job is not None and h.get("slurm_job") == job:
            gone = f"it was an earlier start of this SLURM job {job}"
        else:
            raise RunDirBusy(f"--run_dir={self.run_dir.path} is in use by {who} (lock file {path}; this filesystem "
                             f"has no flock); wait for that run to end, or delete {path} if it is gone")
        print(f"[ssmgate] taking over the lock file {path} of {who}: {gone}", flush=True)
        path.unlink(missing_ok=True)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._excl is not None:
            self._excl.unlink(missing_ok=True)
            self._excl = None
