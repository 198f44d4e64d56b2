"""The SSM mixer blocks (Mamba-2, Mamba-3 and its transitions) and their layers.

Each block is held against a float64 numpy loop of its docstring's equations; streaming (a split run
with the cache) against one run; the transitions against each other where they must coincide.
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.models.config import ModelCfg
from ssmgate.models.layers import CausalConv1d, GatedRMSNorm, RMSNorm
from ssmgate.models.mamba2 import Mamba2Mixer
from ssmgate.models.mamba3 import Mamba3Mixer, heavy

D_MODEL, T = 16, 7
# 4 heads, 2 rotated pairs. `sequential` compiles fastest; the cores' tests hold the algorithms
# against each other, and the streaming tests below run each parallel form once.
SMALL = dict(d_model=D_MODEL, d_state=8, headdim=8, expand=2, algorithm="sequential")


def cfg_of(block, **kw):
    return ModelCfg(block=block, **{**SMALL, **kw}).validate()


def mixer_of(cfg, **kw):
    return (Mamba2Mixer if cfg.block == "mamba2" else Mamba3Mixer)(cfg, **kw)


def inputs(b=2, t=T, seed=0):
    return jax.random.normal(jax.random.key(seed), (b, t, D_MODEL))


def init(cfg, u, seed=1, **kw):
    """(mixer, params). Whole-graph jit compiles faster than op-by-op dispatch at these sizes."""
    m = mixer_of(cfg, **kw)
    return m, jax.jit(m.init)(jax.random.key(seed), u)


def run(m, params, *args):
    return jax.jit(m.apply)(params, *args)


def randomize(params, seed=2, scale=0.3):
    """Moves every parameter off its (often constant) init so the tests see each one act."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return tree.unflatten([v + scale * jax.random.normal(k, v.shape) for v, k in zip(leaves, keys)])


def np64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def silu(v):
    return v / (1.0 + np.exp(-v))


def softplus(v):
    return np.logaddexp(0.0, v)


def rms(v, scale, eps=1e-5):
    return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * scale


# ------------------------------------------------------------------------------------ layers

def test_causal_conv_matches_numpy_and_streams():
    x = jax.random.normal(jax.random.key(0), (2, 9, 5))
    conv = CausalConv1d(width=4)
    p = conv.init(jax.random.key(1), x)
    k, bias = np.asarray(p["params"]["kernel"]), np.asarray(p["params"]["bias"])
    assert k.shape == (4, 5) and bias.shape == (5,)
    assert np.all(np.abs(k) <= 0.5) and np.all(np.abs(bias) <= 0.5)  # U(+-1/sqrt(width))
    xp = np.concatenate([np.zeros((2, 3, 5)), np.asarray(x)], axis=1)
    ref = bias + sum(xp[:, j:j + 9] * k[j] for j in range(4))
    y, cache = conv.apply(p, x)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(cache, np.asarray(x)[:, -3:])
    y1, c1 = conv.apply(p, x[:, :2])  # shorter than the window: the cache keeps zeros
    y2, _ = conv.apply(p, x[:, 2:], c1)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), y, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"cache has shape \(2, 2, 5\); expected \(b, width - 1, channels\)"):
        conv.apply(p, x, jnp.zeros((2, 2, 5)))


def test_norms():
    y = jax.random.normal(jax.random.key(0), (3, 8)) * 3.0
    z = jax.random.normal(jax.random.key(1), (3, 8))
    p = RMSNorm().init(jax.random.key(2), y)
    np.testing.assert_allclose(RMSNorm().apply(p, y), rms(np.asarray(y), 1.0), rtol=1e-5)
    gn = GatedRMSNorm(group_size=4)
    pg = gn.init(jax.random.key(2), y, z)
    g = np.asarray(y) * silu(np.asarray(z))
    ref = rms(g.reshape(3, 2, 4), 1.0).reshape(3, 8)
    np.testing.assert_allclose(gn.apply(pg, y, z), ref, rtol=1e-5)
    assert RMSNorm(dtype=jnp.bfloat16).apply(p, y).dtype == jnp.bfloat16


# ------------------------------------------------------------------------------------ parameter paths

def paths(params):
    flat = jax.tree_util.tree_flatten_with_path(params["params"])[0]
    return {"/".join(k.key for k in kp): tuple(v.shape) for kp, v in flat}


H, P, N = 4, 8, 8
COMMON3 = {"dt_bias": (H,), "D": (H,), "B_norm/scale": (N,), "C_norm/scale": (N,), "out_proj/kernel": (32, D_MODEL)}


@pytest.mark.parametrize("block,kw,expected", [
    ("mamba2", {}, {"in_proj/kernel": (D_MODEL, 2 * 32 + 2 * N + H), "conv/kernel": (4, 32 + 2 * N),
                    "conv/bias": (32 + 2 * N,), "A_log": (H,), "dt_bias": (H,), "D": (H,),
                    "norm/scale": (32,), "out_proj/kernel": (32, D_MODEL)}),
    ("mamba3", {}, {**COMMON3, "in_proj/kernel": (D_MODEL, 64 + 2 * N + 3 * H + 2),
                    "B_bias": (H, 1, N), "C_bias": (H, 1, N)}),
    ("mamba3", {"transition": "none"}, {**COMMON3, "in_proj/kernel": (D_MODEL, 64 + 2 * N + 3 * H),
                                        "B_bias": (H, 1, N), "C_bias": (H, 1, N)}),
    ("mamba3", {"transition": "static"}, {**COMMON3, "in_proj/kernel": (D_MODEL, 64 + 2 * N + 3 * H),
                                          "B_bias": (H, 1, N), "C_bias": (H, 1, N), "static_angle": (H, 2)}),
    ("mamba3", {"transition": "over"}, {**COMMON3, "in_proj/kernel": (D_MODEL, 64 + 2 * N + 3 * H + 2),
                                        "B_bias": (H, 1, N), "C_bias": (H, 1, N)}),
    ("mamba3", {"mimo_rank": 2}, {**COMMON3, "in_proj/kernel": (D_MODEL, 64 + 2 * 2 * N + 3 * H + 2),
                                  "B_bias": (H, 2, N), "C_bias": (H, 2, N), "mimo_x": (H, 2, P),
                                  "mimo_z": (H, 2, P), "mimo_o": (H, 2, P)}),
])
def test_param_paths_shapes_and_output(block, kw, expected):
    cfg = cfg_of(block, **kw)
    u = inputs()
    m, params = init(cfg, u)
    assert paths(params) == expected
    y, _ = run(m, params, u)
    assert y.shape == u.shape and y.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(y)))


def test_inits():
    cfg = cfg_of("mamba3", mimo_rank=2)
    p = init(cfg, inputs())[1]["params"]
    for name in ("D", "B_bias", "C_bias", "mimo_z"):
        np.testing.assert_array_equal(p[name], 1.0)
    np.testing.assert_array_equal(p["mimo_x"], 0.5)
    np.testing.assert_array_equal(p["mimo_o"], 0.5)
    dt = softplus(np.asarray(p["dt_bias"], np.float64))
    assert np.all((dt >= 1e-3 * 0.999) & (dt <= 0.1 * 1.001))


# ------------------------------------------------------------------------------------ numpy references

def mamba2_reference(params, u, cfg):
    p = np64(params["params"])
    u = np.asarray(u, np.float64)
    b, t, _ = u.shape
    h, hp, n, di, w = cfg.n_ssm_heads, cfg.headdim, cfg.d_state, cfg.d_inner, cfg.conv_width
    proj = u @ p["in_proj"]["kernel"]
    z, xbc, dt_raw = proj[..., :di], proj[..., di:2 * di + 2 * n], proj[..., 2 * di + 2 * n:]
    xp = np.concatenate([np.zeros((b, w - 1, xbc.shape[-1])), xbc], axis=1)
    xbc = silu(p["conv"]["bias"] + sum(xp[:, k:k + t] * p["conv"]["kernel"][k] for k in range(w)))
    x, B, C = xbc[..., :di].reshape(b, t, h, hp), xbc[..., di:di + n], xbc[..., di + n:]
    dt = softplus(dt_raw + p["dt_bias"])
    A = -np.exp(p["A_log"])
    state = np.zeros((b, h, hp, n))
    y = np.zeros((b, t, h, hp))
    for s in range(t):
        state = (np.exp(dt[:, s] * A)[..., None, None] * state
                 + (dt[:, s, :, None] * x[:, s])[..., None] * B[:, s, None, None, :])
        y[:, s] = np.einsum("bhpn,bn->bhp", state, C[:, s]) + p["D"][:, None] * x[:, s]
    g = rms(y.reshape(b, t, di) * silu(z), p["norm"]["scale"], cfg.norm_eps)
    return g @ p["out_proj"]["kernel"]


def rotate(v, phase):
    """Interleaved pairs (2i, 2i+1), i < r = phase.shape[-1], rotated by phase (protocol §1.3)."""
    out = v.copy()
    r = phase.shape[-1]
    v0, v1 = v[..., 0:2 * r:2], v[..., 1:2 * r:2]
    out[..., 0:2 * r:2] = v0 * np.cos(phase) - v1 * np.sin(phase)
    out[..., 1:2 * r:2] = v0 * np.sin(phase) + v1 * np.cos(phase)
    return out


def mamba3_reference(params, u, cfg):
    """SISO, transitions native/none/static: the protocol §1.3 table token by token."""
    p = np64(params["params"])
    u = np.asarray(u, np.float64)
    b, t, _ = u.shape
    h, hp, n, di = cfg.n_ssm_heads, cfg.headdim, cfg.d_state, cfg.d_inner
    r = 0 if cfg.transition == "none" else cfg.n_rot_pairs
    proj = u @ p["in_proj"]["kernel"]
    cuts = np.cumsum([di, di, n, n, h, h, h])
    z, x, B, C, dd_dt, dd_A, trap, ang = np.split(proj, cuts, axis=-1)
    x = x.reshape(b, t, h, hp)
    B = rms(B, p["B_norm"]["scale"])[:, :, None, :] + p["B_bias"][:, 0]  # (b, t, h, n)
    C = rms(C, p["C_norm"]["scale"])[:, :, None, :] + p["C_bias"][:, 0]
    dt = softplus(dd_dt + p["dt_bias"])
    a = np.exp(-dt * np.maximum(np.where(dd_A >= 0, 1 + dd_A, 1 / (1 - np.minimum(dd_A, 0))), cfg.a_floor))
    lam = 1 / (1 + np.exp(-trap))
    if cfg.transition == "static":
        inc = np.broadcast_to(np.pi * np.tanh(p["static_angle"]), (b, t, h, r))
    else:
        inc = (np.pi * np.tanh(ang))[:, :, None, :r] * dt[..., None]
    phase = np.zeros((b, h, r))
    state = np.zeros((b, h, hp, n))
    B_prev, x_prev = np.zeros((b, h, n)), np.zeros((b, h, hp))
    y = np.zeros((b, t, h, hp))
    for s in range(t):
        phase = phase + inc[:, s]
        Bs, Cs = rotate(B[:, s], phase), rotate(C[:, s], phase)
        beta = ((1 - lam[:, s]) * dt[:, s] * a[:, s])[..., None, None]
        gamma = (lam[:, s] * dt[:, s])[..., None, None]
        state = (a[:, s, :, None, None] * state + beta * x_prev[..., None] * B_prev[:, :, None, :]
                 + gamma * x[:, s, :, :, None] * Bs[:, :, None, :])
        y[:, s] = np.einsum("bhpn,bhn->bhp", state, Cs) + p["D"][:, None] * x[:, s]
        B_prev, x_prev = Bs, x[:, s]
    return (y.reshape(b, t, di) * silu(z)) @ p["out_proj"]["kernel"]


@pytest.mark.parametrize("block,kw,reference", [
    ("mamba2", {}, mamba2_reference),
    ("mamba3", {}, mamba3_reference),
    ("mamba3", {"transition": "static"}, mamba3_reference),
])
def test_matches_numpy_reference(block, kw, reference):
    cfg = cfg_of(block, **kw)
    u = inputs(t=9)
    m, params = init(cfg, u)
    params = randomize(params)
    y, _ = run(m, params, u)
    np.testing.assert_allclose(y, reference(params, u, cfg), rtol=2e-4, atol=2e-5)


def test_heavy():
    u = jnp.asarray([-3.0, -0.5, 0.0, 0.5, 2.0])
    np.testing.assert_allclose(heavy(u), [0.25, 1 / 1.5, 1.0, 1.5, 3.0], rtol=1e-6)
    g = jax.grad(lambda v: heavy(v).sum())(jnp.asarray([-1.0, 0.0, 1.0]))  # no NaN at the pole u = 1
    np.testing.assert_allclose(g, [0.25, 1.0, 1.0])


# ------------------------------------------------------------------------------------ streaming

STREAM_CASES = [
    ("mamba2", {}),
    ("mamba3", {"algorithm": "chunked", "chunk_size": 4}),
    ("mamba2", {"algorithm": "pallas"}),
    ("mamba3", {"algorithm": "pallas", "chunk_size": 16}),
    ("mamba3", {"transition": "none"}),
    ("mamba3", {"transition": "static"}),
    ("mamba3", {"transition": "under"}),
    ("mamba3", {"transition": "critical"}),
    ("mamba3", {"transition": "over"}),
    ("mamba3", {"mimo_rank": 2}),
]


@pytest.mark.parametrize("block,kw", STREAM_CASES, ids=[f"{b}-{'-'.join(map(str, k.values())) or 'default'}"
                                                       for b, k in STREAM_CASES])
def test_split_run_with_cache_equals_whole_run(block, kw):
    cfg = cfg_of(block, **kw)
    u = inputs(t=9)
    m, params = init(cfg, u)
    params = randomize(params, scale=0.1)
    apply = jax.jit(m.apply)
    whole, final = apply(params, u)
    ys, cache = [], None
    for lo, hi in ((0, 3), (3, 4), (4, 9)):  # odd pieces and a one-token step
        y, cache = apply(params, u[:, lo:hi], cache)
        ys.append(y)
    np.testing.assert_allclose(jnp.concatenate(ys, 1), whole, rtol=1e-4, atol=1e-5)
    chex.assert_trees_all_close(cache, final, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------ transitions

def test_native_with_zero_angles_equals_none():
    u = inputs()
    native = cfg_of("mamba3")
    m, params = init(native, u)
    params = randomize(params)
    kernel = params["params"]["in_proj"]["kernel"]
    r = native.n_rot_pairs
    zeroed = jax.tree.map(lambda v: v, params)
    zeroed["params"]["in_proj"]["kernel"] = kernel.at[:, -r:].set(0.0)
    none_params = jax.tree.map(lambda v: v, params)
    none_params["params"]["in_proj"]["kernel"] = kernel[:, :-r]
    y_native, _ = run(m, zeroed, u)
    y_none, _ = run(Mamba3Mixer(native.replace(transition="none")), none_params, u)
    np.testing.assert_allclose(y_native, y_none, rtol=1e-5, atol=1e-6)
    y_rotating, _ = run(m, params, u)  # the zeroed columns are the angles: they matter
    assert float(jnp.max(jnp.abs(y_rotating - y_none))) > 1e-3


def test_static_phase_is_independent_of_input_and_dt():
    cfg = cfg_of("mamba3", transition="static", algorithm="sequential")
    u = inputs(t=5)
    m, params = init(cfg, u)
    params = randomize(params)
    _, state = run(m, params, u)
    omega = np.asarray(params["params"]["static_angle"], np.float64)
    expected = np.mod(5 * np.pi * np.tanh(omega), 2 * np.pi)
    diff = np.angle(np.exp(1j * (np.asarray(state.phase, np.float64) - expected)))  # mod 2 pi
    np.testing.assert_allclose(diff, 0.0, atol=1e-5)


def test_damped_runs_and_differs_from_native():
    u = inputs()
    m, params = init(cfg_of("mamba3"), u)
    params = randomize(params)
    y_native, _ = run(m, params, u)
    outs = {}
    for regime in ("under", "critical", "over"):
        y, state = run(Mamba3Mixer(cfg_of("mamba3", transition=regime)), params, u)  # same parameters
        assert bool(jnp.all(jnp.isfinite(y))) and type(state).__name__ == "DampedState"
        assert float(jnp.max(jnp.abs(y - y_native))) > 1e-3
        outs[regime] = y
        # the chunked damped core (chunk 5: T is not a multiple) gives the same layer
        y_chunked, _ = run(Mamba3Mixer(cfg_of("mamba3", transition=regime, algorithm="chunked", chunk_size=5)),
                           params, u)
        np.testing.assert_allclose(y_chunked, y, rtol=1e-4, atol=1e-5)
    assert float(jnp.max(jnp.abs(outs["under"] - outs["over"]))) > 1e-3


def test_mimo_rank_one_reproduces_siso():
    cfg = cfg_of("mamba3", algorithm="sequential")
    u = inputs()
    m_mimo, params = init(cfg, u, mimo=True)
    assert {"mimo_x", "mimo_z", "mimo_o"} <= set(params["params"])
    params = jax.tree.map(lambda v: v, params)
    siso = {"params": {k: v for k, v in params["params"].items() if not k.startswith("mimo_")}}
    siso = randomize(siso)
    params["params"].update(siso["params"])
    y_mimo, _ = run(m_mimo, params, u)
    y_siso, _ = run(Mamba3Mixer(cfg), siso, u)
    np.testing.assert_allclose(y_mimo, y_siso, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ dtypes, gradients, errors

@pytest.mark.parametrize("block,kw", [("mamba2", {}), ("mamba3", {}), ("mamba3", {"transition": "under"})])
def test_bfloat16_forward_is_finite_and_close(block, kw):
    u = inputs()
    cfg = cfg_of(block, **kw)
    m, params = init(cfg, u)
    y32, _ = run(m, params, u)
    y16, cache = run(mixer_of(cfg.replace(dtype="bfloat16")), params, u)
    assert y16.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(y16)))
    assert all(leaf.dtype in (jnp.float32, jnp.bfloat16) for leaf in jax.tree.leaves(cache))
    assert float(jnp.max(jnp.abs(y16.astype(jnp.float32) - y32))) < 0.05 * float(jnp.max(jnp.abs(y32))) + 1e-2


@pytest.mark.parametrize("block,kw", [("mamba2", {}), ("mamba3", {}), ("mamba3", {"transition": "static"}),
                                      ("mamba3", {"transition": "over"}), ("mamba3", {"mimo_rank": 2})])
def test_gradients_are_finite_and_reach_every_parameter(block, kw):
    cfg = cfg_of(block, **kw)
    u = inputs()
    m, params = init(cfg, u)

    def loss(prm):
        y, _ = run(m, prm, u)
        return jnp.mean(y ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        name = jax.tree_util.keystr(path)
        assert bool(jnp.all(jnp.isfinite(g))), name
        assert float(jnp.max(jnp.abs(g))) > 0.0, f"no gradient reaches {name}"


def test_bad_config_errors():
    with pytest.raises(ValueError, match=r"ModelCfg.transition='spiral': expected one of"):
        cfg_of("mamba3", transition="spiral")
    with pytest.raises(ValueError, match=r"ModelCfg.mimo_rank=2: expected 1 for the damped transition 'under'"):
        cfg_of("mamba3", transition="under", mimo_rank=2)
    with pytest.raises(ValueError, match=r"ModelCfg.algorithm='fast': expected one of"):
        cfg_of("mamba2", algorithm="fast")
    with pytest.raises(ValueError, match=r"ModelCfg.a_activation='relu'"):
        cfg_of("mamba3", a_activation="relu")
    with pytest.raises(ValueError, match=r"MIMO \(mimo_rank=1\) with transition 'critical'"):
        init(cfg_of("mamba3", transition="critical"), inputs(), mimo=True)
    cfg = cfg_of("mamba2")
    m, params = init(cfg, inputs())
    _, cache = m.apply(params, inputs())
    with pytest.raises(ValueError, match=r"cache has shape \(2, 3, 48\); expected .* = \(3, 3, 48\)"):
        m.apply(params, inputs(b=3), cache)
    with pytest.raises(ValueError, match=r"initial_state' has shape \(2, 4, 8, 8\); "
                                         r"expected \(b, h, p, n\) = \(3, 4, 8, 8\)"):
        m.apply(params, inputs(b=3), cache._replace(conv=jnp.zeros((3, 3, 48))))


def test_mamba3_sows_the_per_token_phase_increment():
    import jax
    import jax.numpy as jnp
    from ssmgate.models.config import ModelCfg
    from ssmgate.models.mamba3 import Mamba3Mixer
    cfg = ModelCfg(block="mamba3", d_model=16, d_state=8, headdim=8, rope_fraction=1.0)
    mixer = Mamba3Mixer(cfg)
    u = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 16))
    params = mixer.init(jax.random.PRNGKey(0), u)["params"]
    (_, state), inter = mixer.apply({"params": params}, u, mutable=["intermediates"])
    inc = inter["intermediates"]["phase_increment"][0]
    chex.assert_shape(inc, (2, 5, cfg.n_ssm_heads, cfg.n_rot_pairs))
    assert float(jnp.abs(inc).max()) <= jnp.pi * 0.2  # |dt * pi tanh| with dt <= ~0.1 at init
    # the core's final phase is the sum of the sowed increments mod 2 pi
    assert jnp.allclose(jnp.mod(inc.sum(axis=1), 2 * jnp.pi), state.phase, atol=1e-5)
