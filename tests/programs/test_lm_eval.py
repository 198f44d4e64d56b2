"""protocol §9 C18 (the PG-19 windowed protocol) and the piecewise evaluator: window starts follow
sigma = max(10, floor((L - C) / 10)), at most 11 windows a book, none for L <= C, 16 scored tokens
per window; a window's result does not depend on the windows before it (state reset); pieces and
batches do not change the numbers; position buckets pool the right targets."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from ssmgate.models import lm
from ssmgate.models.config import ModelCfg
from ssmgate.train import lm_eval
from ssmgate.tasks import long_context as lc
from tests.subprocess_env import with_cpu_devices

REPO = Path(__file__).resolve().parents[2]

CFG = ModelCfg(block="mamba3", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8, expand=2,
               dtype="float32")


@pytest.mark.parametrize("length", [100, 300, 1000, 5000])
@pytest.mark.parametrize("size", [128, 256, 512])
def test_window_starts(length, size):
    starts = lc.window_starts(length, size)
    if length <= size:
        assert starts == []
        return
    sigma = max(10, (length - size) // 10)
    assert starts == list(range(0, length - size + 1, sigma)) and starts[0] == 0
    assert starts[-1] + size <= length < starts[-1] + sigma + size
    assert len(starts) <= 11
    windows = lc.pg19_windows([length], size, score_last=16)
    assert 16 * len(windows) == 16 * len(starts)


def test_window_arguments_are_checked():
    with pytest.raises(ValueError, match="score_last=128 with window size 128"):
        lc.pg19_windows([300], 128, score_last=128)
    with pytest.raises(ValueError, match="no scored tokens"):
        lc.pooled_ppl(0.0, 0)


@pytest.fixture(scope="module")
def model_params():
    model = lm.build_model(CFG)
    return model, lm.init_params(CFG, jax.random.PRNGKey(0))


def test_windows_are_independent_and_pieces_do_not_matter(model_params):
    model, params = model_params
    rng = np.random.default_rng(0)
    books = [rng.integers(0, 16, size=n) for n in (300, 100, 170)]
    got = lm_eval.windowed_ppl(model, params, books, 64, score_last=16, batch=4, piece_len=64)
    windows = lc.pg19_windows([len(b) for b in books], 64, 16)
    assert got["n_windows"] == len(windows) and got["n_scored"] == 16 * len(windows)
    # each window alone: its C tokens from a zero state, the last 16 scored
    weights = np.zeros((1, 63), np.float32)
    weights[:, -16:] = 1.0
    alone = [lm_eval.sequence_nll(model, params, books[w.book][None, w.start:w.start + 64], weights, 64).sum()
             for w in windows]
    np.testing.assert_allclose(got["window_nll"], alone, rtol=1e-5)
    other = lm_eval.windowed_ppl(model, params, books, 64, score_last=16, batch=3, piece_len=7)
    np.testing.assert_allclose(other["window_nll"], got["window_nll"], rtol=1e-5)
    assert got["ppl"] == pytest.approx(np.exp(got["nll_sum"] / got["n_scored"]))
    assert other["accuracy"] == pytest.approx(got["accuracy"])
    # top-1 accuracy of the scored tokens, from whole-window forwards
    hits = 0
    for w in windows:
        row = np.asarray(books[w.book][w.start:w.start + 64], np.int32)
        logits, _ = model.apply({"params": params}, row[None, :-1])
        hits += int((np.argmax(np.asarray(logits)[0, -16:], -1) == row[-16:]).sum())
    assert got["accuracy"] == pytest.approx(hits / got["n_scored"])
    # a book of exactly C tokens has no window (protocol: books with L > C)
    assert lm_eval.windowed_ppl(model, params, [books[1][:64]], 64, score_last=16)["n_windows"] == 0


def test_transformer_runs_in_pieces_too():
    cfg = dataclasses.replace(CFG, block="llama", n_heads=2, mlp="swiglu", d_mlp=16)
    model, params = lm.build_model(cfg), lm.init_params(cfg, jax.random.PRNGKey(0))
    rows = np.random.default_rng(1).integers(0, 16, size=(2, 41))
    w = np.ones((2, 40), np.float32)
    np.testing.assert_allclose(lm_eval.sequence_nll(model, params, rows, w, 9),
                               lm_eval.sequence_nll(model, params, rows, w, 40), rtol=1e-5)


def test_bucket_ppl_pools_targets_by_position(model_params):
    model, params = model_params
    rows = np.random.default_rng(2).integers(0, 16, size=(3, 33))
    buckets = lc.position_buckets(32, 8)
    got = lm_eval.bucket_ppl(model, params, rows, buckets, batch=2, piece_len=5)
    nll = lm_eval.sequence_nll(model, params, rows, np.ones((3, 32), np.float32), 32)
    for lo, hi in buckets:
        assert got[(lo, hi)] == pytest.approx(np.exp(nll[:, lo:hi].mean()), rel=1e-5)
    with pytest.raises(ValueError, match=r"bucket \[0, 40\)"):
        lm_eval.bucket_ppl(model, params, rows, [(0, 40)])


def _two_device_scores():
    """In a process with 2 CPU devices: the windowed scores with the parameters on one device and
    replicated over a 2-device mesh, and the devices each piece's rows were laid over."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    model, params = lm.build_model(CFG), lm.init_params(CFG, jax.random.PRNGKey(0))
    books = [np.random.default_rng(0).integers(0, 16, size=n) for n in (300, 170)]
    mesh = Mesh(np.array(jax.devices()).reshape(1, 2), ("replica", "data"))
    spread = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    seen = []
    traced = lm_eval.piece_fn

    def recording(model):
        run = traced(model)

        def spy(params, inputs, *rest):
            seen.append(len(inputs.sharding.device_set) if isinstance(inputs, jax.Array) else 1)
            return run(params, inputs, *rest)
        return spy
    lm_eval.piece_fn = recording
    out = {}
    for name, p, batch in (("one", params, 4), ("spread", spread, 4), ("odd_batch", spread, 3)):
        seen.clear()
        out[name] = lm_eval.windowed_ppl(model, p, books, 64, score_last=16, batch=batch, piece_len=32)["window_nll"]
        out[name + "_devices"] = sorted(set(seen))
    print("RESULT " + json.dumps(out))


def test_rows_split_over_the_devices_the_params_live_on():
    """A run trained over a mesh scores each window once, its rows split over the devices (replicated
    rows would be scored on every device: half the speed on 2 CPU devices); the scores are the
    one-device scores. A batch the devices do not divide stays unsplit."""
    env = with_cpu_devices(2, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    got = json.loads([ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
    assert got["one_devices"] == [1] and got["spread_devices"] == [2] and got["odd_batch_devices"] == [1]
    np.testing.assert_allclose(got["spread"], got["one"], rtol=1e-5)
    np.testing.assert_allclose(got["odd_batch"], got["one"], rtol=1e-5)


if __name__ == "__main__":
    _two_device_scores()
