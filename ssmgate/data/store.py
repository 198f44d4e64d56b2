"""Random access to a prepared token stream: any token window read from the records that hold it.

`TokenStore(dir)` opens a complete prepared directory (`shards.MANIFEST` present) through grain's
ArrayRecord data source, one global record key space over every shard. Opening reads only the
manifest; a read of tokens [a, b) decompresses just the records that overlap it, so memory does not
grow with the corpus.
"""
from __future__ import annotations

import os
from pathlib import Path

import grain
import numpy as np

from ssmgate.data import shards


class TokenStore:
    def __init__(self, directory: str | os.PathLike):
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
        # "path[0:n]" tells grain the record count, so opening reads no file.
        paths = [f"{self.directory / s['name']}[0:{s['records']}]" for s in used]
        self._records = grain.sources.ArrayRecordDataSource(paths) if paths else None

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
