"""Training batches from prepared token shards: each process reads only its share of every batch.

Rows: row i of a stream is tokens [i L, i L + L + 1) for L = seq_len, rows of L + 1 tokens sharing
their boundary token, as in `text_packing`. `RowSource` serves them as a grain random-access data
source, reading only the records a row overlaps.

Order: the global batch of step k is a pure function of (seed, k): the rows
`text_packing.row_indices(n_rows, batch, seed, k)`, the packer's own epoch permutations and global
sample positions, so for the same token stream a batch is byte-identical to `text_packing.batch_at`.
Nothing else is state: a run resumed at step k reads what an uninterrupted one reads there.

Sharing: process p of P holds rows [p B/P, (p+1) B/P) of the global batch (B divisible by P); it
reads those rows only, and `global_batch_fn` assembles the global jax.Array with
`jax.make_array_from_process_local_data`, the batch axis on the mesh's "data" axis. The share a
process reads is taken from the sharding itself (which rows its devices hold), so it is right for
any device order; for the usual mesh it is the rule above.

Prefetch: `Loader(k)` serves steps from a grain pipeline of steps (`MapDataset.range(k, ...).map`)
that computes the next `prefetch` batches on a background thread while the model trains; a call for
any other step than the next restarts the pipeline there.
"""
from __future__ import annotations

from typing import Callable

import grain
import numpy as np

from ssmgate.data.store import TokenStore
from ssmgate.tasks import text_packing
from ssmgate.tasks.synthetic_lm import LMBatch

_LAST_STEP = 1 << 62  # the step pipeline's end: effectively unbounded, nothing is materialized


class RowSource:
    """grain RandomAccessDataSource: row i (int32, L + 1 tokens) of a token stream."""

    def __init__(self, store: TokenStore, seq_len: int):
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len={seq_len!r}: expected an int >= 1")
        if len(store) < seq_len + 1:
            raise ValueError(f"{store.directory}: the stream has {len(store):,} tokens; seq_len={seq_len} needs at "
                             f"least seq_len + 1 = {seq_len + 1} for one row")
        self.store, self.seq_len = store, seq_len
        self.n_rows = (len(store) - 1) // seq_len

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, index: int) -> np.ndarray:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices) -> np.ndarray:
        idx = np.asarray(indices, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n_rows):
            raise IndexError(f"rows {idx.min()}..{idx.max()}: expected indices in [0, {self.n_rows})")
        return self.store.read_windows(idx * self.seq_len, self.seq_len + 1)

    def __repr__(self) -> str:
        return f"RowSource({self.store!r}, seq_len={self.seq_len})"


def process_share(batch: int, process_index: int, process_count: int) -> slice:
    """Rows [p B/P, (p+1) B/P) of a global batch of B: process p's share."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index}, process_count={process_count}: expected "
                         "0 <= process_index < process_count")
    if batch % process_count:
        raise ValueError(f"batch={batch}: not divisible by the process count {process_count}; every process "
                         f"reads an equal share of each batch, so expected a multiple of {process_count}")
    per = batch // process_count
    return slice(process_index * per, (process_index + 1) * per)


def sharding_share(sharding, shape: tuple[int, ...]) -> slice:
    """The rows of a global batch of `shape` that this process's devices hold under `sharding`
    (one contiguous range; an error otherwise)."""
    rows = set()
    for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
        lead = index[0] if index else slice(None)
        rows.add(range(shape[0])[lead])
    ranges = sorted(((r.start, r.stop) for r in rows))
    start, stop = ranges[0]
    for a, b in ranges[1:]:
        if a > stop:
            raise ValueError(f"{sharding}: this process's devices hold rows {ranges} of the batch, not one contiguous "
                             "range; expected the batch axis laid out on 'data' in process order")
        stop = max(stop, b)
    return slice(start, stop)


class Loader:
    """Batches of step k for one process: `loader(k)` -> LMBatch of its rows (numpy)."""

    def __init__(self, store: TokenStore, seq_len: int, batch: int, seed: int, *, share: slice | None = None,
                 prefetch: int = 2):
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch={batch!r}: expected an int >= 1")
        self.rows = RowSource(store, seq_len)
        self.seq_len, self.batch, self.seed = seq_len, batch, seed
        self.share = share or slice(0, batch)
        if not 0 <= self.share.start < self.share.stop <= batch:
            raise ValueError(f"share={self.share}: expected rows [start, stop) within the batch of {batch}")
        self.prefetch = prefetch
        self._it, self._next = None, None

    @property
    def n_rows(self) -> int:
        return self.rows.n_rows

    def row_indices(self, step: int) -> np.ndarray:
        """The global batch's rows at `step` (all B of them)."""
        return text_packing.row_indices(self.rows.n_rows, self.batch, self.seed, step)

    def local_batch(self, step: int) -> LMBatch:
        """This process's rows of the batch of `step`, read now (no prefetch)."""
        tokens = self.rows.__getitems__(self.row_indices(step)[self.share])
        return LMBatch(tokens[:, :-1], tokens[:, 1:], np.ones(tokens[:, 1:].shape, np.float32))

    def dataset(self, start: int = 0) -> grain.MapDataset:
        """The local batches of steps start, start + 1, ... as a grain MapDataset."""
        return grain.MapDataset.range(start, _LAST_STEP).map(self.local_batch)

    def __call__(self, step: int) -> LMBatch:
        if self.prefetch < 1:
            return self.local_batch(step)
        if step != self._next:
            options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=self.prefetch)
            self._it = iter(self.dataset(step).to_iter_dataset(options))
        self._next = step + 1
        return next(self._it)


def global_batch_fn(store: TokenStore, seq_len: int, batch: int, seed: int, sharding, *,
                    prefetch: int = 2) -> Callable[[int], LMBatch]:
    """k -> the global batch of step k as jax.Arrays with `sharding` (batch axis on "data"), each
    process reading only its own rows."""
    import jax

    process_share(batch, jax.process_index(), jax.process_count())  # the divisibility check
    shape = (batch, seq_len)
    loader = Loader(store, seq_len, batch, seed, share=sharding_share(sharding, shape), prefetch=prefetch)

    def batch_fn(step: int) -> LMBatch:
        local = loader(step)
        return LMBatch(*(jax.make_array_from_process_local_data(sharding, x, shape) for x in local))
    batch_fn.loader = loader
    return batch_fn
