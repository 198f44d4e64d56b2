"""The papers' models as named `ModelCfg` presets, and parameter counts from the real modules.

`param_count`, `count_breakdown` (a dict by kind) and `count_table` (its printable text) trace
`init` with `jax.eval_shape` (shapes only, nothing allocated), so they count exactly what
`init_params` would create. Counts below are
`param_count` of each preset ("paper" = the size the paper states, where it states one):

| preset                  | model                                                         |    params | paper |
|-------------------------|---------------------------------------------------------------|-----------|-------|
| p1_kv_mamba2            | Mamba-2 24 L, d 768, expand 2, 24 heads x 64, N 128, tied     |   90.42 M |   -   |
| p1_kv_gpt_neox          | GPT-NeoX 12 L, d 768, 12 heads, FFN 3072 GELU, rotary 1, tied |   85.11 M |   -   |
| p1_horn_mamba2          | Mamba-2 4 L, d 2048, expand 2, 16 heads x 256, N 256, tied    |  105.21 M |   -   |
| p1_horn_llama           | Llama 4 L, d 1024, 8 heads x 128, SwiGLU 2752, tied           |   50.65 M |   -   |
| p1_bfcl_mamba2_1p5b     | Mamba-2 32 L, d 2048, N 128, 8 groups, vocab 131072, untied   | 1481.78 M | 1.5 B |
| p1_bfcl_llama_2b        | Llama 28 L, d 2048, 16 heads x 128, SwiGLU 5504, untied       | 1953.61 M |   2 B |
| p2_lm_187m_rope05       | Mamba-3 MIMO-4 12 L, d 768 + SwiGLU 1280 per layer, tied      |  187.29 M | 187 M |
| p2_lm_187m_rope0        | the same without rotation (no angle projection)               |  187.00 M | 187 M |
| p2_lm_444m_rope05       | Mamba-3 MIMO-4 24 L, d 1024 + SwiGLU 1728 per layer, tied     |  439.48 M | 444 M |
| p2_lm_444m_rope0        | the same without rotation                                     |  438.69 M | 444 M |
| p2_st_l1_{core}         | d_model = d_state = 64, expand 2, 8 heads x 16, tied, 1 L     | 35-37 k   |   -   |
| p2_st_l3_{core}         | the same, 3 L                                                 | 105-110 k |   -   |
(tests/models/test_presets.py prints every count and checks the stated sizes to +-5%.)

Choices where the papers are silent (protocol §10 items 10, 22):
- KV vocab 72 (protocol §3.1 layout: 64 content tokens + 5 specials, padded to 72); Horn vocab 48
  (protocol §4.2 character tokens: 45, padded to 48); state-tracking vocab 10 (the largest of the
  three tasks, protocol §6.1); Horn widths as protocol §4.6 [INF/REC], both tied.
- BFCL (P1 §5.2: "1.5B / 2B incl. embeddings", data Nemotron-CC-HQ): we assume the Nemotron
  tokenizer (vocab 131072) and untied embeddings for both, as NVIDIA's Megatron-LM models trained
  on that data, and Megatron's Mamba-2 layout (8 B/C groups, headdim 64, d_state 128, expand 2).
  With one B/C group the Mamba-2 model would have 1.36 B (-9%); the Llama is MHA with the
  default SwiGLU width 8/3 d.
- P2 LM 187M / 444M (protocol §7.1, §10.22): the stored Mamba-3 reference code
  (state-spaces/mamba, mamba_ssm/modules/mamba3.py) fixes the mixer only, not the LM stack. [INF]
  The Mamba-3 paper's LMs are Llama-like (each mixer followed by a SwiGLU MLP, pre-norm, tied
  embeddings), with a narrower MLP for MIMO to stay parameter-matched. Measured alternatives
  (187M / 444M): mixers only, tied: 151.9 M (-19%) / 312.1 M (-30%); mixers only, untied:
  250.4 M (+34%) / 443.4 M (-0.1%); SwiGLU of the default width 8/3 d, tied: 208.5 M (+11%) /
  515.0 M (+16%). A SwiGLU of width 5/3 d (1280; 1706.7 rounded up to a multiple of 64 = 1728)
  after every mixer, tied, is the one rule that matches both sizes within 2% (187.3 M, 439.5 M),
  so that is the composition used. Expand 2, chunk 16 (MIMO: chunk * R <= 64).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.models.config import ModelCfg
from ssmgate.models.lm import build_model

# --- P1 multi-token KV retrieval (protocol §3.2) ---
_KV = dict(vocab_size=72, tie_embeddings=True)
P1_KV_MAMBA2 = ModelCfg(block="mamba2", n_layers=24, d_model=768, expand=2, headdim=64, d_state=128, **_KV)
P1_KV_GPT_NEOX = ModelCfg(block="gpt_neox", n_layers=12, d_model=768, n_heads=12, mlp="gelu", d_mlp=3072,
                          rotary_fraction=1.0, rope_base=10000.0, **_KV)

# --- P1 Horn clauses (protocol §4.6) ---
_HORN = dict(vocab_size=48, tie_embeddings=True)
P1_HORN_MAMBA2 = ModelCfg(block="mamba2", n_layers=4, d_model=2048, expand=2, headdim=256, d_state=256, **_HORN)
P1_HORN_LLAMA = ModelCfg(block="llama", n_layers=4, d_model=1024, n_heads=8, mlp="swiglu", **_HORN)

# --- P1 BFCL (protocol §5.2); vocab and tying assumed, see the module docstring ---
_BFCL = dict(vocab_size=131072, tie_embeddings=False, d_model=2048)
P1_BFCL_MAMBA2 = ModelCfg(block="mamba2", n_layers=32, expand=2, headdim=64, d_state=128, n_groups=8, **_BFCL)
P1_BFCL_LLAMA = ModelCfg(block="llama", n_layers=28, n_heads=16, mlp="swiglu", **_BFCL)

# --- P2 language modelling (protocol §7.1) ---
_P2_LM = dict(block="mamba3", vocab_size=128256, tie_embeddings=True, d_state=128, expand=2, headdim=64,
              mimo_rank=4, chunk_size=16, mlp="swiglu", dtype="bfloat16")
P2_LM_187M = ModelCfg(n_layers=12, d_model=768, d_mlp=1280, **_P2_LM)
P2_LM_444M = ModelCfg(n_layers=24, d_model=1024, d_mlp=1728, **_P2_LM)
# rotation fraction 0 = Mamba-3 without rotation (protocol §1.4: no angle projection).
NO_ROTATION = dict(transition="none", rope_fraction=0.0)

# --- P2 state tracking (protocol §6.2); core names as StateTrackCfg.core ---
_P2_ST = dict(vocab_size=10, d_model=64, d_state=64, expand=2, headdim=16, tie_embeddings=True)
ST_CORES = {
    "mamba2": dict(block="mamba2"),
    "m3_native": dict(block="mamba3", transition="native"),
    "m3_norot": dict(block="mamba3", **NO_ROTATION),
    "m3_static": dict(block="mamba3", transition="static"),
    "damped_under": dict(block="mamba3", transition="under"),
    "damped_crit": dict(block="mamba3", transition="critical"),
    "damped_over": dict(block="mamba3", transition="over"),
}


def state_tracking(core: str, n_layers: int) -> ModelCfg:
    """The P2 state-tracking model: 1 layer (parity, mod 3) or 3 (arithmetic)."""
    if core not in ST_CORES:
        raise ValueError(f"state_tracking: core={core!r}; expected one of {tuple(ST_CORES)}")
    return ModelCfg(n_layers=n_layers, **_P2_ST, **ST_CORES[core]).validate()


PRESETS: dict[str, ModelCfg] = {
    "p1_kv_mamba2": P1_KV_MAMBA2,
    "p1_kv_gpt_neox": P1_KV_GPT_NEOX,
    "p1_horn_mamba2": P1_HORN_MAMBA2,
    "p1_horn_llama": P1_HORN_LLAMA,
    "p1_bfcl_mamba2_1p5b": P1_BFCL_MAMBA2,
    "p1_bfcl_llama_2b": P1_BFCL_LLAMA,
    "p2_lm_187m_rope05": P2_LM_187M,
    "p2_lm_187m_rope0": dataclasses.replace(P2_LM_187M, **NO_ROTATION),
    "p2_lm_444m_rope05": P2_LM_444M,
    "p2_lm_444m_rope0": dataclasses.replace(P2_LM_444M, **NO_ROTATION),
    **{f"p2_st_l{n}_{core}": state_tracking(core, n) for n in (1, 3) for core in ST_CORES},
}

# Sizes the papers state (parameters including embeddings).
PAPER_SIZES: dict[str, float] = {
    "p1_bfcl_mamba2_1p5b": 1.5e9,
    "p1_bfcl_llama_2b": 2.0e9,
    "p2_lm_187m_rope05": 187e6,
    "p2_lm_187m_rope0": 187e6,
    "p2_lm_444m_rope05": 444e6,
    "p2_lm_444m_rope0": 444e6,
}


def preset(name: str) -> ModelCfg:
    if name not in PRESETS:
        raise ValueError(f"preset: name={name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name].validate()


def param_shapes(cfg: ModelCfg, seq_len: int = 1) -> dict:
    """The params pytree of `cfg` as ShapeDtypeStructs (traced by eval_shape: no allocation). A fresh
    copy of a cached tree: a dry run asks for the same model's shapes several times, and tracing a
    paper-size model's init takes seconds."""
    try:
        hash(cfg)
    except TypeError:  # a config holding an unhashable field (a list) is traced without the cache
        return _traced_param_shapes.__wrapped__(cfg, seq_len)
    return jax.tree.map(lambda leaf: leaf, _traced_param_shapes(cfg, seq_len))


@functools.lru_cache(maxsize=64)
def _traced_param_shapes(cfg: ModelCfg, seq_len: int) -> dict:
    model = build_model(cfg)
    tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    variables = jax.eval_shape(lambda key, tok: model.init(key, tok), jax.random.key(0), tokens)
    return variables["params"]


def _category(path) -> str:
    """Which row of `count_table` a parameter belongs to, from its params-pytree path."""
    top = path[0]
    if top in ("embed", "lm_head"):
        return "embeddings"
    if top.startswith("layers_"):
        if path[1] in ("mixer", "attn"):
            return "mixers"
        if path[1] == "mlp":
            return "mlp"
    return "norms"  # block pre-norms and the final norm


def count_breakdown(cfg: ModelCfg) -> dict[str, int]:
    """Parameters by kind: embeddings (incl. an untied head), mixers (SSM or attention), mlp,
    norms (block and final norms; norms inside a mixer count as mixer), and total."""
    rows = {"embeddings": 0, "mixers": 0, "mlp": 0, "norms": 0}
    for path, leaf in jax.tree_util.tree_flatten_with_path(param_shapes(cfg))[0]:
        keys = tuple(getattr(k, "key", str(k)) for k in path)
        rows[_category(keys)] += int(np.prod(leaf.shape))
    rows["total"] = sum(rows.values())
    return rows


def param_count(cfg: ModelCfg) -> int:
    return count_breakdown(cfg)["total"]


def count_table(cfg: ModelCfg, name: str = "") -> str:
    """`count_breakdown` as printable lines, with each row's share of the total."""
    rows = count_breakdown(cfg)
    lines = [f"parameters of {name or cfg.block}:"]
    lines += [f"  {k:<11}{v:>15,}  {100 * v / rows['total']:5.1f}%" for k, v in rows.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    for preset_name, preset_cfg in PRESETS.items():
        total = param_count(preset_cfg)
        paper = PAPER_SIZES.get(preset_name)
        note = f"  paper {paper / 1e6:.0f} M ({100 * (total / paper - 1):+.1f}%)" if paper else ""
        print(f"{preset_name:<24}{total:>15,}{note}")
