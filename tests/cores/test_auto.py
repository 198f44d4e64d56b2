"""algorithm='auto': the committed table is well formed, unmeasured backends fall back with a
warning, and a class whose forward and training choices differ evaluates with the first and
differentiates with the second."""
import functools
import json

import chex
import jax
import numpy as np
import pytest

from ssmgate.cores import auto
from tests.cores import checks
from tests.cores import common as cm

VALID = {"scalar_decay": {"sequential", "associative", "chunked"},
         "rotation": {"sequential", "associative", "chunked"},
         "damped": {"sequential", "associative", "chunked"}}


def test_committed_table_is_well_formed():
    table = json.loads(auto.TABLE_PATH.read_text())
    assert "cpu" in table, "the CPU table is measured by `make bench-docs` and committed"
    for backend, cores in table.items():
        assert set(cores) == set(VALID), backend
        for core, classes in cores.items():
            widths = list(dict.fromkeys(c.get("max_state") for c in classes))  # in table order
            assert widths[-1] is None and widths[:-1] == sorted(widths[:-1]), (core, widths)
            for w in widths:
                bounds = [c["max_t"] for c in classes if c.get("max_state") == w]
                assert bounds[-1] is None and all(b is not None for b in bounds[:-1]), (core, w, bounds)
                assert bounds[:-1] == sorted(bounds[:-1]), (core, w, bounds)
            for c in classes:
                for kind in ("forward", "train"):
                    choice = c[kind]
                    assert choice["algorithm"] in VALID[core], (core, c)
                    assert (choice["chunk_size"] is None) == (choice["algorithm"] != "chunked"), (core, c)
                    # the choice is the measured minimum of its column
                    column = "fwd_seconds" if kind == "forward" else "train_seconds"
                    best = min(c["timings"], key=lambda e: e[column])
                    assert (best["algorithm"], best["chunk_size"]) == (choice["algorithm"], choice["chunk_size"])


def test_unmeasured_backend_warns_and_falls_back(monkeypatch):
    monkeypatch.setattr(auto, "load_table", lambda: {})
    auto._warn_unmeasured.cache_clear()
    with pytest.warns(UserWarning, match="no measured auto table for backend 'gpu'"):
        assert auto.choose("rotation", 100, backend="gpu") == auto.FALLBACK["rotation"]
    with pytest.warns(UserWarning, match="no measured auto table for backend 'tpu' and core 'damped'"):
        assert auto.choose("damped", 100, backend="tpu") == auto.FALLBACK["damped"]


def test_tpu_without_measurements_takes_the_estimated_kernel(monkeypatch):
    """TPU's compiler-estimated rule (the Pallas kernel) where no TPU rows were measured; measured rows win.
    for_backend makes a trace on this CPU host choose for TPU."""
    monkeypatch.setattr(auto, "load_table", lambda: {})
    auto._warn_unmeasured.cache_clear()
    with pytest.warns(UserWarning, match="compiler-estimated choice .'pallas', 64."):
        assert auto.choose("scalar_decay", 2048, backend="tpu") == (("pallas", 64), ("pallas", 64))
    with auto.for_backend("tpu"), pytest.warns(UserWarning, match="backend 'tpu' and core 'rotation'"):
        assert auto.choose("rotation", 2048) == auto.ESTIMATED["tpu"]["rotation"]
    with pytest.warns(UserWarning, match="backend 'cpu'"):                   # this host's cpu: unmeasured here
        assert auto.choose("rotation", 2048) == auto.FALLBACK["rotation"]
    measured = {"tpu": {"scalar_decay": [_entry(None, None, 128)]}}
    monkeypatch.setattr(auto, "load_table", lambda: measured)
    assert auto.choose("scalar_decay", 2048, backend="tpu") == (("sequential", None), ("chunked", 128))


def test_table_without_open_class_is_an_error(monkeypatch):
    bad = {"cpu": {"scalar_decay": [{"max_t": 8, "forward": {"algorithm": "sequential", "chunk_size": None},
                                     "train": {"algorithm": "sequential", "chunk_size": None}}]}}
    monkeypatch.setattr(auto, "load_table", lambda: bad)
    with pytest.raises(ValueError, match="open-ended"):
        auto.choose("scalar_decay", 100, backend="cpu")


def _entry(max_state, max_t, train_chunk):
    return {"max_state": max_state, "max_t": max_t, "forward": {"algorithm": "sequential", "chunk_size": None},
            "train": {"algorithm": "chunked", "chunk_size": train_chunk}}


def test_choice_by_width_and_length(monkeypatch):
    """The narrowest width class holding p·n, then the shortest length class holding t; no state
    size means the open-ended (widest) class."""
    table = {"cpu": {"scalar_decay": [_entry(None, 64, 64), _entry(512, None, 32), _entry(512, 64, 16),
                                      _entry(None, None, 128)]}}
    monkeypatch.setattr(auto, "load_table", lambda: table)
    train = lambda t, s: auto.choose("scalar_decay", t, s, backend="cpu")[1][1]
    assert [train(10, 256), train(100, 256), train(10, 512), train(10, 513), train(100, 4096)] == [16, 32, 16, 64, 128]
    assert train(10, None) == 64


def test_table_without_open_width_class_is_an_error(monkeypatch):
    monkeypatch.setattr(auto, "load_table", lambda: {"cpu": {"scalar_decay": [_entry(512, None, 32)]}})
    with pytest.raises(ValueError, match="max_state null"):
        auto.choose("scalar_decay", 100, 256, backend="cpu")


def test_cores_pass_their_state_size(monkeypatch, rng):
    """scalar_decay's auto asks for its per-head p·n."""
    seen = []
    real = auto.choose
    monkeypatch.setattr(auto, "choose", lambda c, t, state_size=None, backend=None:
                        seen.append((c, t, state_size)) or real(c, t, state_size, backend))
    case = checks.GRAD_CASE
    inp, _ = checks.grad_inputs("scalar_decay", case, None, rng)
    cm.call_core("scalar_decay", inp, algorithm="auto")
    assert seen == [("scalar_decay", case.t, case.p * case.n)]


@pytest.mark.parametrize("core", ["scalar_decay", "rotation"])
def test_forward_and_training_choices_dispatch(core, monkeypatch, rng):
    """forward = sequential, train = chunked: y is bit-identical to sequential's, the gradients to
    chunked's (and so within GRAD_TOL of sequential's, checked in the algorithm tests)."""
    case = checks.GRAD_CASE
    monkeypatch.setattr(auto, "choose", lambda c, t, state_size=None, backend=None:
                        (("sequential", None), ("chunked", case.chunk)))
    inp, proj = checks.grad_inputs(core, case, None, rng)
    y_auto, _ = jax.jit(functools.partial(cm.call_core, core, algorithm="auto"))(inp)
    y_seq, _ = cm.run(core, inp, "sequential")
    np.testing.assert_array_equal(np.asarray(y_auto), np.asarray(y_seq))

    def loss(algorithm, chunk, i):
        y, final = cm.call_core(core, i, algorithm=algorithm, chunk_size=chunk)
        total = jax.numpy.sum(y * proj["y"])
        for leaf, w in zip(jax.tree.leaves(final), proj["state"]):
            total = total + jax.numpy.sum(leaf * w)
        return total

    g_auto = jax.jit(jax.grad(functools.partial(loss, "auto", None)))(inp)
    g_chunk = jax.jit(jax.grad(functools.partial(loss, "chunked", case.chunk)))(inp)
    chex.assert_trees_all_close(g_auto, g_chunk, rtol=1e-6, atol=1e-6)  # names the leaf that differs
