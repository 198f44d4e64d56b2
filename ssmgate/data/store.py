"""Random access to a prepared token stream: any token window read from the records that hold it.

`TokenStore(dir)` opens a complete prepared directory (`shards.MANIFEST` present): one global record
key space over every shard (`RecordSource`, a grain random-access source of records). Opening reads
only the manifest (and compares each shard's size with it); a read of tokens [a, b) decompresses
just the records that overlap it. A shard that does not read back (cut short, a chunk that fails
ArrayRecord's own hash) raises `ShardReadError`, one line naming the file and the record.

Memory does not grow with the corpus: at most `max_open` shard readers are open at once (the least
recently used is closed), each without the 1 MB footer prefetch an ArrayRecord reader keeps by
default. With grain's own ArrayRecordDataSource, which keeps every reader it opened and their
footers, a reader of a 1 GB corpus (30 shards) grew by 45 MB; with 112 shards of 2 MB, 41 MB.
"""
from __future__ import annotations

import collections
import os
import threading
from pathlib import Path

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

from ssmgate.data import shards
from ssmgate.storage_error import StorageError

REPAIR = ("`python -m ssmgate.data prepare` with the arguments that made it checks every shard and tokenizes the "
          "bad ones again")


class ShardReadError(StorageError):
    """A shard does not read back as it was prepared; the message names the file and the record."""


# Random access: no readahead, no footer kept in memory (an index lookup per open is cheap).
READER_OPTIONS = "readahead_buffer_size:0,max_parallelism:0,footer_prefetch_bytes:0"


class RecordSource:
    """grain RandomAccessDataSource of records (bytes) over several ArrayRecord files: key k is
    record k of the files in order. At most `max_open` readers are open; thread-safe."""

    def __init__(self, paths: list[str], counts: list[int], max_open: int = 32, record_tokens: int | None = None):
        if len(paths) != len(counts) or max_open < 1:
            raise ValueError(f"RecordSource: {len(paths)} paths, {len(counts)} counts, max_open={max_open}: expected "
                             "one count per path and max_open >= 1")
        self.paths, self.max_open, self.record_tokens = list(paths), max_open, record_tokens
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._open: collections.OrderedDict[int, ArrayRecordReader] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return int(self._first[-1])

    def __getitem__(self, key: int) -> bytes:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys) -> list[bytes]:
        keys = np.asarray(keys, np.int64).reshape(-1)
        if keys.size and (keys.min() < 0 or keys.max() >= len(self)):
            raise IndexError(f"record keys {keys.min()}..{keys.max()}: expected keys in [0, {len(self)})")
        files = np.searchsorted(self._first, keys, side="right") - 1
        out: list[bytes] = [b""] * keys.size
        with self._lock:
            for f in np.unique(files).tolist():
                where = np.flatnonzero(files == f)
                local = (keys[where] - self._first[f]).tolist()
                try:
                    records = self._reader(f).read(local)
                except Exception as e:  # ArrayRecord's RuntimeError: a truncated file, a chunk hash mismatch
                    self._close(f)
                    raise ShardReadError(f"{self.paths[f]}: cannot read {self._where(local)} "
                                         f"({str(e).strip().splitlines()[0][:200]}); {REPAIR}") from None
                for i, record in zip(where.tolist(), records):
                    out[i] = record
        return out

    def _where(self, local: list[int]) -> str:
        lo, hi = min(local), max(local)
        what = f"record {lo}" if lo == hi else f"records {lo}..{hi}"
        if self.record_tokens:
            what += f" (tokens {lo * self.record_tokens:,}..{(hi + 1) * self.record_tokens - 1:,} of this shard)"
        return what

    def _close(self, f: int) -> None:
        reader = self._open.pop(f, None)
        if reader is not None:
            try:
                reader.close()
            except Exception:   # a reader of a damaged shard may fail to close; the read error named it already
                pass

    def _reader(self, f: int) -> ArrayRecordReader:
        reader = self._open.pop(f, None)
        if reader is None:
            if len(self._open) >= self.max_open:
                self._open.popitem(last=False)[1].close()
            reader = ArrayRecordReader(self.paths[f], READER_OPTIONS, file_reader_buffer_size=32 << 10)
        self._open[f] = reader  # most recently used last
        return reader

    def __repr__(self) -> str:
        return f"RecordSource({len(self.paths)} files, {len(self)} records)"


class TokenStore:
    def __init__(self, directory: str | os.PathLike, *, max_open: int = 32):
        self.directory = Path(directory)
        manifest = shards.read_json(self.directory / shards.MANIFEST)
        if manifest is None:
            raise FileNotFoundError(
                f"{self.directory}: no {shards.MANIFEST}: not a prepared token directory, or its prepare did not "
                f"finish (python -m ssmgate.data prepare --out={self.directory} ... finishes it)")
        if manifest.get("format") != shards.FORMAT:
            raise ValueError(f"{self.directory / shards.MANIFEST}: format {manifest.get('format')!r}, expected "
                             f"{shards.FORMAT!r}")
        self.manifest = manifest
        self.tokenizer, self.vocab_size, self.eos_id = manifest["tokenizer"], manifest["vocab_size"], manifest["eos_id"]
        self.dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        self.record_tokens = int(manifest["record_tokens"])
        used = [s for s in manifest["shards"] if s["tokens"] > 0]
        tokens = np.array([s["tokens"] for s in used], np.int64)
        self.n_tokens = int(tokens.sum())
        self._starts = np.concatenate([[0], np.cumsum(tokens)])  # shard s holds [starts[s], starts[s+1])
        self._first_key = np.concatenate([[0], np.cumsum([s["records"] for s in used])]).astype(np.int64)
        for s in used:  # a cheap look before any read: a shard cut short or grown since its prepare
            path = self.directory / s["name"]
            size = path.stat().st_size if path.is_file() else None
            if "bytes" in s and size != s["bytes"]:
                raise ShardReadError(f"{path}: " + ("missing" if size is None else f"{size:,} bytes") +
                                     f", {s['bytes']:,} when it was prepared; {REPAIR}")
        self._records = RecordSource([str(self.directory / s["name"]) for s in used], [s["records"] for s in used],
                                     max_open, self.record_tokens)

    def __len__(self) -> int:
        return self.n_tokens

    def __repr__(self) -> str:
        return f"TokenStore({str(self.directory)!r}, n_tokens={self.n_tokens})"

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) of the stream as int32."""
        return self.read_windows(np.array([start]), stop - start)[0]

    def read_windows(self, starts, length: int) -> np.ndarray:
        """(len(starts), length) int32: row w is tokens [starts[w], starts[w] + length)."""
        starts = np.asarray(starts, np.int64).reshape(-1)
        if length < 0 or (starts.size and (starts.min() < 0 or starts.max() + length > self.n_tokens)):
            raise IndexError(f"token windows of length {length} at starts in [{starts.min()}, {starts.max()}]: "
                             f"outside the stream of {self.n_tokens} tokens")
        out = np.empty((starts.size, length), np.int32)
        if not starts.size or not length:
            return out
        R = self.record_tokens
        # Segments (window, offset in window, record key, offset in record, count), then every record once.
        segments = []
        for w, start in enumerate(starts.tolist()):
            t, end = start, start + length
            while t < end:
                s = int(np.searchsorted(self._starts, t, side="right")) - 1
                r = (t - int(self._starts[s])) // R
                rec_start = int(self._starts[s]) + r * R
                rec_end = min(rec_start + R, int(self._starts[s + 1]))
                count = min(end, rec_end) - t
                segments.append((w, t - start, int(self._first_key[s]) + r, t - rec_start, count))
                t += count
        keys = sorted({seg[2] for seg in segments})
        records = {k: np.frombuffer(b, self.dtype) for k, b in zip(keys, self._records.__getitems__(keys))}
        for w, dst, key, src, count in segments:
            out[w, dst:dst + count] = records[key][src:src + count]
        return out
