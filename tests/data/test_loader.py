"""The sharded loader: batches byte-identical to text_packing.batch_at, per-process shares that
make up the global batch, exact resume, the global jax.Array, and clear errors."""
import numpy as np
import pytest

from ssmgate.data import loader as ld, prepare as prep
from ssmgate.data.store import TokenStore
from ssmgate.tasks import text_corpus, text_packing, tokenizers

SEQ_LEN, BATCH, SEED = 48, 8, 3


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The embedded validation split (24K tokens): records of 64 tokens and shards of ~2 KB, so
    rows of 49 tokens cross record and shard boundaries."""
    out = tmp_path_factory.mktemp("loader") / "shards"
    store = prep.prepare("embedded", "validation", out, workers=1, shard_bytes=2000, record_tokens=64, log=None)
    stream = text_packing.token_stream(text_corpus.embedded_corpus("validation"), tokenizers.ByteTokenizer())
    return store, stream


def as_bytes(batch):
    return b"".join(np.ascontiguousarray(x).tobytes() for x in batch)


def test_the_stream_is_read_exactly_anywhere(prepared):
    store, stream = prepared
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(stream) - 200, size=50)
    np.testing.assert_array_equal(store.read_windows(starts, 200), stream[starts[:, None] + np.arange(200)])
    np.testing.assert_array_equal(store.read(len(stream) - 5, len(stream)), stream[-5:])
    with pytest.raises(IndexError, match=f"outside the stream of {len(stream)} tokens"):
        store.read(len(stream) - 5, len(stream) + 1)


def test_few_readers_stay_open_however_many_shards_are_read(prepared):
    store, stream = prepared
    few = TokenStore(store.directory, max_open=2)
    starts = np.random.default_rng(1).integers(0, len(stream) - 100, size=40)
    for start in starts:  # one window at a time: every read may need another shard
        np.testing.assert_array_equal(few.read(start, start + 100), stream[start:start + 100])
        assert len(few._records._open) <= 2
    assert len(store.manifest["shards"]) > 4


def test_batches_are_byte_identical_to_the_packers(prepared):
    store, stream = prepared
    loader = ld.Loader(store, SEQ_LEN, BATCH, SEED, prefetch=0)
    n = text_packing.n_rows(stream, SEQ_LEN)
    assert loader.n_rows == n and len(ld.RowSource(store, SEQ_LEN)) == n
    last = (3 * n) // BATCH  # the third epoch: steps 0 .. last cross two epoch boundaries
    for step in (0, 1, n // BATCH, n // BATCH + 1, last):
        want = text_packing.batch_at(stream, SEQ_LEN, BATCH, SEED, step)
        got = loader.local_batch(step)
        assert as_bytes(got) == as_bytes(want), step
        assert got.inputs.dtype == np.int32 and got.mask.dtype == np.float32
    other_seed = ld.Loader(store, SEQ_LEN, BATCH, SEED + 1, prefetch=0).local_batch(0)
    assert as_bytes(other_seed) != as_bytes(loader.local_batch(0))


@pytest.mark.parametrize("processes", [2, 4])
def test_process_shares_make_up_the_global_batch(prepared, processes):
    store, _ = prepared
    whole = ld.Loader(store, SEQ_LEN, BATCH, SEED, prefetch=0)
    shares = [ld.Loader(store, SEQ_LEN, BATCH, SEED, share=ld.process_share(BATCH, p, processes), prefetch=0)
              for p in range(processes)]
    assert [s.share for s in shares][:2] == [slice(0, BATCH // processes), slice(BATCH // processes,
                                                                                   2 * BATCH // processes)]
    for step in (0, 7, 100):
        parts = [s.local_batch(step) for s in shares]
        joined = [np.concatenate([getattr(p, f) for p in parts]) for f in ("inputs", "targets", "mask")]
        assert as_bytes(joined) == as_bytes(whole.local_batch(step))
        assert all(p.inputs.shape == (BATCH // processes, SEQ_LEN) for p in parts)


def test_a_loader_started_mid_epoch_gives_the_same_batches(prepared):
    store, _ = prepared
    k = 9
    from_zero = ld.Loader(store, SEQ_LEN, BATCH, SEED, prefetch=3)
    seen = [as_bytes(from_zero(step)) for step in range(k + 6)]
    resumed = ld.Loader(store, SEQ_LEN, BATCH, SEED, prefetch=3)
    assert [as_bytes(resumed(step)) for step in range(k, k + 6)] == seen[k:]
    assert as_bytes(resumed(2)) == seen[2] and as_bytes(resumed(3)) == seen[3]  # a jump back restarts there
    share = ld.Loader(store, SEQ_LEN, BATCH, SEED, share=ld.process_share(BATCH, 1, 2), prefetch=2)
    assert as_bytes(share(k)) == as_bytes(share.local_batch(k))


def test_the_global_array_is_assembled_on_the_mesh(prepared):
    import jax

    from ssmgate.train import mesh as meshlib

    store, stream = prepared
    sharding = meshlib.batch_sharding(meshlib.make_mesh(meshlib.MeshCfg()))
    assert ld.sharding_share(sharding, (BATCH, SEQ_LEN)) == ld.process_share(BATCH, jax.process_index(),
                                                                             jax.process_count())
    batch_fn = ld.global_batch_fn(store, SEQ_LEN, BATCH, SEED, sharding)
    for step in (0, 5):
        got = batch_fn(step)
        assert isinstance(got.inputs, jax.Array) and got.inputs.sharding.spec[0] == "data"
        want = text_packing.batch_at(stream, SEQ_LEN, BATCH, SEED, step)
        assert as_bytes(jax.device_get(got)) == as_bytes(want)


def test_bad_input_is_named(prepared, tmp_path):
    store, stream = prepared
    with pytest.raises(ValueError, match="batch=6: not divisible by the process count 4"):
        ld.process_share(6, 0, 4)
    with pytest.raises(ValueError, match=f"the stream has {len(stream):,} tokens; seq_len={len(stream)} needs"):
        ld.Loader(store, len(stream), BATCH, SEED)
    with pytest.raises(ValueError, match="batch=0: expected an int >= 1"):
        ld.Loader(store, SEQ_LEN, 0, SEED)
    with pytest.raises(IndexError, match="expected indices in"):
        ld.RowSource(store, SEQ_LEN)[10**9]
    with pytest.raises(FileNotFoundError, match="no file matches the glob"):
        prep.prepare(f"files:{tmp_path}/*.jsonl", "train", tmp_path / "out", log=None)
