"""Packing a tokenized corpus into fixed-length LM rows (protocol §7.1, §7.3), reproducible by (seed, step).

Documents are tokenized, each followed by EOS, and concatenated into one int32 token stream (cached
as a .npy file, opened memory-mapped). Row i of a stream is tokens [i L, i L + L + 1) for
L = seq_len: rows of L + 1 tokens that share their boundary token, so every token after the first is
a target exactly once (none is lost at row edges, which held-out perplexity needs); the last
incomplete row is dropped. A row becomes `LMBatch(inputs = row[:-1], targets = row[1:], mask = 1)`;
rows cross document boundaries, with EOS marking them (no state reset inside a row).

Training order (the batch of step k depends only on (seed, k): docs/extending.md, "The training contract"): epoch e visits the rows in a
permutation drawn from (seed, e); the global sample position p = k * batch + j of step k is row
perm_e[p mod n] with e = p div n, so steps walk through epochs without gaps or repeats, and a
resumed run sees the same batches. `batch_at` is cheap: no state beyond the stream, and the
permutation of the current epoch is cached. `eval_rows` / `eval_batches` give the rows in order.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from ssmgate.tasks.synthetic_lm import LMBatch
from ssmgate.tasks.tokenizers import Tokenizer


def _check_int(name: str, value, lo: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name}={value!r}: expected an int >= {lo}")
    return int(value)


def _cache_meta(tokenizer: Tokenizer) -> dict:
    return {"tokenizer": tokenizer.name, "vocab_size": int(tokenizer.vocab_size), "eos_id": int(tokenizer.eos_id)}


def token_stream(documents: Iterable[str], tokenizer: Tokenizer, *, max_tokens: int | None = None,
                 cache_path: str | os.PathLike | None = None) -> np.ndarray:
    """All documents as one int32 stream `doc_1 EOS doc_2 EOS ...`, cut at `max_tokens` if given
    (reading stops there, so a token budget of a huge corpus is cheap).

    With `cache_path` (a .npy file), a cached stream is opened memory-mapped instead of tokenizing;
    otherwise the stream is written there, beside a record (`<cache>.json`) of the tokenizer's name,
    vocab size, EOS id and `max_tokens`. A cache whose record differs is refused. The record cannot
    tell corpora apart: naming the file after the corpus and split is the caller's part.
    """
    if max_tokens is not None:
        _check_int("max_tokens", max_tokens, 1)
    meta = _cache_meta(tokenizer)
    if cache_path is not None:
        cache_path = Path(cache_path)
        meta_path = cache_path.with_suffix(".json")
        if cache_path.is_file() and meta_path.is_file():
            cached = json.loads(meta_path.read_text())
            if {k: cached.get(k) for k in meta} != meta or cached.get("max_tokens") != max_tokens:
                raise ValueError(f"{cache_path}: cached stream was made with {cached}, not {meta} and "
                                 f"max_tokens={max_tokens}; delete it or choose another cache_path")
            return np.load(cache_path, mmap_mode="r")

    pieces, n = [], 0
    eos = np.array([tokenizer.eos_id], dtype=np.int32)
    for doc in documents:
        if max_tokens is not None and n >= max_tokens:
            break
        ids = np.asarray(tokenizer.encode(doc), dtype=np.int32)
        pieces += [ids, eos]
        n += ids.size + 1
    stream = np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)
    if max_tokens is not None:
        stream = stream[:max_tokens]

    if cache_path is not None:
        # The record goes last and the stream is renamed into place: a run killed at any point leaves
        # no record, so the next run tokenizes again rather than trusting a partial or stale stream.
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        meta_path.unlink(missing_ok=True)
        tmp = cache_path.with_name(cache_path.name + ".tmp.npy")
        np.save(tmp, stream)
        os.replace(tmp, cache_path)
        meta_path.write_text(json.dumps({**meta, "max_tokens": max_tokens, "n_tokens": int(stream.size)}))
    return stream


def n_rows(stream: np.ndarray, seq_len: int) -> int:
    """How many rows of seq_len + 1 tokens (stride seq_len) the stream holds; raises if none."""
    seq_len = _check_int("seq_len", seq_len, 1)
    arr = np.asarray(stream)  # no copy for numpy arrays and memory maps
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"stream: expected a 1-D integer token array, got shape {arr.shape} dtype {arr.dtype}")
    if len(stream) < seq_len + 1:
        raise ValueError(f"stream has {len(stream)} tokens; seq_len={seq_len} needs at least "
                         f"seq_len + 1 = {seq_len + 1} for one row")
    return (len(stream) - 1) // seq_len


def _rows(stream: np.ndarray, seq_len: int, idx: np.ndarray) -> LMBatch:
    row_btl = np.asarray(stream[idx[:, None] * seq_len + np.arange(seq_len + 1)], dtype=np.int32)
    return LMBatch(row_btl[:, :-1], row_btl[:, 1:], np.ones((len(idx), seq_len), np.float32))


@functools.lru_cache(maxsize=4)  # the current epoch and the next (a step may straddle them)
def _epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    order = np.random.default_rng([seed, epoch]).permutation(n)
    order.flags.writeable = False
    return order


def row_indices(n: int, batch: int, seed: int, step: int) -> np.ndarray:
    """The rows (of `n`) that make the training batch of step `step`, in batch order: global sample
    position p = step * batch + j is row perm_e[p mod n] of epoch e = p div n. Shared with the sharded
    loader (`ssmgate.data.loader`), so both give the same batches."""
    n = _check_int("n", n, 1)
    batch = _check_int("batch", batch, 1)
    seed = _check_int("seed", seed, 0)
    step = _check_int("step", step, 0)
    pos = step * batch + np.arange(batch)
    idx = np.empty(batch, np.int64)
    for epoch in np.unique(pos // n):  # usually one epoch, two at a boundary, more if batch > n
        sel = pos // n == epoch
        idx[sel] = _epoch_order(seed, int(epoch), n)[pos[sel] % n]
    return idx


def batch_at(stream: np.ndarray, seq_len: int, batch: int, seed: int, step: int) -> LMBatch:
    """Training batch of step `step`: (batch, seq_len) numpy arrays, a function of (seed, step) only."""
    return _rows(stream, seq_len, row_indices(n_rows(stream, seq_len), batch, seed, step))


def eval_rows(stream: np.ndarray, seq_len: int) -> LMBatch:
    """All rows in stream order, (n_rows, seq_len) views of the stream (no copy, read-only)."""
    n = n_rows(stream, seq_len)
    arr = np.asarray(stream)
    rows = np.lib.stride_tricks.as_strided(arr, shape=(n, seq_len + 1),
                                           strides=(seq_len * arr.strides[0], arr.strides[0]), writeable=False)
    return LMBatch(rows[:, :-1], rows[:, 1:], np.broadcast_to(np.float32(1.0), (n, seq_len)))


def eval_batches(stream: np.ndarray, seq_len: int, batch: int) -> Iterator[LMBatch]:
    """`eval_rows` in batches of static shape (batch, seq_len); the last one is padded with rows of
    mask 0 (copies of its first row), so one compiled step serves all and no token counts twice."""
    rows = eval_rows(stream, seq_len)
    batch = _check_int("batch", batch, 1)
    n = len(rows.inputs)
    for start in range(0, n, batch):
        idx = np.arange(start, start + batch)
        real = idx < n
        idx = np.where(real, idx, start)
        yield LMBatch(np.asarray(rows.inputs[idx], np.int32), np.asarray(rows.targets[idx], np.int32),
                      real[:, None].astype(np.float32) * np.ones((1, seq_len), np.float32))
