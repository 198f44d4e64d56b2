"""A run directory and the side effects of a run: resolved flags, metrics JSONL, CSVs, summary, progress.

Files are written atomically (temporary file, then rename) and metrics are appended and flushed
line by line, so whatever was written survives a crash or a kill. A write that fails (a full disk,
a read-only filesystem) raises `StorageError` naming the file and leaves it as it was: a file
written whole or not at all, metrics.jsonl cut back to its last complete line.

The directory is an `etils.epath` path, so a run can write to a bucket (`gs://...`, with the
`gcsfs` package) as to a local folder. Object stores cannot append: there metrics.jsonl is
rewritten whole at each record (metrics files are small: one line per progress line).
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import time
from typing import Iterable, Sequence

import jax
from etils import epath

from ssmgate.storage_error import StorageError, cause


def _atomic_write(path: epath.Path, data: str | bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data) if isinstance(data, bytes) else tmp.write_text(data)
        tmp.replace(path)
    except OSError as e:
        _remove_quietly(tmp)
        raise StorageError(f"cannot write {path} ({cause(e)}); it is as it was (written whole or not at all)") from e


def _remove_quietly(path: epath.Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # what could not be written cannot always be removed either (a read-only filesystem)


STAGED = ".staged"


def is_local(path: epath.Path) -> bool:
    return "://" not in str(path)


def to_jsonable(obj):
    """numpy/JAX scalars and arrays to plain Python; NaN/Inf to None (JSON has no NaN)."""
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def say(text: str) -> None:
    """Prints a progress line, from process 0 only (one display for a multi-host run)."""
    if jax.process_index() == 0:
        print(text, flush=True)


class RunDir:
    @classmethod
    def of(cls, where: "RunDir | str | os.PathLike") -> "RunDir":
        """`where` itself when it is a RunDir (ssmgate.main passes the one it locked, with its state),
        else a RunDir at that path."""
        return where if isinstance(where, RunDir) else cls(where)

    def __init__(self, path: str | os.PathLike):
        self.path = epath.Path(path)
        self.local = is_local(self.path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._metrics_text: str | None = None  # an object store's metrics.jsonl, rewritten at each record

    def file(self, name: str) -> epath.Path:
        return self.path / name

    def write_text(self, name: str, text: str | bytes) -> epath.Path:
        """Writes a file of the run whole (bytes as they are), or leaves it as it was."""
        _atomic_write(self.file(name), text)
        return self.file(name)

    def stage(self, name: str, text: str) -> None:
        """Writes `text` as `<name>.staged`, to replace `name` once the run is accepted (`promote`):
        a resume that is refused must not overwrite the record of the run it refused."""
        self.write_text(name + STAGED, text)

    def promote(self, name: str) -> bool:
        """Moves a staged `<name>.staged` into place; False if none was staged."""
        staged = self.file(name + STAGED)
        if not staged.exists():
            return False
        staged.replace(self.file(name))
        return True

    def remove_if_unused(self, leftovers=(".lock", ".lock.excl")) -> None:
        """Removes the directory if it holds nothing but `leftovers` (a run refused before it wrote anything)."""
        if self.local and all(p.name in leftovers for p in self.path.iterdir()):
            for p in self.path.iterdir():
                _remove_quietly(p)
            self.path.rmdir()

    def discard_staged(self, name: str) -> None:
        """Drops a staged `<name>.staged` that will not be promoted (the run did not accept it)."""
        _remove_quietly(self.file(name + STAGED))

    def write_json(self, name: str, obj) -> epath.Path:
        return self.write_text(name, json.dumps(to_jsonable(obj), indent=2, sort_keys=True) + "\n")

    def write_csv(self, name: str, header: Sequence[str], rows: Iterable[Sequence]) -> epath.Path:
        buffer = io.StringIO(newline="")  # csv writes its own \r\n
        writer = csv.writer(buffer)
        writer.writerow(header)
        for row in rows:
            writer.writerow(["" if v is None else v for v in to_jsonable(list(row))])
        return self.write_text(name, buffer.getvalue())

    def log_metrics(self, record: dict) -> None:
        """Appends one JSON line to metrics.jsonl and flushes it to disk."""
        line = json.dumps(to_jsonable(record), sort_keys=True) + "\n"
        if not self.local:
            if self._metrics_text is None:
                path = self.file("metrics.jsonl")
                self._metrics_text = path.read_text() if path.exists() else ""
            self._metrics_text += line
            _atomic_write(self.file("metrics.jsonl"), self._metrics_text)
            return
        path = self.file("metrics.jsonl")
        size = None
        try:
            with open(path, "a") as f:
                size = f.tell()
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if size is not None:  # no half line for the next append to run into
                try:
                    os.truncate(path, size)
                except OSError:
                    pass  # read_metrics skips a cut line
            raise StorageError(f"cannot append to {path} ({cause(e)}); its lines before step {record.get('step')} "
                               f"are intact") from e

    def read_metrics(self) -> list[dict]:
        path = self.file("metrics.jsonl")
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by a kill mid-write: everything before it is intact
        return records

    def truncate_metrics(self, last_step: int) -> int:
        """Drops metrics lines with step > last_step (written after the checkpoint a run resumes
        from); returns how many were dropped."""
        records = self.read_metrics()
        keep = [r for r in records if r.get("step", 0) <= last_step]
        if len(keep) == len(records):
            return 0
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep)
        _atomic_write(self.file("metrics.jsonl"), text)
        self._metrics_text = None
        return len(records) - len(keep)


class Progress:
    """Prints `[name] what k/total (pct) | extra | elapsed, ETA` lines for long loops."""

    def __init__(self, name: str, total: int, stream=None):
        self.name, self.total = name, max(int(total), 1)
        self.start = time.perf_counter()
        self.stream = stream or sys.stdout

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def update(self, done: int, what: str = "step", extra: str = "") -> None:
        el = self.elapsed()
        eta = el / done * (self.total - done) if done > 0 else float("nan")
        eta_s = f"ETA {eta:.0f}s" if math.isfinite(eta) else "ETA ?"
        extra = f" | {extra}" if extra else ""
        print(f"[{self.name}] {what} {done}/{self.total} ({100 * done / self.total:.0f}%){extra} | "
              f"{el:.0f}s elapsed, {eta_s}", file=self.stream, flush=True)
