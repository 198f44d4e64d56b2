"""algorithm="pallas" (ssmgate/cores/pallas/, issue #9) in Pallas' interpret mode on CPU: the
kernel against the float64 reference and against `chunked`, forward and gradients, initial and
final states, odd lengths, half-precision inputs, vmap, and its lowering for CUDA (Triton) and
TPU (Mosaic) without their hardware.

Tolerances: float32 inputs as every algorithm (checks.REF_TOL 1e-5 vs the reference, GRAD_TOL 1e-4
vs sequential, 1e-5 at extreme decays); float64 kernel vs float64 `chunked` 1e-12; bf16/fp16
inputs, whose data matmuls take operands in that dtype (accumulated in float32), HALF_TOL below."""
from contextlib import nullcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from ssmgate import cores
from ssmgate.cores._ssd import chunked_ssd
from ssmgate.cores.pallas import pallas_ssd, ssd, tpu_vmem
from ssmgate.models.config import ModelCfg
from tests.cores import checks
from tests.cores import common as cm

CORES = pytest.mark.parametrize("core", ["scalar_decay", "rotation"])
# Several chunks of 16 and a ragged last one, grouped B/C, trapezoid, D and an initial state.
MULTI_CHUNK = cm.Case("grad37", b=2, t=37, h=4, p=3, g=2, n=8, r=2, chunk=16)
# Relative error of y and the state against the float32 run on the same rounded inputs: bf16 operands
# round each product's factors to 2^-9 (fp16: 2^-12); measured up to 5.4e-3 (bf16) and 3.9e-4 (fp16),
# y's own output rounding included.
HALF_TOL = {"bfloat16": 2e-2, "float16": 3e-3}


@pytest.mark.parametrize("case", [cm.full(65), cm.full(1), cm.PLAIN], ids=lambda c: c.name)
@CORES
def test_matches_reference(core, case):
    checks.check_reference(core, case, "pallas")


@CORES
def test_gradients_match_sequential(core, rng):
    checks.check_gradients(core, "pallas", None, rng, case=MULTI_CHUNK)


@CORES
def test_extreme_decays(core, rng):
    checks.check_extreme(core, "pallas", None, rng, case=MULTI_CHUNK)


@pytest.mark.parametrize("k", [1, 64])
@CORES
def test_split_equals_whole(core, k):
    checks.check_split(core, "pallas", k)


@CORES
def test_jit_vmap(core):
    checks.check_vmap(core, "pallas")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bf16", "fp16"])
@CORES
def test_half_precision_inputs(core, dtype):
    case = cm.SPLIT_CASE
    inp = jax.tree.map(lambda a: np.asarray(a).astype(dtype), cm.case_inputs(core, case))
    rounded = jax.tree.map(lambda a: np.asarray(a, np.float32), inp)
    y, final = cm.run(core, inp, "pallas", case)
    assert y.dtype == jnp.dtype(dtype)
    for name, leaf in zip(cm.STATE_FIELDS[core], cm.state_leaves(core, final)):
        assert leaf.dtype == jnp.float32, f"final_state.{name} has dtype {leaf.dtype}, expected float32"
    tol = HALF_TOL[np.dtype(dtype).name]
    cm.assert_close(core, (y.astype(jnp.float32), final), cm.run(core, rounded, "chunked", case), tol,
                    f"pallas {np.dtype(dtype).name} vs float32 chunked on the rounded inputs")


def _ssd_inputs(rng, b=2, t=37, h=4, p=20, g=2, n=12):
    f = lambda *s: jnp.asarray(rng.standard_normal(s))
    return dict(xs=f(b, t, h, p), l=-jnp.abs(f(b, t, h)), B=f(b, t, g, n), C=f(b, t, g, n),
                h0=f(b, h, p, n), xdiag=f(b, t, h, p))


@pytest.mark.parametrize("with_xdiag", [False, True], ids=["euler", "xdiag"])
def test_kernel_equals_chunked_float64(with_xdiag, rng):
    """pallas_ssd == chunked_ssd in float64 (outputs, final state and every gradient), with p padded
    20 -> 32 in two programs of block_p = 16, groups shared by two heads, t = 37 in chunks of 16."""
    with jax.enable_x64():
        inp = _ssd_inputs(rng)
        names = ["xs", "l", "B", "C", "h0"] + (["xdiag"] if with_xdiag else [])
        args = [inp[k] for k in names]

        def loss(fn):
            def value(*a):
                y, hT = fn(*a)
                return jnp.sum(jnp.sin(y)) + jnp.sum(jnp.cos(hT)), (y, hT)
            return jax.jit(jax.value_and_grad(value, argnums=tuple(range(len(names))), has_aux=True))

        (_, want), want_g = loss(lambda xs, l, B, C, h0, *x: chunked_ssd(xs, l, [(B, C)], h0, 16, *x))(*args)
        (_, got), got_g = loss(lambda xs, l, B, C, h0, *x: pallas_ssd(xs, l, B, C, h0, 16, *x, block_p=16))(*args)
        for what, g, w in zip(["y", "final state"] + [f"d/d{k}" for k in names], list(got) + list(got_g),
                              list(want) + list(want_g)):
            assert g.dtype == jnp.float64
            err = float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
            assert err <= 1e-12, f"{what}: pallas vs chunked relative error {err:.2e}"


def test_tpu_fallback_equals_the_kernel_float64(rng):
    """The chunked form that the TPU branch runs where the kernel would not fit VMEM (ssd._chunked_fn,
    on the kernels' head-major arrays) == the kernel (interpreted), values and every gradient, float64."""
    b, h, g, T, P, N, q = 2, 4, 2, 48, 16, 16, 16
    with jax.enable_x64():
        f = lambda *s: jnp.asarray(rng.normal(size=s))
        args = [f(b, h, T, P), -jnp.abs(f(b, h, T)), f(b, g, T, N), f(b, g, T, N), f(b, h, P, N), f(b, h, T, P)]

        def loss(fn):
            value = lambda *a: sum(jnp.sum(jnp.sin(o)) for o in fn(*a))
            return jax.jit(jax.value_and_grad(value, argnums=tuple(range(6))))(*args)

        want = loss(ssd._kernel_fn((q, P, "interpret", jnp.dtype(jnp.float64), None), True))
        got = loss(ssd._chunked_fn(q, True))
        for what, g_, w in zip(["value", "xs", "l", "B", "C", "h0", "xdiag"], [got[0], *got[1]], [want[0], *want[1]]):
            err = float(jnp.max(jnp.abs(g_ - w)) / jnp.max(jnp.abs(w)))
            assert err <= 1e-12, f"{what}: chunked fallback vs kernel relative error {err:.2e}"


def test_tpu_lowering_falls_back_where_the_kernel_would_not_fit():
    """Lowered for TPU, a length over the VMEM budget holds no Mosaic kernel (the chunked form), with
    a warning; an explicit backend='tpu' keeps the kernel."""
    S = jax.ShapeDtypeStruct
    b, t, h, p, n = 1, 2047, 2, 64, 128
    shapes = (S((b, t, h, p), jnp.float32), S((b, t, h), jnp.float32), S((b, t, 1, n), jnp.float32),
              S((b, t, 1, n), jnp.float32), S((b, h, p, n), jnp.float32))
    assert not tpu_vmem.fits(2048, 64, 64, 128, False)
    for backend, kernels in ((None, 0), ("tpu", 1)):
        fn = jax.jit(lambda *a: pallas_ssd(*a, 64, backend=backend))
        with pytest.warns(UserWarning, match="runs the chunked form") if backend is None else nullcontext():
            text = export.export(fn, platforms=["tpu"])(*shapes).mlir_module()
        assert text.count("@tpu_custom_call") == kernels, f"backend={backend}: expected {kernels} Mosaic kernels"


PLATFORMS = {"gpu": ("cuda", "__gpu$xla.gpu.triton"), "tpu": ("tpu", "tpu_custom_call")}


@pytest.mark.parametrize("shape", [(2, 100, 4, 64, 1, 128), (2, 150, 4, 128, 2, 64)], ids=["p64", "p128g2"])
@pytest.mark.parametrize("mm_dtype", [None, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("backend", sorted(PLATFORMS))
def test_lowers_for_accelerators(backend, mm_dtype, shape):
    """jax.export lowers the forward and backward kernels for CUDA (Triton) and TPU (Mosaic) on a
    CPU-only machine: the kernels pass Pallas' lowering rules for those platforms (block shapes, the
    primitives used inside; t = 150 pads to 192 tokens, not a power of two). The device compilers
    themselves run only on the device: launch/device_bench.sh."""
    platform, target = PLATFORMS[backend]
    S = jax.ShapeDtypeStruct
    b, t, h, p, g, n = shape
    shapes = (S((b, t, h, p), jnp.float32), S((b, t, h), jnp.float32), S((b, t, g, n), jnp.float32),
              S((b, t, g, n), jnp.float32), S((b, h, p, n), jnp.float32), S((b, t, h, p), jnp.float32))

    def forward(*a):
        return pallas_ssd(*a[:5], 64, a[5], backend=backend, mm_dtype=mm_dtype)

    def gradient(*a):
        return jax.grad(lambda *a: sum(jnp.sum(o) for o in forward(*a)), argnums=tuple(range(6)))(*a)

    for fn, kernels in ((forward, 1), (gradient, 2)):
        exported = export.export(jax.jit(fn), platforms=[platform],
                                 disabled_checks=[export.DisabledSafetyCheck.custom_call(target)])(*shapes)
        text = exported.mlir_module()
        assert text.count(f"@{target}") == kernels, f"{backend}: expected {kernels} {target} call(s)"
        for name in ["ssmgate_ssd_fwd", "ssmgate_ssd_bwd"][:kernels]:
            assert name in text, f"{backend}: kernel {name} missing from the lowered module"


def test_bad_arguments_are_named():
    x = jnp.zeros((1, 5, 2, 3))
    with pytest.raises(ValueError, match="block_p = 24"):
        pallas_ssd(x, jnp.zeros((1, 5, 2)), jnp.zeros((1, 5, 1, 4)), jnp.zeros((1, 5, 1, 4)),
                   jnp.zeros((1, 2, 3, 4)), 16, block_p=24)
    with pytest.raises(ValueError, match="multiple of 128 .TPU lanes"):
        pallas_ssd(jnp.zeros((1, 5, 2, 128)), jnp.zeros((1, 5, 2)), jnp.zeros((1, 5, 1, 4)), jnp.zeros((1, 5, 1, 4)),
                   jnp.zeros((1, 2, 128, 4)), 16, block_p=64, backend="tpu")
    with pytest.raises(ValueError, match="unknown backend 'cuda'"):
        pallas_ssd(x, jnp.zeros((1, 5, 2)), jnp.zeros((1, 5, 1, 4)), jnp.zeros((1, 5, 1, 4)),
                   jnp.zeros((1, 2, 3, 4)), 16, backend="cuda")
    inp = cm.case_inputs("damped", cm.TINY, "under")
    with pytest.raises(ValueError, match="unknown algorithm 'pallas'"):
        cm.call_core("damped", inp, algorithm="pallas", regime="under")
    with pytest.raises(ValueError, match="ModelCfg.algorithm=.pallas.*damped transition"):
        ModelCfg(block="mamba3", transition="under", algorithm="pallas").validate()
