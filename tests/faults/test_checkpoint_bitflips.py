"""Fault injection on checkpoints: one flipped bit in a random data file of the latest checkpoint
is either harmless (the same values come back) or detected, and the previous step is restored.
Never a changed parameter. (Without the checksums, 6 of 20 such flips in a quick-scale Mamba-2
run's checkpoint restored changed values silently.)"""
import random
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.train import checksums
from ssmgate.train.checkpoint import Checkpointer


def state_at(step: int):
    keys = jax.random.split(jax.random.PRNGKey(step), 3)
    return {"w": jax.random.normal(keys[0], (192, 160)), "b": jax.random.normal(keys[1], (3000,)).astype(jnp.bfloat16),
            "count": jnp.int32(step), "rng": jax.random.key(step)}


def leaves_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                                          else x),
                              np.asarray(jax.random.key_data(y) if jax.dtypes.issubdtype(y.dtype, jax.dtypes.prng_key)
                                         else y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("bitflip") / "checkpoints"
    with Checkpointer(path) as ckpt:
        for step in (1, 2):
            ckpt.save(step, state_at(step), meta={"fingerprint": "f"}, force=True)
    return path


@pytest.mark.parametrize("trial", range(10))
def test_one_flipped_bit_is_harmless_or_detected(tmp_path, saved, trial):
    path = tmp_path / "checkpoints"
    shutil.copytree(saved, path)
    rng = random.Random(trial)
    files = sorted(f for f in (path / "2" / "state").rglob("*") if f.is_file() and f.parent.name == "d")
    victim = rng.choice(files)
    data = bytearray(victim.read_bytes())
    pos = rng.randrange(len(data))
    data[pos] ^= 1 << rng.randrange(8)
    victim.write_bytes(bytes(data))
    with Checkpointer(path) as ckpt:
        step, state, _ = ckpt.restore(jax.eval_shape(lambda: state_at(0)))
    assert leaves_equal(state, state_at(step)) and step in (1, 2), (victim.relative_to(path), pos, step)
    if step == 1:
        assert (path / "2.unreadable").is_dir()  # set aside, so step 2 can be written again


def test_checksums_see_one_bit_and_a_swap_and_ignore_the_sharding():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    base = checksums.state_checksums({"x": x})
    one_bit = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(x[1, 2], jnp.uint32) ^ 1, jnp.float32)
    assert checksums.mismatches(base, {"x": x.at[1, 2].set(one_bit)}) == ["x"]
    assert checksums.mismatches(base, {"x": x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])}) == ["x"]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
    placed = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d")))
    assert checksums.mismatches(base, {"x": placed}) == []
    mixed = {"b": x.astype(jnp.bfloat16), "k": jax.random.key(3), "m": x > 3}
    assert checksums.mismatches(checksums.state_checksums(mixed), mixed) == []


def test_a_failed_write_names_the_step_and_leaves_earlier_checkpoints_intact(tmp_path, monkeypatch):
    from ssmgate.train.checkpoint import CheckpointWriteError
    path = tmp_path / "checkpoints"
    with Checkpointer(path) as ckpt:
        ckpt.save(1, state_at(1), meta={"fingerprint": "f"}, force=True)
        real_write = type(ckpt._manager).save

        def disk_full(self, *args, **kwargs):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(type(ckpt._manager), "save", disk_full)
        with pytest.raises(CheckpointWriteError, match=r"cannot write checkpoint step 2 .*No space left.*\(\[1\]\) are intact"):
            ckpt.save(2, state_at(2), meta={"fingerprint": "f"}, force=True)
        monkeypatch.setattr(type(ckpt._manager), "save", real_write)
    with Checkpointer(path) as ckpt:
        step, state, _ = ckpt.restore(jax.eval_shape(lambda: state_at(0)))
    assert step == 1 and leaves_equal(state, state_at(1))


def test_a_flipped_bit_in_the_stored_fingerprint_reads_as_damage_not_as_another_configuration(tmp_path, saved):
    """The fingerprint is what a resume compares with this run's configuration: one flipped bit in it
    used to refuse the resume as a configuration change. The metadata's own digest tells them apart."""
    path = tmp_path / "checkpoints"
    shutil.copytree(saved, path)
    meta_file = path / "2" / "meta" / "metadata"
    data = bytearray(meta_file.read_bytes())
    pos = data.index(b'"fingerprint": "f"') + len(b'"fingerprint": "')
    data[pos] ^= 1 << 2  # "f" -> "b": still valid JSON, another fingerprint
    meta_file.write_bytes(bytes(data))
    with Checkpointer(path) as ckpt:
        step, state, meta = ckpt.restore(jax.eval_shape(lambda: state_at(0)), expect_fingerprint="f")
    assert step == 1 and leaves_equal(state, state_at(1)) and meta["fingerprint"] == "f"
    assert (path / "2.unreadable").is_dir()
