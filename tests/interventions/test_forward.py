"""protocol §9 C19 (hard part) on a small random Mamba-3 LM: identity permutations reproduce the
native logits exactly; reversal is the negated angle projection; removal equals the model without
rotated pairs (same weights) and removing both B and C rotation everywhere; last-k B/C removal
leaves every earlier position bit-identical; layer windows leave the other layers native."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.interventions import Intervention, edit_param, intervened_model, scale_gate
from ssmgate.models import lm
from ssmgate.models.config import ModelCfg

CFG = ModelCfg(block="mamba3", vocab_size=32, d_model=32, n_layers=2, d_state=16, headdim=8, expand=2,
               dtype="float32", algorithm="sequential")  # 8 heads, r = 4 rotated pairs
T = 23


@pytest.fixture(scope="module")
def setup():
    params = lm.init_params(CFG, jax.random.PRNGKey(0))
    # larger angle projections than at init, so the rotations matter at this length
    params = edit_param(params, "layers_0/mixer/in_proj/kernel", lambda k: k * 3.0)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, T), 0, CFG.vocab_size)
    return params, tokens


def logits(params, tokens, intervention=Intervention(), cfg=CFG):
    return np.asarray(intervened_model(cfg, intervention).apply({"params": params}, tokens)[0])


def test_identity_permutations_are_exact(setup):
    params, tokens = setup
    native = logits(params, tokens)
    for kind in ("phase_shuffle_identity", "decay_permutation_identity"):
        np.testing.assert_array_equal(logits(params, tokens, Intervention(kind)), native, err_msg=kind)


def test_every_kind_changes_the_logits(setup):
    params, tokens = setup
    native = logits(params, tokens)
    for kind in ("phase_removal", "phase_reversal", "phase_shuffle", "decay_permutation", "remove_B", "remove_C",
                 "remove_both"):
        assert np.abs(logits(params, tokens, Intervention(kind)) - native).max() > 1e-4, kind


def _ang_columns(params):
    r = CFG.n_rot_pairs
    return params["layers_0"]["mixer"]["in_proj"]["kernel"].shape[1] - r, r


def test_reversal_is_the_negated_angle_projection(setup):
    params, tokens = setup
    start, _ = _ang_columns(params)
    negated = params
    for i in range(CFG.n_layers):
        negated = edit_param(negated, f"layers_{i}/mixer/in_proj/kernel", lambda k: k.at[:, start:].multiply(-1.0))
    np.testing.assert_allclose(logits(params, tokens, Intervention("phase_reversal")), logits(negated, tokens),
                               rtol=0, atol=1e-6)


def test_removal_equals_no_rotated_pairs_and_removing_both_rotations(setup):
    params, tokens = setup
    removed = logits(params, tokens, Intervention("phase_removal"))
    start, _ = _ang_columns(params)
    no_pairs = jax.tree_util.tree_map_with_path(   # the same weights, without the angle columns
        lambda path, leaf: leaf[:, :start] if "in_proj" in jax.tree_util.keystr(path) else leaf, params)
    cfg0 = dataclasses.replace(CFG, rope_fraction=0.0)
    np.testing.assert_allclose(removed, logits(no_pairs, tokens, cfg=cfg0), rtol=0, atol=1e-6)
    np.testing.assert_allclose(removed, logits(params, tokens, Intervention("remove_both")), rtol=0, atol=1e-6)


def test_last_k_removal_leaves_earlier_positions_bit_identical(setup):
    params, tokens = setup
    native = logits(params, tokens)
    k = 5
    for kind in ("remove_B", "remove_C", "remove_both"):
        got = logits(params, tokens, Intervention(kind, last_k=k))
        np.testing.assert_array_equal(got[:, :T - k], native[:, :T - k], err_msg=kind)
        assert np.abs(got[:, T - k:] - native[:, T - k:]).max() > 1e-4, kind


def test_layer_window_leaves_other_layers_native(setup):
    """Removal in layer 1 only: layer 0's output (the first block's residual) is untouched, so
    the logits equal those of a model whose layer-1 angles are zeroed by a weight edit."""
    params, tokens = setup
    start, _ = _ang_columns(params)
    zeroed = edit_param(params, "layers_1/mixer/in_proj/kernel", lambda k: k.at[:, start:].set(0.0))
    windowed = logits(params, tokens, Intervention("phase_removal", layers=(1, 2)))
    np.testing.assert_allclose(windowed, logits(zeroed, tokens), rtol=0, atol=1e-6)
    assert np.abs(windowed - logits(params, tokens, Intervention("phase_removal"))).max() > 1e-4


def test_decoding_with_a_cache_matches_one_run(setup):
    """remove_both with a carried state: two halves equal one run (the counter-rotation starts
    from the cache's phase)."""
    params, tokens = setup
    model = intervened_model(CFG, Intervention("remove_both"))
    whole = model.apply({"params": params}, tokens)[0]
    first, cache = model.apply({"params": params}, tokens[:, :11])
    second, _ = model.apply({"params": params}, tokens[:, 11:], cache)
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), whole, rtol=0, atol=1e-5)


def test_bad_interventions_are_named():
    with pytest.raises(ValueError, match="kind='phase_flip'"):
        Intervention("phase_flip").hooks(2)
    with pytest.raises(ValueError, match="last_k=3 with kind='phase_removal'"):
        Intervention("phase_removal", last_k=3).hooks(2)
    with pytest.raises(ValueError, match=r"layers=\(1, 3\)"):
        Intervention("phase_removal", layers=(1, 3)).hooks(2)
    m2 = dataclasses.replace(CFG, block="mamba2")
    with pytest.raises(ValueError, match="on block 'mamba2'"):
        intervened_model(m2, Intervention("phase_removal"))
    static = dataclasses.replace(CFG, transition="static")
    params = lm.init_params(static, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="transition 'static'"):
        intervened_model(static, Intervention("phase_reversal")).apply({"params": params}, jnp.zeros((1, 4), jnp.int32))


def test_param_edits_return_new_trees():
    params = lm.init_params(dataclasses.replace(CFG, block="mamba2"), jax.random.PRNGKey(0))
    scaled = scale_gate(params, 4.0)
    np.testing.assert_allclose(scaled["layers_0"]["mixer"]["A_log"],
                               params["layers_0"]["mixer"]["A_log"] + np.log(4.0), rtol=1e-6)
    edited = edit_param(params, "layers_1/mixer/D", lambda d: d * 0)
    assert float(jnp.abs(edited["layers_1"]["mixer"]["D"]).max()) == 0.0
    assert float(params["layers_1"]["mixer"]["D"].min()) == 1.0  # the input is not modified
    with pytest.raises(KeyError, match="no 'mixr' under layers_1"):
        edit_param(params, "layers_1/mixr/D", lambda d: d)
    with pytest.raises(ValueError, match="expected the same shape and dtype"):
        edit_param(params, "layers_1/mixer/D", lambda d: d[:1])
