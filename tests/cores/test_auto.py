"""algorithm='auto': the committed table is well formed, unmeasured backends fall back with a
warning, and a class whose forward and training choices differ evaluates with the first and
differentiates with the second."""
import functools
import json

import jax
import numpy as np
import pytest

from ssmgate.cores import auto
from tests.cores import checks
from tests.cores import common as cm

VALID = {"scalar_decay": {"sequential", "associative", "chunked"},
         "rotation": {"sequential", "associative", "chunked"},
         "damped": {"sequential", "associative"}}


def test_committed_table_is_well_formed():
    table = json.loads(auto.TABLE_PATH.read_text())
    assert "cpu" in table, "the CPU table is measured by `make bench-docs` and committed"
    for backend, cores in table.items():
        assert set(cores) == set(VALID), backend
        for core, classes in cores.items():
            bounds = [c["max_t"] for c in classes]
            assert bounds[-1] is None and all(b is not None for b in bounds[:-1]), (core, bounds)
            assert bounds[:-1] == sorted(bounds[:-1]), (core, bounds)
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
    with pytest.warns(UserWarning, match="no measured auto table for backend 'tpu'"):
        assert auto.choose("rotation", 100, backend="tpu") == auto.FALLBACK["rotation"]


def test_table_without_open_class_is_an_error(monkeypatch):
    bad = {"cpu": {"scalar_decay": [{"max_t": 8, "forward": {"algorithm": "sequential", "chunk_size": None},
                                     "train": {"algorithm": "sequential", "chunk_size": None}}]}}
    monkeypatch.setattr(auto, "load_table", lambda: bad)
    with pytest.raises(ValueError, match="open-ended"):
        auto.choose("scalar_decay", 100, backend="cpu")


@pytest.mark.parametrize("core", ["scalar_decay", "rotation"])
def test_forward_and_training_choices_dispatch(core, monkeypatch, rng):
    """forward = sequential, train = chunked: y is bit-identical to sequential's, the gradients to
    chunked's (and so within GRAD_TOL of sequential's, checked in the algorithm tests)."""
    case = checks.GRAD_CASE
    monkeypatch.setattr(auto, "choose", lambda c, t, backend=None: (("sequential", None), ("chunked", case.chunk)))
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
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g_auto)[0], jax.tree.leaves(g_chunk)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))
