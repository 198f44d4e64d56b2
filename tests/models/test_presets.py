"""Paper presets: they validate, their shapes are the papers', stated sizes are met within 5%."""
import jax
import numpy as np
import pytest

from ssmgate.models.lm import init_params
from ssmgate.models.presets import (PAPER_SIZES, PRESETS, ST_CORES, count_breakdown, count_table, param_count,
                                    param_shapes, preset, state_tracking)


@pytest.fixture(scope="module")
def tables():
    return {name: count_breakdown(cfg) for name, cfg in PRESETS.items()}


def test_every_preset_validates_and_counts(tables, capsys):
    with capsys.disabled():
        print()
        for name, rows in tables.items():
            paper = PAPER_SIZES.get(name)
            note = f"  (paper {paper / 1e6:.0f} M: {100 * (rows['total'] / paper - 1):+.2f}%)" if paper else ""
            print(f"  {name:<24}{rows['total']:>15,}{note}")
    for name, cfg in PRESETS.items():
        assert preset(name) == cfg.validate()
        rows = tables[name]
        assert rows["total"] == rows["embeddings"] + rows["mixers"] + rows["mlp"] + rows["norms"]
        embed = cfg.vocab_size * cfg.d_model
        assert rows["embeddings"] == (embed if cfg.tie_embeddings else 2 * embed), name
        assert (rows["mlp"] == 0) == (cfg.mlp == "none"), name


@pytest.mark.parametrize("name", sorted(PAPER_SIZES))
def test_stated_sizes_within_five_percent(tables, name):
    assert abs(tables[name]["total"] / PAPER_SIZES[name] - 1) <= 0.05, (name, tables[name]["total"])


def test_paper_shapes():
    kv = PRESETS["p1_kv_mamba2"]
    assert (kv.n_layers, kv.d_model, kv.d_inner, kv.n_ssm_heads, kv.headdim, kv.d_state) == (24, 768, 1536, 24, 64, 128)
    neox = PRESETS["p1_kv_gpt_neox"]
    assert (neox.n_layers, neox.d_model, neox.n_heads, neox.d_mlp, neox.rotary_fraction) == (12, 768, 12, 3072, 1.0)
    horn = PRESETS["p1_horn_mamba2"]
    assert (horn.n_layers, horn.n_ssm_heads, horn.headdim, horn.d_state) == (4, 16, 256, 256)
    llama = PRESETS["p1_horn_llama"]
    assert (llama.n_layers, llama.n_heads, llama.d_model // llama.n_heads) == (4, 8, 128)
    for name, rot in (("p2_lm_187m_rope05", 32), ("p2_lm_187m_rope0", 0), ("p2_lm_444m_rope05", 32)):
        cfg = PRESETS[name]
        assert (cfg.block, cfg.mimo_rank, cfg.d_state, cfg.headdim, cfg.chunk_size, cfg.vocab_size) == \
            ("mamba3", 4, 128, 64, 16, 128256)
        assert cfg.n_rot_pairs == rot
    st = PRESETS["p2_st_l3_m3_native"]
    assert (st.n_layers, st.d_model, st.d_state, st.n_ssm_heads, st.headdim) == (3, 64, 64, 8, 16)
    assert {f"p2_st_l{n}_{c}" for n in (1, 3) for c in ST_CORES} <= set(PRESETS)


def test_counts_are_shapes_only_and_match_a_real_init():
    shapes = param_shapes(PRESETS["p1_bfcl_llama_2b"])
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree_util.tree_leaves(shapes))
    cfg = PRESETS["p2_st_l1_m3_native"].replace(algorithm="sequential")
    real = init_params(cfg, jax.random.key(0))
    assert param_count(cfg) == sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(real))


def test_lookup_errors_and_table_text():
    with pytest.raises(ValueError, match="preset: name='p9'; expected one of"):
        preset("p9")
    with pytest.raises(ValueError, match="state_tracking: core='lstm'"):
        state_tracking("lstm", 1)
    text = count_table(PRESETS["p2_st_l1_mamba2"], "st")
    assert text.splitlines()[0] == "parameters of st:" and "embeddings" in text
    assert text.splitlines()[-1].split()[:2] == ["total", f"{param_count(PRESETS['p2_st_l1_mamba2']):,}"]
