"""Model configuration: one frozen dataclass for every model of the zoo (protocol §0.2, §1.2-1.5).

`ModelCfg` is the whole definition of a model; it is logged with every run and built by
`ssmgate.models.lm.build_model`. Fields that do not apply to a `block` are ignored by it (and
say so in their comment). `validate()` raises `ValueError` naming the field, the value and what
is allowed.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

BLOCKS = ("mamba2", "mamba3", "gpt_neox", "llama")
# Mamba-3 family: what turns the state. "native" = input-dependent rotation (Mamba-3, the
# underdamped row of P2 Table 2); "none" = no rotation; "static" = learned per head/pair angle,
# independent of input and dt (protocol §1.4); "under" | "critical" | "over" = the companion-form
# second-order damped cores of protocol §1.5 with everything else identical.
TRANSITIONS = ("native", "none", "static", "under", "critical", "over")
MLPS = ("none", "swiglu", "gelu")
DTYPES = ("float32", "bfloat16")
ALGORITHMS = ("auto", "sequential", "associative", "chunked", "pallas")
DAMPED = ("under", "critical", "over")
# Mamba-3's data-dependent decay A_t = -max(act(dd_A_t), a_floor). "heavy": 1+u for u >= 0,
# 1/(1-u) for u < 0, as mamba_ssm/modules/mamba3.py since c69aaab (2026-06-02); "softplus": that
# module before (docs/interventions.md, "Official checkpoints").
A_ACTIVATIONS = ("heavy", "softplus")


@dataclasses.dataclass(frozen=True)
class ModelCfg:
    block: str = "mamba2"             # one of BLOCKS
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    tie_embeddings: bool = True
    mlp: str = "none"                 # an MLP after every mixer (pre-norm residual); transformers need one
    d_mlp: int = 0                    # MLP hidden width (0: 4 d_model for gelu, 8/3 d_model rounded to 64 for swiglu)
    norm_eps: float = 1e-5
    dtype: str = "float32"            # compute dtype; parameters and optimizer state stay float32
    # --- SSM mixers (mamba2, mamba3) ---
    d_state: int = 128
    expand: int = 2
    headdim: int = 64
    n_groups: int = 1
    algorithm: str = "auto"           # core algorithm (sequential | associative | chunked | auto)
    chunk_size: Optional[int] = None
    conv_width: int = 4               # mamba2 only: causal depthwise conv
    # Mamba-2 gate initialisation (protocol §1.2): A = -exp(A_log), A_log = log U(a_init_lo, a_init_hi)
    # per head; head_a_ranges, when given, is one (lo, hi) per head and replaces (a_init_lo, a_init_hi).
    # P1's gate offset delta is not a model field: a run's replicas hold it (train/run_spec.py Grid).
    a_init_lo: float = 1.0
    a_init_hi: float = 16.0
    head_a_ranges: Optional[tuple] = None
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    dt_floor: float = 1e-4
    # --- Mamba-3 (protocol §1.3, 1.4) ---
    transition: str = "native"        # one of TRANSITIONS
    rope_fraction: float = 0.5        # rotated pairs r = d_state * rope_fraction / 2
    mimo_rank: int = 1
    a_floor: float = 1e-4
    a_activation: str = "heavy"       # one of A_ACTIVATIONS
    overdamped_c: float = 0.9
    # --- Transformers (gpt_neox, llama) ---
    n_heads: int = 4
    rotary_fraction: float = 1.0
    rope_base: float = 10000.0

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def n_ssm_heads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def n_rot_pairs(self) -> int:
        # As the official module: the rotated width d_state * rope_fraction, rounded down to even.
        return int(self.d_state * self.rope_fraction) // 2

    def validate(self) -> "ModelCfg":
        def bad(field, allowed):
            raise ValueError(f"ModelCfg.{field}={getattr(self, field)!r}: expected {allowed}")

        if self.block not in BLOCKS:
            bad("block", f"one of {BLOCKS}")
        if self.transition not in TRANSITIONS:
            bad("transition", f"one of {TRANSITIONS}")
        if self.mlp not in MLPS:
            bad("mlp", f"one of {MLPS}")
        if self.dtype not in DTYPES:
            bad("dtype", f"one of {DTYPES}")
        if self.algorithm not in ALGORITHMS:
            bad("algorithm", f"one of {ALGORITHMS}")
        if self.algorithm == "pallas" and (self.transition in DAMPED or self.mimo_rank > 1):
            bad("algorithm", "not 'pallas' for a damped transition or MIMO (mimo_rank > 1): the Pallas kernel "
                "serves scalar_decay and rotation; use 'auto' or 'chunked'")
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size < 1):
            bad("chunk_size", "None or an integer >= 1")
        if self.a_activation not in A_ACTIVATIONS:
            bad("a_activation", f"one of {A_ACTIVATIONS}")
        if not self.a_floor > 0.0:
            bad("a_floor", "a value > 0")
        for field in ("vocab_size", "d_model", "n_layers", "d_state", "expand", "headdim", "n_groups",
                      "conv_width", "mimo_rank", "n_heads"):
            if getattr(self, field) < 1:
                bad(field, "an integer >= 1")
        if self.block in ("mamba2", "mamba3"):
            if self.d_inner % self.headdim:
                bad("headdim", f"a divisor of d_inner = expand * d_model = {self.d_inner}")
            if self.n_ssm_heads % self.n_groups:
                bad("n_groups", f"a divisor of the number of heads {self.n_ssm_heads}")
        if self.block in ("gpt_neox", "llama") and self.d_model % self.n_heads:
            bad("n_heads", f"a divisor of d_model = {self.d_model}")
        if self.block in ("gpt_neox", "llama") and self.mlp == "none":
            bad("mlp", f"'gelu' or 'swiglu' for block = {self.block!r} (a transformer block needs its MLP)")
        if self.d_mlp < 0:
            bad("d_mlp", "0 (the default width) or a positive width")
        if not 0.0 <= self.rope_fraction <= 1.0:
            bad("rope_fraction", "a value in [0, 1]")
        if not 0.0 <= self.rotary_fraction <= 1.0:
            bad("rotary_fraction", "a value in [0, 1]")
        if not 0.0 < self.a_init_lo <= self.a_init_hi:
            bad("a_init_lo", f"0 < a_init_lo <= a_init_hi = {self.a_init_hi}")
        if not 0.0 < self.dt_min <= self.dt_max:
            bad("dt_min", f"0 < dt_min <= dt_max = {self.dt_max}")
        if not 0.0 < self.overdamped_c < 1.0:
            bad("overdamped_c", "a value in (0, 1)")
        if self.head_a_ranges is not None:
            if len(self.head_a_ranges) != self.n_ssm_heads or any(
                    not (0.0 < lo <= hi) for lo, hi in self.head_a_ranges):
                bad("head_a_ranges", f"{self.n_ssm_heads} pairs (lo, hi) with 0 < lo <= hi, one per head")
        if self.mimo_rank > 1 and self.block != "mamba3":
            bad("mimo_rank", "1 unless block = 'mamba3'")
        if self.block == "mamba3" and self.transition in DAMPED and self.mimo_rank > 1:
            bad("mimo_rank", f"1 for the damped transition {self.transition!r} (MIMO: native, none, static)")
        return self

    def replace(self, **changes) -> "ModelCfg":
        return dataclasses.replace(self, **changes).validate()


@dataclasses.dataclass(frozen=True)
class OfficialMamba3Cfg(ModelCfg):
    """A Mamba-3 ModelCfg with the option of upstream mamba_ssm's `Mamba3` that ssmgate's own models
    do not use. `outproj_norm` (upstream `is_outproj_norm`): the mixer output is RMS-normalised per
    head over its headdim channels (eps 1e-5, scale `mixer/out_norm_scale` of d_inner) before the
    silu(z) gate; with MIMO per rank, before mimo_o. A subclass, not a ModelCfg field: programs key
    their checkpoints by a hash of every ModelCfg field, and a new field would orphan all of them."""
    outproj_norm: bool = False

    def validate(self) -> "OfficialMamba3Cfg":
        super().validate()
        if self.outproj_norm and (self.block != "mamba3" or self.transition in DAMPED):
            raise ValueError(f"OfficialMamba3Cfg.outproj_norm=True with block={self.block!r}, transition="
                             f"{self.transition!r}: expected block 'mamba3' with transition native, none or static")
        return self


def config_class(fields: dict):
    """The config class a dict of fields (e.g. `dataclasses.asdict` of a config) belongs to."""
    return OfficialMamba3Cfg if "outproj_norm" in fields else ModelCfg
