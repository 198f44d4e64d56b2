"""Official Mamba-3 checkpoint conversion: safetensors reading (F32/F16/BF16, shards, index,
corrupt files), the name/layout map as an exact round trip, and the converted model against an
independent float64 numpy transcription of the official module's forward (SISO interleaved pairs;
MIMO RoPE-halves pairs, which the converter maps onto ssmgate's interleaved pairs).

The official-style state dicts are built here from ssmgate params by the inverse map, written
without the converter's helpers; these weights carry no config.json, so the caller's ModelCfg
(softplus decay here) is taken as given. Checkpoints with upstream's config.json, the heavy-tail
decay and lengths 100 / 300 are test_convert_mamba3_upstream.py's."""
import json

import jax
import numpy as np
import pytest

from ssmgate.interventions import convert_mamba3 as cv
from ssmgate.models import lm
from ssmgate.models.config import ModelCfg

SISO = ModelCfg(block="mamba3", vocab_size=48, d_model=32, n_layers=2, d_state=16, headdim=8, expand=2,
                a_activation="softplus", algorithm="sequential")  # 8 heads, r = 4 rotated pairs
MIMO = SISO.replace(mimo_rank=2, n_groups=2, tie_embeddings=False, mlp="swiglu", d_mlp=40)
T = 9


# ----------------------------------------------------------------------------- helpers

def random_params(cfg, seed=0):
    """init_params with every leaf perturbed (norm scales and biases away from 1, so a misplaced
    state channel shows) and dt near 1 (so the phases turn by O(1) within T tokens)."""
    params = lm.init_params(cfg, jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    rng = np.random.default_rng(seed)
    out = []
    for path, leaf in leaves:
        leaf = np.asarray(leaf, np.float32)
        name = path[-1].key
        noise = rng.normal(size=leaf.shape).astype(np.float32)
        out.append(0.5 * noise if name == "dt_bias" else leaf + 0.2 * noise)
    return jax.tree_util.tree_unflatten(treedef, out)


def halves(a, axis):
    """ssmgate state order -> official MIMO order: official i = ssmgate 2i, official i + N/2 = 2i + 1."""
    even = np.take(a, np.arange(0, a.shape[axis], 2), axis=axis)
    odd = np.take(a, np.arange(1, a.shape[axis], 2), axis=axis)
    return np.concatenate([even, odd], axis=axis)


def to_official(params, cfg):
    """The official mamba_ssm state dict of ssmgate params (inverse of the converter)."""
    p = jax.tree_util.tree_map(lambda a: np.array(a, np.float32), params)
    mimo = cfg.mimo_rank > 1
    reorder = (lambda a, axis=-1: halves(a, axis)) if mimo else (lambda a, axis=-1: a)
    sd = {"backbone.embedding.weight": p["embed"]["embedding"], "backbone.norm_f.weight": p["final_norm"]["scale"]}
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = p["lm_head"]["kernel"].T
    bc = cfg.n_groups * cfg.d_state * cfg.mimo_rank
    for i in range(cfg.n_layers):
        layer, key = p[f"layers_{i}"], f"backbone.layers.{i}."
        m = layer["mixer"]
        w_in = m["in_proj"]["kernel"].T.copy()                       # (out, in)
        for start in (2 * cfg.d_inner, 2 * cfg.d_inner + bc):        # B rows, C rows: (r g n)
            block = w_in[start:start + bc].reshape(-1, cfg.d_state, cfg.d_model)
            w_in[start:start + bc] = reorder(block, 1).reshape(bc, cfg.d_model)
        sd[key + "norm.weight"] = layer["norm"]["scale"]
        sd[key + "mixer.in_proj.weight"] = w_in
        sd[key + "mixer.out_proj.weight"] = m["out_proj"]["kernel"].T
        sd[key + "mixer.dt_bias"], sd[key + "mixer.D"] = m["dt_bias"], m["D"]
        for bcn in ("B", "C"):
            sd[key + f"mixer.{bcn}_norm.weight"] = reorder(m[f"{bcn}_norm"]["scale"])
            sd[key + f"mixer.{bcn}_bias"] = reorder(m[f"{bcn}_bias"])
        if mimo:
            for name in ("mimo_x", "mimo_z", "mimo_o"):
                sd[key + "mixer." + name] = m[name]
        if cfg.mlp == "swiglu":
            mlp = layer["mlp"]
            sd[key + "norm2.weight"] = layer["mlp_norm"]["scale"]
            sd[key + "mlp.fc1.weight"] = np.concatenate([mlp["up"]["kernel"].T, mlp["gate"]["kernel"].T], 0)
            sd[key + "mlp.fc2.weight"] = mlp["down"]["kernel"].T
    return {k: np.ascontiguousarray(v) for k, v in sd.items()}


TAGS = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64", np.dtype("<i4"): "I32"}


def write_safetensors(path, tensors, bf16=False):
    """Minimal writer: u64 header length, JSON header (space-padded to 8 bytes), raw data.
    bf16=True stores float32 arrays as BF16 by keeping their high 16 bits (exact for bf16 values)."""
    header, chunks, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors.items():
        if bf16 and arr.dtype == np.float32:
            raw, tag = (arr.view(np.uint32) >> 16).astype("<u2"), "BF16"
        else:
            raw = np.ascontiguousarray(arr)
            tag = TAGS[raw.dtype]
        data = raw.tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + b"".join(chunks))
    return path


def to_bf16_values(tree):
    """Each float32 rounded down to a bfloat16 value (low 16 bits cleared)."""
    return jax.tree_util.tree_map(lambda a: (np.asarray(a, np.float32).view(np.uint32) & 0xFFFF0000)
                                  .view(np.float32), tree)


def logits(cfg, params, tokens):
    return np.asarray(lm.build_model(cfg).apply({"params": params}, tokens)[0])


def tokens_for(cfg):
    return np.random.default_rng(1).integers(0, cfg.vocab_size, (2, T)).astype(np.int32)


# ----------------------------------------------------------------------------- the official forward, float64

def _rms(x, w, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _silu(x):
    return x / (1.0 + np.exp(-x))


def official_mixer(sd, pre, u, cfg):
    """mamba_ssm Mamba3.forward as read from modules/mamba3.py and its kernels, in the quadratic
    (attention) form: y_t = sum_{s<t} (C~_t.B~_s) scale_s exp(sum_{s<v<=t} A_v dt_v) X_s
    + gamma_t (C~_t.B~_t) X_t + D X_t, gamma = lam dt, scale_s = gamma_s + (1 - lam_{s+1}) dt_{s+1}."""
    sd = {k[len(pre):]: v.astype(np.float64) for k, v in sd.items() if k.startswith(pre)}
    b, t, _ = u.shape
    H, P, N, G, mimo = cfg.n_ssm_heads, cfg.headdim, cfg.d_state, cfg.n_groups, cfg.mimo_rank > 1
    R, r = cfg.mimo_rank, int(cfg.d_state * cfg.rope_fraction) // 2
    widths = [cfg.d_inner, cfg.d_inner, N * G * R, N * G * R, H, H, H, r]
    z, x, B, C, dd_dt, dd_A, trap, ang = np.split(u @ sd["in_proj.weight"].T, np.cumsum(widths)[:-1], -1)
    A = -np.maximum(np.logaddexp(0.0, dd_A), 1e-4)
    dt = np.logaddexp(0.0, dd_dt + sd["dt_bias"])
    lam = 1.0 / (1.0 + np.exp(-trap))

    def bc(v, name):  # (b, t, (r g n)) -> norm over n -> heads -> + bias: (b, t, H, R, N)
        v = _rms(v.reshape(b, t, R, G, N), sd[f"{name}_norm.weight"])
        return np.repeat(v, H // G, axis=3).transpose(0, 1, 3, 2, 4) + sd[f"{name}_bias"]

    phase = np.cumsum(np.pi * np.tanh(ang)[:, :, None, :] * dt[..., None], axis=1)  # (b, t, H, r)
    i0 = np.arange(r) if mimo else 2 * np.arange(r)            # MIMO: pairs (i, i + N/2); SISO: (2i, 2i + 1)
    i1 = i0 + N // 2 if mimo else i0 + 1
    cos, sin = np.cos(phase)[:, :, :, None, :], np.sin(phase)[:, :, :, None, :]

    def rotate(v):
        v = v.copy()
        v0, v1 = v[..., i0].copy(), v[..., i1].copy()
        v[..., i0], v[..., i1] = v0 * cos - v1 * sin, v0 * sin + v1 * cos
        return v

    Bt, Ct = rotate(bc(B, "B")), rotate(bc(C, "C"))
    x, z = x.reshape(b, t, H, P), z.reshape(b, t, H, P)
    X = x[:, :, :, None, :] * (sd["mimo_x"] if mimo else 1.0)   # (b, t, H, R, P)
    cum = np.cumsum(A * dt, axis=1)
    gamma = lam * dt
    scale = gamma.copy()
    scale[:, :-1] += (1.0 - lam[:, 1:]) * dt[:, 1:]
    Y = sd["D"][:, None, None] * X
    for ti in range(t):
        for s in range(ti + 1):
            qk = np.einsum("bhkn,bhjn->bhkj", Ct[:, ti], Bt[:, s])
            coef = gamma[:, ti] if s == ti else scale[:, s] * np.exp(cum[:, ti] - cum[:, s])
            Y[:, ti] += coef[..., None, None] * np.einsum("bhkj,bhjp->bhkp", qk, X[:, s])
    if mimo:
        y = np.einsum("bthkp,hkp->bthp", Y * _silu(z[:, :, :, None, :] * sd["mimo_z"]), sd["mimo_o"])
    else:
        y = Y[:, :, :, 0] * _silu(z)
    return y.reshape(b, t, H * P) @ sd["out_proj.weight"].T


def official_lm(sd, tokens, cfg):
    """MambaLMHeadModel: embedding, pre-norm residual blocks (+ GatedMLP), norm_f, lm_head."""
    f64 = {k: v.astype(np.float64) for k, v in sd.items()}
    h = f64["backbone.embedding.weight"][tokens]
    for i in range(cfg.n_layers):
        key = f"backbone.layers.{i}."
        h = h + official_mixer(sd, key + "mixer.", _rms(h, f64[key + "norm.weight"]), cfg)
        if key + "mlp.fc1.weight" in f64:
            y, gate = np.split(_rms(h, f64[key + "norm2.weight"]) @ f64[key + "mlp.fc1.weight"].T, 2, -1)
            h = h + (y * _silu(gate)) @ f64[key + "mlp.fc2.weight"].T
    h = _rms(h, f64["backbone.norm_f.weight"])
    return h @ f64.get("lm_head.weight", f64["backbone.embedding.weight"]).T


# ----------------------------------------------------------------------------- conversion

@pytest.fixture(scope="module", params=[SISO, MIMO], ids=["siso", "mimo_r2_g2_mlp_untied"])
def case(request):
    cfg = request.param
    params = random_params(cfg)
    return cfg, params, to_official(params, cfg)


def test_file_round_trip_is_exact_and_logits_equal(case, tmp_path):
    cfg, params, sd = case
    path = write_safetensors(tmp_path / "model.safetensors", sd)
    back = cv.read_safetensors(str(path))
    assert set(back) == set(sd)
    for k in sd:
        assert back[k].dtype == np.float32 and back[k].shape == sd[k].shape, k
        np.testing.assert_array_equal(back[k], sd[k], err_msg=k)
    converted = cv.load_official(path, cfg)  # a pathlib.Path works too
    flat_want = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    flat_got = dict(jax.tree_util.tree_flatten_with_path(converted)[0])
    assert set(flat_got) == set(flat_want)
    for k, want in flat_want.items():
        assert flat_got[k].dtype == np.float32, k
        np.testing.assert_array_equal(np.asarray(flat_got[k]), np.asarray(want), err_msg=str(k))
    tokens = tokens_for(cfg)
    np.testing.assert_array_equal(logits(cfg, converted, tokens), logits(cfg, params, tokens))


def test_converted_model_matches_the_official_forward(case):
    cfg, _, sd = case
    tokens = tokens_for(cfg)
    want = official_lm(sd, tokens, cfg)
    got = logits(cfg, cv.convert_state_dict(sd, cfg), tokens)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_mimo_without_the_state_reorder_would_differ():
    """The MIMO reorder matters: a conversion that keeps the official N order (pairs (2i, 2i + 1)
    instead of (i, i + N/2)) gives other logits than the official forward."""
    cfg = MIMO
    sd = to_official(random_params(cfg), cfg)
    undo = np.argsort(cv.mimo_state_order(cfg.d_state))  # the converter then returns the official order
    bc = cfg.n_groups * cfg.d_state * cfg.mimo_rank
    naive = dict(sd)
    for k in sd:
        if k.endswith(("B_norm.weight", "C_norm.weight", "B_bias", "C_bias")):
            naive[k] = sd[k][..., undo]
        elif k.endswith("in_proj.weight"):
            w = sd[k].copy()
            for start in (2 * cfg.d_inner, 2 * cfg.d_inner + bc):
                w[start:start + bc] = w[start:start + bc].reshape(-1, cfg.d_state, cfg.d_model)[:, undo].reshape(bc, -1)
            naive[k] = w
    tokens = tokens_for(cfg)
    want = official_lm(sd, tokens, cfg)
    assert np.abs(logits(cfg, cv.convert_state_dict(naive, cfg), tokens) - want).max() > 1e-3 * np.abs(want).max()


def test_bf16_checkpoint_converts_exactly(case, tmp_path):
    cfg, params, _ = case
    params16 = to_bf16_values(params)
    path = write_safetensors(tmp_path / "model.safetensors", to_official(params16, cfg), bf16=True)
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        assert {e["dtype"] for k, e in json.loads(f.read(n)).items() if k != "__metadata__"} == {"BF16"}
    converted = cv.load_official(str(path), cfg)
    for (k, want), (_, got) in zip(jax.tree_util.tree_flatten_with_path(params16)[0],
                                   jax.tree_util.tree_flatten_with_path(converted)[0]):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=str(k))


def test_sharded_checkpoint_with_index_and_inferred_config(case, tmp_path):
    cfg, params, sd = case
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        write_safetensors(tmp_path / file, {k: sd[k] for k in keys})
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tmp_path / cv.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    merged = cv.load_safetensors(str(tmp_path))
    assert set(merged) == set(sd)
    inferred = cv.infer_config(merged, a_activation="softplus", algorithm=cfg.algorithm)
    assert inferred == cfg
    converted = cv.load_official(str(tmp_path), a_activation="softplus", algorithm=cfg.algorithm)  # cfg inferred
    tokens = tokens_for(cfg)
    np.testing.assert_array_equal(logits(cfg, converted, tokens), logits(cfg, params, tokens))
    # an index that names the wrong shard is refused
    weight_map[names[0]] = "model-00002-of-00002.safetensors"
    (tmp_path / cv.INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=names[0].replace(".", r"\.")):
        cv.load_safetensors(str(tmp_path))


def test_infer_config_rope_fraction_one():
    cfg = SISO.replace(rope_fraction=1.0, n_layers=1)
    sd = to_official(random_params(cfg), cfg)
    assert cv.infer_config(sd, a_activation="softplus", algorithm="sequential") == cfg
    with pytest.raises(ValueError, match=r"a_activation=None; expected 'heavy'.*or 'softplus'"):
        cv.infer_config(sd)  # the weights alone do not tell the decay activation


# ----------------------------------------------------------------------------- reader details

def test_bf16_and_f16_decoding(tmp_path):
    bits = np.array([0x3F80, 0xC020, 0x3E20, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x7F7F, 0x0001], "<u2")
    want = np.array([1.0, -2.5, 0.15625, 0.0, -0.0, np.inf, -np.inf, 3.3895314e38, 9.1835e-41], np.float32)
    np.testing.assert_array_equal(cv.bf16_to_float32(bits), want)
    np.testing.assert_array_equal(np.signbit(cv.bf16_to_float32(bits)), np.signbit(want))
    assert np.isnan(cv.bf16_to_float32(np.array([0x7FC0], "<u2")))[0]
    rng = np.random.default_rng(0)
    f32 = (rng.normal(size=(3, 5)).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    f16 = rng.normal(size=(4,)).astype(np.float16)
    i64 = np.arange(-3, 3, dtype=np.int64)
    path = write_safetensors(tmp_path / "x.safetensors", {"a": f32}, bf16=True)
    write_safetensors(tmp_path / "y.safetensors", {"h": f16, "i": i64, "empty": np.zeros((0, 3), np.float32)})
    np.testing.assert_array_equal(cv.read_safetensors(str(path))["a"], f32)
    other = cv.read_safetensors(str(tmp_path / "y.safetensors"))
    assert other["h"].dtype == np.float16 and other["i"].dtype == np.int64 and other["empty"].shape == (0, 3)
    np.testing.assert_array_equal(other["h"], f16)
    np.testing.assert_array_equal(other["i"], i64)


def test_truncated_and_corrupt_files_name_the_file(tmp_path):
    path = str(write_safetensors(tmp_path / "m.safetensors", {"w": np.ones((4, 4), np.float32)}))
    data = open(path, "rb").read()
    cases = {"cut_data": (data[:-10], r"m\.safetensors.*truncated.*'w'.*\[0, 64\)"),
             "cut_header": (data[:20], r"m\.safetensors.*header length \d+ bytes but only 12"),
             "tiny": (data[:5], r"m\.safetensors.*5 bytes; expected at least 8"),
             "bad_json": (data[:8] + b"}" + data[9:], r"m\.safetensors.*not valid UTF-8 JSON")}
    for name, (content, pattern) in cases.items():
        with open(path, "wb") as f:
            f.write(content)
        with pytest.raises(ValueError, match=pattern):
            cv.read_safetensors(path)
    header = {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}}
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + bytes(64))
    with pytest.raises(ValueError, match=r"'w'.*60 bytes; expected 64"):
        cv.read_safetensors(path)
    header = {"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + bytes(4))
    with pytest.raises(ValueError, match=r"'F8_E4M3'; expected one of"):
        cv.read_safetensors(path)


# ----------------------------------------------------------------------------- conversion errors

@pytest.fixture(scope="module")
def siso_sd():
    return to_official(random_params(SISO), SISO)


def test_missing_key_is_named(siso_sd):
    sd = dict(siso_sd)
    del sd["backbone.layers.1.mixer.C_bias"]
    with pytest.raises(ValueError, match=r"missing 1 keys \['backbone\.layers\.1\.mixer\.C_bias'\]"):
        cv.convert_state_dict(sd, SISO)


def test_extra_key_is_named_with_the_reason(siso_sd):
    sd = dict(siso_sd, **{"backbone.layers.0.mixer.norm.weight": np.ones(SISO.d_inner, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected 1 keys \['backbone\.layers\.0\.mixer\.norm\.weight'\].*"
                                         r"is_outproj_norm"):
        cv.convert_state_dict(sd, SISO)


def test_wrong_shape_is_named_with_got_and_expected(siso_sd):
    sd = dict(siso_sd)
    sd["backbone.layers.0.mixer.dt_bias"] = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match=r"'backbone\.layers\.0\.mixer\.dt_bias' has shape \(5,\), expected \(8,\)"):
        cv.convert_state_dict(sd, SISO)
    # a config that disagrees with the checkpoint shows up as shape errors too
    with pytest.raises(ValueError, match=r"in_proj\.weight' has shape \(188, 32\), expected \(224, 32\)"):
        cv.convert_state_dict(siso_sd, SISO.replace(d_state=32))


def test_config_semantics_and_tied_head_are_checked(siso_sd):
    with pytest.raises(ValueError, match=r"transition='static'; expected 'native'"):
        cv.convert_state_dict(siso_sd, SISO.replace(transition="static"))
    sd = dict(siso_sd, **{"lm_head.weight": siso_sd["backbone.embedding.weight"].copy()})
    cv.convert_state_dict(sd, SISO)  # a tied head stored twice is accepted
    sd["lm_head.weight"][0, 0] += 1.0
    with pytest.raises(ValueError, match=r"lm_head\.weight' differs.*tie_embeddings=False"):
        cv.convert_state_dict(sd, SISO)
