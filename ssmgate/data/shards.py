"""Token shards on disk: ArrayRecord files of fixed-size token records, and their manifest.

A prepared directory holds

- `plan.json`: what is being prepared (corpus, split, tokenizer, max_tokens, a digest of the
  corpus's file listing) and the pieces of the corpus, one per shard; written first.
- `shard-NNNNN.array_record`: the tokens of piece N, each document followed by EOS, in records of
  `record_tokens` tokens (the last record of a shard may be shorter), written with `group_size:1`
  so that reading one record decompresses only that record (what random access needs).
- `shard-NNNNN.done.json`: written after its shard is complete (token, record and document
  counts, the file's size and CRC-32): a shard without it is redone by the next prepare.
- `manifest.json`: written last, when every shard the stream needs is done: tokenizer name, vocab
  size, EOS id, token dtype, and per shard its name, records, the tokens it contributes (the
  `max_tokens` cut may end the stream inside a shard), its size in bytes and CRC-32. Its presence
  marks the directory complete.

`problem(path, record)` checks a finished shard against its done-marker or manifest entry; a
prepare checks every shard so and tokenizes the bad ones again. A shard that cannot be written
(a full disk) or read raises `StorageError` naming the file.

The token stream is the shards' tokens concatenated in order. Tokens are stored as uint16 when the
vocabulary fits (half the disk of int32), else int32; readers always return int32.
"""
from __future__ import annotations

import json
import os
import socket
import zlib
from pathlib import Path

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from ssmgate.storage_error import StorageError, cause

FORMAT = "ssmgate-token-shards/1"
PLAN, MANIFEST = "plan.json", "manifest.json"
RECORD_TOKENS = 8192  # a row of L + 1 <= 8193 tokens touches at most two records
WRITER_OPTIONS = "group_size:1,zstd:1"


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.array_record"


def done_name(i: int) -> str:
    return f"shard-{i:05d}.done.json"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def write_json(path: Path, obj) -> None:
    """Atomically (temporary file, then rename): a reader sees the old file or the whole new one.
    The temporary name is unique per host and process, so hosts sharing a folder never collide."""
    tmp = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write {path}: {cause(e)}; the shards finished before are intact: run the same "
                           f"command again to resume") from e


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); delete the prepared directory to prepare it again") from None


def checksum(path: Path) -> dict:
    """{"bytes": size, "crc32": 8 hex digits} of a file, read once."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"bytes": size, "crc32": f"{crc:08x}"}


def problem(path: Path, record: dict) -> str | None:
    """What is wrong with a finished shard (None: nothing): its size and CRC-32 against `record`
    (a done-marker or manifest entry); a record from before checksums has every record read back
    (ArrayRecord checks its chunks' own hashes) and its count compared."""
    if not path.is_file():
        return "missing"
    if "crc32" in record:
        found = checksum(path)
        if found["bytes"] != record["bytes"]:
            return f"{found['bytes']:,} bytes, {record['bytes']:,} when it was prepared"
        return None if found["crc32"] == record["crc32"] else \
            f"CRC-32 {found['crc32']}, {record['crc32']} when it was prepared"
    try:
        reader = ArrayRecordReader(str(path))
        try:
            n = reader.num_records()
            if n != record["records"]:
                return f"{n} records, {record['records']} when it was prepared"
            reader.read_all()
        finally:
            reader.close()
    except Exception as e:  # the ArrayRecord reader's errors are RuntimeErrors with riegeli's text
        return f"unreadable ({str(e).splitlines()[0][:200]})"
    return None


class ShardWriter:
    """Appends token arrays to one shard, in records of `record_tokens`; `close()` renames the
    finished file into place (a killed writer leaves only its temporary file)."""

    def __init__(self, path: Path, dtype: np.dtype, record_tokens: int = RECORD_TOKENS):
        self.path, self.dtype, self.record_tokens = Path(path), np.dtype(dtype), record_tokens
        self.tmp = self.path.with_name(f"{self.path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
        self._writer = self._io(lambda: ArrayRecordWriter(str(self.tmp), WRITER_OPTIONS))
        self._pending: list[np.ndarray] = []
        self._n_pending = 0
        self.tokens = self.records = 0

    def _io(self, call):
        try:
            return call()
        except Exception as e:  # ArrayRecord's writer raises RuntimeError with the OS text
            raise StorageError(f"cannot write the shard {self.path}: {cause(e)}; the shards finished before are "
                               f"intact: run the same command again to resume") from e

    def add(self, ids: np.ndarray) -> None:
        self._pending.append(np.asarray(ids).astype(self.dtype, copy=False))
        self._n_pending += len(ids)
        self.tokens += len(ids)
        if self._n_pending >= self.record_tokens:
            joined = np.concatenate(self._pending)
            full = len(joined) // self.record_tokens * self.record_tokens
            for start in range(0, full, self.record_tokens):
                self._write(joined[start:start + self.record_tokens])
            self._pending, self._n_pending = [joined[full:]], len(joined) - full

    def _write(self, tokens: np.ndarray) -> None:
        self._io(lambda: self._writer.write(np.ascontiguousarray(tokens, self.dtype.newbyteorder("<")).tobytes()))
        self.records += 1

    def close(self) -> None:
        if self._n_pending:
            self._write(np.concatenate(self._pending))
        self._pending, self._n_pending = [], 0
        self._io(self._writer.close)
        self._io(lambda: os.replace(self.tmp, self.path))

    def abort(self) -> None:
        try:
            self._writer.close()
        except Exception:
            pass  # the write that failed fails the close too (a full disk)
        self.tmp.unlink(missing_ok=True)
