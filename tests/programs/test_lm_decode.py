"""Greedy decoding with the cache equals re-running the whole sequence and taking the argmax, for
an SSM and a Transformer, with sweeps' stacked parameters and EOS padding."""
import jax
import numpy as np
import pytest

from ssmgate.models import lm
from ssmgate.models.config import ModelCfg
from ssmgate.train import lm_decode

MODELS = {
    "mamba2": ModelCfg(block="mamba2", vocab_size=12, d_model=16, n_layers=2, d_state=8, headdim=8),
    "mamba3": ModelCfg(block="mamba3", vocab_size=12, d_model=16, n_layers=1, d_state=8, headdim=8),
    "llama": ModelCfg(block="llama", vocab_size=12, d_model=16, n_layers=1, n_heads=2, mlp="swiglu"),
}


def reference(model, params, prompt, steps):
    seq = np.asarray(prompt)
    for _ in range(steps):
        logits, _ = model.apply({"params": params}, seq)
        seq = np.concatenate([seq, np.argmax(np.asarray(logits)[:, -1], -1)[:, None].astype(np.int32)], axis=1)
    return seq[:, prompt.shape[1]:]


@pytest.mark.parametrize("name", ["mamba2", "llama", pytest.param("mamba3", marks=pytest.mark.slow)])
def test_greedy_equals_argmax_of_whole_sequences(name):
    cfg = MODELS[name]
    model = lm.build_model(cfg)
    params = lm.init_params(cfg, jax.random.PRNGKey(1))
    prompt = np.random.default_rng(0).integers(0, 12, (3, 5)).astype(np.int32)
    got = lm_decode.greedy(model, params, prompt, 3, eos_id=99)  # an id never emitted: no stopping
    np.testing.assert_array_equal(got, reference(model, params, prompt, 3))


def test_replicas_and_eos_padding():
    cfg = MODELS["mamba2"]
    model = lm.build_model(cfg)
    stacked = jax.vmap(lambda k: lm.init_params(cfg, k))(jax.random.split(jax.random.PRNGKey(0), 2))
    prompt = np.random.default_rng(1).integers(0, 12, (2, 5)).astype(np.int32)
    got = lm_decode.greedy(model, stacked, prompt, 6, eos_id=99, replicas=True)
    for r in range(2):
        one = jax.tree.map(lambda a: a[r], stacked)
        np.testing.assert_array_equal(got[r], lm_decode.greedy(model, one, prompt, 6, eos_id=99))
    first = got[0, 0, 0]
    stopped = lm_decode.greedy(model, jax.tree.map(lambda a: a[0], stacked), prompt, 6, eos_id=int(first))
    assert (stopped[0] == first).all()  # the row's first token is EOS: the rest is EOS padding
    assert [len(r) for r in lm_decode.until_eos(stopped, int(first))][0] == 0
    with pytest.raises(ValueError, match="steps=0"):
        lm_decode.greedy(model, one, prompt, 0, eos_id=1)
