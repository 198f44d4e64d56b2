"""A float64 numpy model of upstream mamba_ssm's Mamba-3 language model, and checkpoints in its layout.

Written from reading mamba_ssm (github.com/state-spaces/mamba at e9594ce, 2026-07-23):
models/mixer_seq_simple.py (MambaLMHeadModel, MixerModel, create_block), models/config_mamba.py
(config.json is MambaConfig's __dict__), modules/block.py (Add -> Norm -> Mixer, then
Add -> Norm2 -> MLP), modules/mlp.py (GatedMLP, hidden width rounded up to 128),
modules/mamba3.py (Mamba3.forward) and the recurrent reference ops its kernels are tested
against (tests/ops/triton/test_mamba3_siso.py, tests/ops/tilelang/test_mamba3_mimo.py, the
kernel-aligned rotation of the MIMO chunk reference). Nothing here comes from ssmgate: the names,
shapes, state order and rotation pairs are upstream's, so a converter bug cannot cancel out.

The mixer runs token by token, as upstream's step references do:
  A = -max(act(dd_A), A_floor) with act = heavy tail (1 + x, x >= 0; 1 / (1 - x), x < 0) or softplus,
  dt = softplus(dd_dt + dt_bias), lam = sigmoid(trap), alpha = exp(A dt),
  phase += pi tanh(angle) dt; B, C: RMSNorm over N (eps 1e-5) + per-head bias, then rotated by phase:
  SISO pairs (2i, 2i + 1), MIMO pairs (i, i + N/2), i < r (the kernels' rotate-half layout),
  S = alpha S + (1 - lam) dt alpha sum_r k'_r v'_r + lam dt sum_r k_r v_r   (k', v': the previous token's),
  out_r = S q_r + D v_r, v_r = x * mimo_x[r] (SISO: v = x), gate silu(z_r), z_r = z * mimo_z[r],
  with is_outproj_norm the per-head RMSNorm over P (eps 1e-5) times its weight before the gate;
  MIMO sums the ranks with mimo_o.
"""
from __future__ import annotations

import json
import os

import numpy as np

# MambaConfig's fields and defaults, and Mamba3's keywords used here (upstream's own defaults).
LM_FIELDS = {"d_model": 2560, "d_intermediate": 0, "n_layer": 64, "vocab_size": 50277, "ssm_cfg": {},
             "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True,
             "fused_add_norm": True, "pad_vocab_size_multiple": 8, "tie_embeddings": True}
SSM_DEFAULTS = {"d_state": 128, "expand": 2, "headdim": 64, "ngroups": 1, "rope_fraction": 0.5, "A_floor": 1e-4,
                "is_outproj_norm": False, "is_mimo": False, "mimo_rank": 4, "chunk_size": 64}


def make_config(ssm_cfg: dict, **lm) -> dict:
    """config.json as save_pretrained writes it: every MambaConfig field."""
    return {**LM_FIELDS, **lm, "ssm_cfg": {"layer": "Mamba3", **ssm_cfg}}


def dims(config: dict) -> dict:
    """Upstream's derived sizes (Mamba3.__init__, MambaLMHeadModel.__init__, GatedMLP.__init__)."""
    m = {**SSM_DEFAULTS, **config["ssm_cfg"]}
    d = config["d_model"]
    d_inner = int(m["expand"] * d)
    split = int(m["d_state"] * m["rope_fraction"])
    split -= split % 2
    vocab, pad = config["vocab_size"], config["pad_vocab_size_multiple"]
    f = config["d_intermediate"]
    return dict(d=d, d_inner=d_inner, H=d_inner // m["headdim"], P=m["headdim"], N=m["d_state"], G=m["ngroups"],
                R=m["mimo_rank"] if m["is_mimo"] else 1, mimo=bool(m["is_mimo"]), r=split // 2,
                A_floor=m["A_floor"], outproj_norm=bool(m["is_outproj_norm"]),
                V=vocab + (-vocab % pad), f=(f + 127) // 128 * 128 if f else 0, L=config["n_layer"])


def random_state_dict(config: dict, seed: int = 0) -> dict:
    """Upstream names and shapes, float32, weights moved away from their init: norm weights and
    B/C biases off 1 (a misplaced state channel shows), dt spread over [0.005, 1] per head (slow
    heads carry state across chunk boundaries), dd_A of O(1) (the decay activation shows)."""
    k = dims(config)
    rng = np.random.default_rng(seed)
    d, di, H, P, N, G, R, r = (k[n] for n in ("d", "d_inner", "H", "P", "N", "G", "R", "r"))

    def normal(shape, scale):
        return (scale * rng.normal(size=shape)).astype(np.float32)

    def near(shape, centre):
        return (centre + 0.2 * rng.normal(size=shape)).astype(np.float32)

    sd = {"backbone.embedding.weight": normal((k["V"], d), 1.0), "backbone.norm_f.weight": near((d,), 1.0)}
    if not config["tie_embeddings"]:
        sd["lm_head.weight"] = normal((k["V"], d), d ** -0.5)
    for i in range(k["L"]):
        pre = f"backbone.layers.{i}."
        dt = np.exp(rng.uniform(np.log(0.005), np.log(1.0), H))
        sd |= {pre + "norm.weight": near((d,), 1.0),
               pre + "mixer.in_proj.weight": normal((2 * di + 2 * N * G * R + 3 * H + r, d), d ** -0.5),
               pre + "mixer.dt_bias": (dt + np.log(-np.expm1(-dt))).astype(np.float32),
               pre + "mixer.B_bias": near((H, R, N), 1.0), pre + "mixer.C_bias": near((H, R, N), 1.0),
               pre + "mixer.B_norm.weight": near((N,), 1.0), pre + "mixer.C_norm.weight": near((N,), 1.0),
               pre + "mixer.D": near((H,), 1.0),
               pre + "mixer.out_proj.weight": normal((d, di), di ** -0.5)}
        if k["mimo"]:
            sd |= {pre + "mixer.mimo_x": near((H, R, P), 1.0 / R), pre + "mixer.mimo_z": near((H, R, P), 1.0),
                   pre + "mixer.mimo_o": near((H, R, P), 1.0 / R)}
        if k["outproj_norm"]:
            sd[pre + "mixer.norm.weight"] = near((di,), 1.0)
        if k["f"]:
            sd |= {pre + "norm2.weight": near((d,), 1.0), pre + "mlp.fc1.weight": normal((2 * k["f"], d), d ** -0.5),
                   pre + "mlp.fc2.weight": normal((d, k["f"]), k["f"] ** -0.5)}
    return sd


def write_checkpoint(folder, config: dict, state_dict: dict) -> str:
    """model.safetensors (F32, upstream names) and config.json in `folder`; returns the folder."""
    os.makedirs(folder, exist_ok=True)
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in state_dict.items():
        data = np.ascontiguousarray(arr, "<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + b"".join(chunks))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=4)
    return os.fspath(folder)


# ----------------------------------------------------------------------------- the forward, float64

def heavy_tail(x):
    return np.maximum(x, 0.0) + 1.0 / (1.0 - np.minimum(x, 0.0))


def softplus(x):
    return np.logaddexp(0.0, x)


def silu(x):
    return x / (1.0 + np.exp(-x))


def rms(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def mixer(w: dict, u: np.ndarray, k: dict, a_activation: str) -> np.ndarray:
    """Mamba3.forward of one layer (`w`: its parameters without the prefix), u (b, t, d) -> (b, t, d)."""
    b, t, _ = u.shape
    H, P, N, G, R, r, di = (k[n] for n in ("H", "P", "N", "G", "R", "r", "d_inner"))
    widths = [di, di, N * G * R, N * G * R, H, H, H, r]
    z, x, B, C, dd_dt, dd_A, trap, ang = np.split(u @ w["in_proj.weight"].T, np.cumsum(widths)[:-1], -1)
    act = heavy_tail if a_activation == "heavy" else softplus
    A = np.minimum(-act(dd_A), -k["A_floor"])
    dt = softplus(dd_dt + w["dt_bias"])
    lam = 1.0 / (1.0 + np.exp(-trap))
    z, x = z.reshape(b, t, H, P), x.reshape(b, t, H, P)
    group = np.arange(H) // (H // G)                                         # head -> its B/C group
    Bn = rms(B.reshape(b, t, R, G, N), w["B_norm.weight"])[:, :, :, group]   # (b, t, R, H, N)
    Cn = rms(C.reshape(b, t, R, G, N), w["C_norm.weight"])[:, :, :, group]
    Bn = Bn + w["B_bias"].transpose(1, 0, 2)                                 # bias (H, R, N)
    Cn = Cn + w["C_bias"].transpose(1, 0, 2)
    i0 = np.arange(r) if k["mimo"] else 2 * np.arange(r)
    i1 = i0 + N // 2 if k["mimo"] else i0 + 1
    mimo_x = w["mimo_x"].transpose(1, 0, 2) if k["mimo"] else np.ones((1, H, P))   # (R, H, P)
    mimo_z = w["mimo_z"].transpose(1, 0, 2) if k["mimo"] else np.ones((1, H, P))
    mimo_o = w["mimo_o"].transpose(1, 0, 2) if k["mimo"] else np.ones((1, H, P))
    phase = np.zeros((b, H, r))
    S = np.zeros((b, H, P, N))
    k_prev, v_prev = np.zeros((b, R, H, N)), np.zeros((b, R, H, P))
    out = np.zeros((b, t, H, P))
    for s in range(t):
        phase = phase + np.pi * np.tanh(ang[:, s])[:, None, :] * dt[:, s, :, None]
        cos, sin = np.cos(phase)[:, None], np.sin(phase)[:, None]          # (b, 1, H, r)

        def rotate(v):
            v = v.copy()
            v0, v1 = v[..., i0].copy(), v[..., i1].copy()
            v[..., i0], v[..., i1] = v0 * cos - v1 * sin, v0 * sin + v1 * cos
            return v
        q, kk = rotate(Cn[:, s]), rotate(Bn[:, s])                          # (b, R, H, N)
        v = x[:, s][:, None] * mimo_x                                       # (b, R, H, P)
        alpha = np.exp(A[:, s] * dt[:, s])[..., None, None]                 # (b, H, 1, 1)
        beta = ((1 - lam[:, s]) * dt[:, s])[..., None, None] * alpha
        gamma = (lam[:, s] * dt[:, s])[..., None, None]
        S = (alpha * S + beta * np.einsum("brhn,brhp->bhpn", k_prev, v_prev)
             + gamma * np.einsum("brhn,brhp->bhpn", kk, v))
        y = np.einsum("bhpn,brhn->brhp", S, q) + w["D"][:, None] * v        # (b, R, H, P)
        zr = z[:, s][:, None] * mimo_z
        if k["outproj_norm"]:
            y = rms(y, w["norm.weight"].reshape(H, P))
        out[:, s] = (y * silu(zr) * mimo_o).sum(1)
        k_prev, v_prev = kk, v
    return out.reshape(b, t, di) @ w["out_proj.weight"].T


def lm_logits(state_dict: dict, config: dict, tokens: np.ndarray, a_activation: str = "heavy") -> np.ndarray:
    """MambaLMHeadModel.forward(tokens).logits in float64, (b, t, padded vocab)."""
    k = dims(config)
    sd = {n: np.asarray(a, np.float64) for n, a in state_dict.items()}
    hidden, residual = sd["backbone.embedding.weight"][tokens], None
    for i in range(k["L"]):
        pre = f"backbone.layers.{i}."
        residual = hidden if residual is None else hidden + residual
        hidden = mixer({n[len(pre) + 6:]: a for n, a in sd.items() if n.startswith(pre + "mixer.")},
                       rms(residual, sd[pre + "norm.weight"]), k, a_activation)
        if k["f"]:
            residual = hidden + residual
            y, gate = np.split(rms(residual, sd[pre + "norm2.weight"]) @ sd[pre + "mlp.fc1.weight"].T, 2, -1)
            hidden = (y * silu(gate)) @ sd[pre + "mlp.fc2.weight"].T
    h = rms(hidden + residual, sd["backbone.norm_f.weight"])
    head = sd["backbone.embedding.weight"] if config["tie_embeddings"] else sd["lm_head.weight"]
    return h @ head.T
