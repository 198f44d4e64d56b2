"""Checkpointer: round trip, keep-N, unreadable fallback, mismatch errors, tmp dirs, other meshes."""
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ssmgate.train.checkpoint import CheckpointError, Checkpointer
from tests.subprocess_env import with_cpu_devices

REPO = Path(__file__).resolve().parents[2]


class State(NamedTuple):
    params: dict
    opt: optax.OptState
    step: jax.Array
    rng: jax.Array


def make_state(scale=1.0, rows=4):
    params = {"w": scale * jnp.arange(rows * 3.0).reshape(rows, 3), "b": jnp.full((3,), scale)}
    opt = optax.adam(1e-3).init(params)
    return State(params, opt, jnp.int32(7), jax.random.key(3))


def abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def save_steps(ckpt, steps, rows=4):
    for s in steps:
        ckpt.save(s, make_state(float(s), rows), meta={"fingerprint": "fp", "s": s}, force=True)


def truncate_arrays(step_dir):
    files = list(Path(step_dir, "state").rglob("d/*"))
    assert files, f"no array files under {step_dir}"
    for f in files:
        os.truncate(f, 10)


def delete_arrays(step_dir):
    for f in Path(step_dir, "state").rglob("d/*"):
        f.unlink()


def garbage(rel):
    return lambda step_dir: Path(step_dir, rel).write_text("garbage{")


def test_round_trip_with_optax_state_and_typed_key(tmp_path):
    state = make_state(2.0)
    with Checkpointer(tmp_path / "ck") as ckpt:
        ckpt.save(5, state, meta={"fingerprint": "abc", "flags": {"lr": 0.1, "dims": (1, 2)}}, force=True)
        assert ckpt.steps() == [5] and ckpt.latest_step() == 5
    with Checkpointer(tmp_path / "ck") as ckpt:  # a fresh process would see the same
        step, got, meta = ckpt.restore(abstract(state), expect_fingerprint="abc")
    assert step == 5 and meta == {"fingerprint": "abc", "flags": {"lr": 0.1, "dims": [1, 2]}}
    assert isinstance(got, State) and jax.tree.structure(got) == jax.tree.structure(state)
    chex.assert_trees_all_equal(got._replace(rng=None), state._replace(rng=None), strict=True)  # dtypes too
    assert jax.dtypes.issubdtype(got.rng.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(got.rng), jax.random.key_data(state.rng))
    # jax.eval_shape gives no shardings: those leaves land on the first device.
    with Checkpointer(tmp_path / "ck") as ckpt:
        assert ckpt.restore(jax.eval_shape(lambda: state))[1].params["w"].shape == (4, 3)


def test_python_scalar_leaves_round_trip(tmp_path):
    state = {"w": jnp.ones(3), "step": 7}
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state, meta={}, force=True)
    assert ckpt.restore({"w": jax.ShapeDtypeStruct((3,), jnp.float32), "step": 0})[1]["step"] == 7
    assert int(ckpt.restore(jax.eval_shape(lambda: state))[1]["step"]) == 7


def test_should_save_keep_n_and_existing_steps(tmp_path):
    with Checkpointer(tmp_path, keep=2, save_every=2) as ckpt:
        assert [s for s in range(7) if ckpt.should_save(s)] == [2, 4, 6]
        for s in range(1, 8):
            ckpt.save(s, make_state(float(s)), meta={})
        assert ckpt.steps() == [4, 6]
        ckpt.save(7, make_state(7.0), meta={}, force=True)
        ckpt.save(7, make_state(99.0), meta={}, force=True)  # already there: left alone
        assert ckpt.steps() == [6, 7]
        _, got, _ = ckpt.restore(abstract(make_state()))
        assert float(got.params["b"][0]) == 7.0
    with pytest.raises(CheckpointError, match="JSON-serializable"):
        Checkpointer(tmp_path / "j").save(1, make_state(), meta={"x": object()}, force=True)
    assert Checkpointer(tmp_path / "n").should_save(10) is False  # save_every=None: forced only


# Failed tensorstore reads inside orbax leave callbacks for an already closed asyncio loop.
QUIET_ORBAX = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@QUIET_ORBAX
@pytest.mark.parametrize("corrupt", [truncate_arrays, delete_arrays, garbage("state/_METADATA"),
                                     garbage("meta/metadata")],
                         ids=["truncated", "deleted", "garbage_tree_metadata", "garbage_meta"])
def test_unreadable_latest_falls_back_and_is_set_aside(tmp_path, caplog, corrupt):
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, [1, 2, 3])
    corrupt(tmp_path / "3")
    with caplog.at_level(logging.WARNING, logger="ssmgate.train.checkpoint"):
        step, got, meta = ckpt.restore(abstract(make_state()))
    assert step == 2 and meta["s"] == 2 and float(got.params["b"][0]) == 2.0
    assert any("step 3" in r.getMessage() and "cannot be read" in r.getMessage() for r in caplog.records)
    assert ckpt.steps() == [1, 2] and (tmp_path / "3.unreadable").is_dir()
    save_steps(ckpt, [3])  # the resumed run can write step 3 again
    assert Checkpointer(tmp_path).restore(abstract(make_state()))[0] == 3


@QUIET_ORBAX
def test_all_unreadable_raises_naming_every_step(tmp_path):
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, [1, 2])
    truncate_arrays(tmp_path / "1")
    garbage("state/_METADATA")(tmp_path / "2")
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(abstract(make_state()))
    msg = str(err.value)
    assert str(tmp_path) in msg and "step 2: JSONDecodeError" in msg and "step 1:" in msg
    assert ckpt.steps() == [1, 2]  # nothing restored, nothing moved
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        Checkpointer(tmp_path / "empty").restore(abstract(make_state()))


def test_mismatch_raises_without_falling_back(tmp_path):
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, [1])
    save_steps(ckpt, [2], rows=5)  # a different model from step 2 on
    with pytest.raises(CheckpointError, match=r"step 2 .* params/w is float32\[5, 3\] in the "
                                              r"checkpoint, expected float32\[4, 3\]"):
        ckpt.restore(abstract(make_state(rows=4)))
    int16 = abstract(make_state(rows=5))._replace(step=jax.ShapeDtypeStruct((), jnp.int16))
    with pytest.raises(CheckpointError, match=r"step is int32\[\] in the checkpoint, expected int16\[\]"):
        ckpt.restore(int16)
    extra = abstract(make_state(rows=5))._replace(params={"w": None, "b": None, "c": jnp.zeros(2)})
    with pytest.raises(CheckpointError, match=r"params/c \(expected float32\[2\]\) is not in"):
        ckpt.restore(extra)
    assert ckpt.steps() == [1, 2]
    assert ckpt.restore(abstract(make_state(rows=4)), step=1)[0] == 1


def test_fingerprint_mismatch_names_both_and_the_differing_flags(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, make_state(), meta={"fingerprint": "abc", "flags": {"lr": 0.1, "width": 8}}, force=True)
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(abstract(make_state()), expect_fingerprint="xyz", expect_flags={"lr": 0.2, "width": 8})
    msg = str(err.value)
    assert "'abc'" in msg and "'xyz'" in msg and "lr (saved 0.1, now 0.2)" in msg and "width" not in msg
    assert ckpt.restore(abstract(make_state()), expect_fingerprint="abc")[0] == 1


@QUIET_ORBAX
def test_leftover_tmp_dir_of_interrupted_save_is_ignored(tmp_path):
    ckpt = Checkpointer(tmp_path)
    save_steps(ckpt, [1, 2])
    tmp = tmp_path / "3.orbax-checkpoint-tmp"  # what a kill during the save of step 3 leaves
    shutil.copytree(tmp_path / "2", tmp)
    truncate_arrays(tmp)
    assert ckpt.restore(abstract(make_state()))[0] == 2 and tmp.exists()
    fresh = Checkpointer(tmp_path)
    assert fresh.steps() == [1, 2] and fresh.latest_step() == 2
    save_steps(fresh, [3])
    assert not tmp.exists() and fresh.restore(abstract(make_state()))[0] == 3


CHILD_SAVE_THEN_KILL = """
import os, signal, sys
from tests.train.test_checkpoint import make_state
from ssmgate.train.checkpoint import Checkpointer
Checkpointer(sys.argv[1]).save(4, make_state(4.0, rows=8), meta={"fingerprint": "fp"}, force=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

CHILD_RESTORE_ON_8 = """
import sys, jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tests.train.test_checkpoint import make_state
from ssmgate.train.checkpoint import Checkpointer
assert jax.device_count() == 8, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
shapes = jax.eval_shape(lambda: make_state(rows=8))
target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, P())), shapes)
w = target.params["w"]
target.params["w"] = jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=NamedSharding(mesh, P("data")))
step, got, meta = Checkpointer(sys.argv[1]).restore(target, expect_fingerprint="fp")
want = make_state(4.0, rows=8)
assert step == 4 and got.params["w"].sharding == target.params["w"].sharding
assert {s.data.shape for s in got.params["w"].addressable_shards} == {(1, 3)}
assert len(got.params["w"].addressable_shards) == 8
np.testing.assert_array_equal(got.params["w"], want.params["w"])
np.testing.assert_array_equal(jax.random.key_data(got.rng), jax.random.key_data(want.rng))
print("restored-on-8")
"""


def run_child(code, *args, devices=1):
    env = with_cpu_devices(devices, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)


def test_killed_right_after_save_then_restored_on_8_devices(tmp_path):
    killed = run_child(CHILD_SAVE_THEN_KILL, tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert Checkpointer(tmp_path).steps() == [4]
    restored = run_child(CHILD_RESTORE_ON_8, tmp_path, devices=8)
    assert restored.returncode == 0 and "restored-on-8" in restored.stdout, restored.stderr[-3000:]
