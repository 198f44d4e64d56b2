"""Upstream-layout Mamba-3 checkpoints (random weights in mamba_ssm's names, with its config.json)
converted by `load_official` against the float64 numpy model of upstream's forward in
upstream_mamba3.py, at 100 and 300 tokens (not multiples of upstream's 64-token chunk, and long
enough for the decay to show: at t = 1 it cannot, from a zero state)."""
import json

import numpy as np
import pytest

from ssmgate.interventions import convert_mamba3 as cv
from ssmgate.models import lm
from ssmgate.models.config import ModelCfg, OfficialMamba3Cfg
from tests.interventions import upstream_mamba3 as up

LENGTHS = (100, 300)
TINY = dict(d_state=16, headdim=8)          # d_model 32, expand 2: 8 heads of 8 channels
LM = dict(d_model=32, n_layer=2, vocab_size=61, pad_vocab_size_multiple=8)  # 61 tokens padded to 64
# Together they cover tied/untied heads, with/without MLP, 1 and 2 groups, rope fraction 0.5 and 1.0,
# SISO and MIMO (ranks 2 and 4), with and without the out-proj norm.
VARIANTS = {
    "siso_tied_nomlp_g1_rope05": up.make_config(dict(TINY, ngroups=1, rope_fraction=0.5), **LM),
    "siso_untied_mlp_g2_rope1": up.make_config(dict(TINY, ngroups=2, rope_fraction=1.0), **LM, d_intermediate=40,
                                               tie_embeddings=False),
    "mimo2_untied_mlp_g1_rope05": up.make_config(dict(TINY, ngroups=1, rope_fraction=0.5, is_mimo=True,
                                                      mimo_rank=2), **LM, d_intermediate=40, tie_embeddings=False),
    "mimo4_tied_nomlp_g2_rope1": up.make_config(dict(TINY, ngroups=2, rope_fraction=1.0, is_mimo=True,
                                                     mimo_rank=4), **LM),
    "siso_outproj_norm": up.make_config(dict(TINY, is_outproj_norm=True), **LM),
    "mimo2_outproj_norm_g2": up.make_config(dict(TINY, ngroups=2, is_mimo=True, mimo_rank=2, is_outproj_norm=True),
                                            **LM, d_intermediate=40),
}
RTOL = 1e-3   # the bar; measured errors are ~1e-6 (float32 against float64)


def tokens(t, vocab=61, batch=2):
    return np.random.default_rng(t).integers(0, vocab, (batch, t)).astype(np.int32)


@pytest.fixture(scope="module", params=sorted(VARIANTS), ids=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    config = VARIANTS[request.param]
    sd = up.random_state_dict(config)
    folder = up.write_checkpoint(tmp_path_factory.mktemp(request.param), config, sd)
    return config, sd, folder


def test_converted_logits_match_upstream_at_100_and_300_tokens(checkpoint):
    config, sd, folder = checkpoint
    cfg = cv.official_config(folder)
    params = cv.load_official(folder)
    model = lm.build_model(cfg)
    for t in LENGTHS:
        toks = tokens(t)
        want = up.lm_logits(sd, config, toks)
        got = np.asarray(lm.logits(model, params, toks))
        assert got.shape == want.shape == (2, t, 64)
        err = cv.max_relative_error(got, want)
        assert err < RTOL, (t, err)
        # the decay shows: the softplus model is far from it at these lengths
        assert cv.max_relative_error(up.lm_logits(sd, config, toks, "softplus"), want) > 0.05


def test_config_json_sets_every_semantic():
    cfg = cv.config_from_upstream(VARIANTS["mimo2_untied_mlp_g1_rope05"])
    assert cfg == ModelCfg(block="mamba3", transition="native", vocab_size=64, d_model=32, n_layers=2,
                           tie_embeddings=False, mlp="swiglu", d_mlp=128, norm_eps=1e-5, d_state=16, expand=2,
                           headdim=8, n_groups=1, rope_fraction=0.5, mimo_rank=2, a_floor=1e-4, a_activation="heavy")
    norm = cv.config_from_upstream(VARIANTS["siso_outproj_norm"])
    assert isinstance(norm, OfficialMamba3Cfg) and norm.outproj_norm and norm.mimo_rank == 1
    # SISO ignores mimo_rank, as Mamba3 does; A_floor is read
    siso = cv.config_from_upstream(up.make_config(dict(TINY, mimo_rank=8, A_floor=0.01), **LM))
    assert siso.mimo_rank == 1 and siso.a_floor == 0.01 and type(siso) is ModelCfg


def test_overrides_are_checked_against_config_json(checkpoint):
    config, sd, folder = checkpoint
    cfg = cv.official_config(folder, dtype="bfloat16", algorithm="sequential", d_model=32)  # free, or equal
    assert cfg.dtype == "bfloat16" and cfg.algorithm == "sequential"
    with pytest.raises(ValueError, match=r"d_state=32 \(config.json gives 16\)"):
        cv.official_config(folder, d_state=32)
    with pytest.raises(ValueError, match=r"overrides \['dt_min'\] are not ModelCfg fields"):
        cv.official_config(folder, dt_min=0.1)
    given = cfg.replace(n_groups=3 - cfg.n_groups) if cfg.n_ssm_heads % 2 == 0 else cfg
    with pytest.raises(ValueError, match=r"given ModelCfg contradicts.*n_groups="):
        cv.load_official(folder, given)
    assert cv.official_config(folder, cfg) == cfg   # an agreeing cfg passes through


def test_softplus_is_selectable_for_weights_from_before_the_change(tmp_path):
    config = VARIANTS["siso_untied_mlp_g2_rope1"]
    sd = up.random_state_dict(config, seed=3)
    folder = up.write_checkpoint(tmp_path, config, sd)
    toks = tokens(100)
    want = up.lm_logits(sd, config, toks, "softplus")
    cfg = cv.official_config(folder, a_activation="softplus")
    assert cfg.a_activation == "softplus"
    got = np.asarray(lm.logits(lm.build_model(cfg), cv.load_official(folder, a_activation="softplus"), toks))
    assert cv.max_relative_error(got, want) < RTOL


def test_wrong_activation_fails_the_logits_check(tmp_path):
    """A heavy-tail checkpoint declared softplus does not load silently when reference logits exist;
    declared right, it loads."""
    config = VARIANTS["mimo2_untied_mlp_g1_rope05"]
    sd = up.random_state_dict(config, seed=5)
    folder = up.write_checkpoint(tmp_path / "ckpt", config, sd)
    toks = tokens(100, batch=1)
    np.savez(tmp_path / "reference.npz", tokens=toks, logits=up.lm_logits(sd, config, toks))
    with pytest.raises(ValueError, match=r"differ from the reference by .* a_activation='softplus'"):
        cv.load_official(folder, a_activation="softplus", reference=tmp_path / "reference.npz")
    params = cv.load_official(folder, reference=tmp_path / "reference.npz")  # heavy, from config.json's revision
    assert cv.check_logits(cv.official_config(folder), params, toks, up.lm_logits(sd, config, toks)) < RTOL


def test_mimo_state_order_matters(tmp_path):
    """Converting a MIMO checkpoint as if its state pairs were interleaved (no reorder) fails."""
    config = VARIANTS["mimo4_tied_nomlp_g2_rope1"]
    sd = up.random_state_dict(config, seed=7)
    cfg = cv.config_from_upstream(config)
    toks = tokens(100, batch=1)
    want = up.lm_logits(sd, config, toks)
    undo = np.argsort(cv.mimo_state_order(cfg.d_state))
    naive = dict(sd)
    bc = cfg.n_groups * cfg.d_state * cfg.mimo_rank
    for key, a in sd.items():
        if key.endswith(("B_norm.weight", "C_norm.weight", "B_bias", "C_bias")):
            naive[key] = a[..., undo]
        elif key.endswith("in_proj.weight"):
            a = a.copy()
            for start in (2 * cfg.d_inner, 2 * cfg.d_inner + bc):
                a[start:start + bc] = a[start:start + bc].reshape(-1, cfg.d_state, cfg.d_model)[:, undo].reshape(bc, -1)
            naive[key] = a
    model = lm.build_model(cfg)
    assert cv.max_relative_error(np.asarray(lm.logits(model, cv.convert_state_dict(sd, cfg), toks)), want) < RTOL
    assert cv.max_relative_error(np.asarray(lm.logits(model, cv.convert_state_dict(naive, cfg), toks)), want) > 0.01


@pytest.mark.parametrize("change, pattern", [
    (dict(ssm_cfg={"layer": "Mamba2"}), r"ssm_cfg.layer='Mamba2'.*expected 'Mamba3'"),
    (dict(ssm_cfg={}), r"ssm_cfg.layer='Mamba1' \(missing means 'Mamba1'\)"),
    (dict(rms_norm=False), r"rms_norm=False.*expected rms_norm=True"),
    (dict(attn_layer_idx=[1]), r"attn_layer_idx=\[1\].*no hybrid attention"),
    (dict(norm_epsilon=1e-6), r"keys \['norm_epsilon'\] that mamba_ssm's MambaConfig does not take"),
    (dict(ssm_cfg={"layer": "Mamba3", "rope_fraction": 0.25}), r"rope_fraction=0.25.*0.5 or 1.0"),
    (dict(ssm_cfg={"layer": "Mamba3", "new_option": 1}), r"ssm_cfg has keys \['new_option'\]"),
    (dict(ssm_cfg={"layer": "Mamba3", "expand": 1.5, "headdim": 8}), r"expand=1.5.*integer expand"),
    (dict(ssm_cfg={"layer": "Mamba3", "d_state": 6, "is_mimo": True, "headdim": 8}), r"d_state=6.*multiple of 4"),
])
def test_options_that_cannot_convert_are_refused_by_name(change, pattern):
    config = {**up.make_config(TINY, **LM), **change}
    with pytest.raises(ValueError, match=pattern):
        cv.config_from_upstream(config)


def test_options_without_effect_are_accepted():
    """Initialisation, tiling, fusion and residual precision do not change the function."""
    ssm = dict(TINY, dt_min=0.01, dt_max=0.2, dt_init_floor=1e-3, chunk_size=16, dropout=0.1,
               fuse_pregate_headwise_norm=False)
    base = cv.config_from_upstream(up.make_config(TINY, **LM))
    assert cv.config_from_upstream(up.make_config(ssm, **LM, fused_add_norm=False, residual_in_fp32=False)) == base
    assert set(cv.NO_EFFECT) <= set(cv.MAMBA3_DEFAULTS) | set(cv.LM_DEFAULTS)


def test_no_config_json_needs_the_activation(tmp_path):
    config = VARIANTS["siso_tied_nomlp_g1_rope05"]
    folder = up.write_checkpoint(tmp_path, config, up.random_state_dict(config))
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match=r"do not tell which decay activation"):
        cv.load_official(folder)
    assert cv.official_config(folder, a_activation="heavy") == cv.config_from_upstream(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert cv.read_config(tmp_path / "model.safetensors") == config   # found beside a file path too
