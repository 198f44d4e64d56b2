"""The public cores compiled for TPU v4, v5e, v5p and v6e by the real XLA:TPU and Mosaic compilers
on this CPU-only machine (issue #45): libtpu (the test environment's `tpu` extra) compiles for a
named topology from `jax.experimental.topologies`, so a kernel that a generation cannot compile
fails here, not in a pod's first step.

Forward and gradient of `algorithm="pallas"` (scalar_decay, rotation) and `algorithm="auto"` (all
four cores, traced for TPU: `auto.for_backend`), float32 and bf16 x/B/C, at the lowering tests'
model shapes (odd lengths 75 and 37) and at the papers' training length as 2047 tokens, where the
kernels would not fit VMEM and the TPU program holds the chunked form instead (`_matrix`). The custom calls in
the compiled program are counted: the Mosaic kernels where they fit (ssmgate/cores/pallas/tpu_vmem.py),
none where they do not. The default suite compiles one representative (v4, whose backward once
needed a sublane gather it lacks); the matrix is `slow`. Times: docs/benchmarks.md."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from ssmgate import platform_env
from ssmgate.cores import auto
from ssmgate.cores.pallas import pallas_ssd, tpu_vmem
from ssmgate.bench.cores import input_structs
from ssmgate.bench.tpu_estimate import GENERATIONS, tpu_device
from tests.cores.test_pallas_lowering import SHAPES, _functions

pytestmark = pytest.mark.skipif(not platform_env.libtpu_installed(), reason="needs libtpu (make venv installs it)")

# Mamba-2-130M at the papers' training length 2048, one token short (a ragged last chunk).
LONG = {"mamba2_130m_2047": (1, 2047, 24, 64, 128, 1, 32, 64)}
ALL_SHAPES = {**SHAPES, **LONG}
PALLAS_CORES = ("scalar_decay", "rotation")
AUTO_CORES = ("scalar_decay", "rotation", "damped", "rotation_mimo")


def _kernels_expected(core, algorithm, shape, gradient):
    """Mosaic custom calls the compiled program must hold: the forward kernel (and, for the gradient,
    the forward that saves its chunk starts plus the backward) where the kernel fits VMEM."""
    if core not in PALLAS_CORES:
        return 0          # damped and rotation_mimo have no kernel; their auto is a jnp form
    t, p, n, chunk = shape[1], shape[3], shape[4], shape[-1] if algorithm == "pallas" else 64
    T = -(-t // chunk) * chunk
    fits = tpu_vmem.fits(T, chunk, min(128, p), n, core == "rotation")
    return (2 if gradient else 1) if fits else 0


def compile_core(core, algorithm, generation, shape_name, dtype):
    shape = ALL_SHAPES[shape_name]
    structs = input_structs(core, *shape[:7], dtype, sharding=SingleDeviceSharding(tpu_device(generation)))
    forward, gradient = _functions(core, shape[-1] if algorithm == "pallas" else None, algorithm)
    for fn in (forward, gradient):
        with auto.for_backend("tpu"):
            compiled = jax.jit(fn).lower(structs).compile()   # a Mosaic or XLA:TPU error fails the test
        calls = compiled.as_text().count('custom_call_target="tpu_custom_call"')
        want = _kernels_expected(core, algorithm, shape, fn is gradient)
        assert calls == want, (f"{core} {algorithm} {fn.__name__} for {generation} at {shape_name}: {calls} Mosaic "
                               f"kernels in the compiled program, expected {want}")


def _matrix():
    """(generation, core, algorithm, shape, dtype): the kernel cores' pallas and auto at both model shapes
    and dtypes; damped's and rotation_mimo's auto (XLA programs, no kernel) at the Mamba-3 shape; and the
    long length, where the TPU program holds the chunked form (auto on TPU is that same pallas call),
    in bf16."""
    cases = []
    for g in sorted(GENERATIONS):
        for dtype in (jnp.float32, jnp.bfloat16):
            cases += [(g, c, a, s, dtype) for c in PALLAS_CORES for a in ("pallas", "auto") for s in sorted(SHAPES)]
            cases += [(g, c, "auto", "mamba3_187m", dtype) for c in AUTO_CORES if c not in PALLAS_CORES]
        cases += [(g, c, "pallas", s, jnp.bfloat16) for c in PALLAS_CORES for s in sorted(LONG)]
    return [pytest.param(*c, id=f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-{jnp.dtype(c[4]).name}") for c in cases]


# The expected notes of the fallback and of auto's TPU rule; and the persistent compilation cache
# (tests/conftest.py), which cannot load a compile-only TPU executable back: where auto's program is
# the pallas case's (chunk 64), JAX says so and compiles it again.
WARNINGS = ("ignore:pallas_ssd. lowered for TPU", "ignore:ssmgate.cores. no measured",
            "ignore:Error reading persistent compilation cache entry")


@pytest.mark.filterwarnings(*WARNINGS)
def test_representative_v4_rotation_kernel():
    """The default suite's one compile for TPU: the rotation kernel's forward and backward for v4."""
    compile_core("rotation", "pallas", "v4", "mamba3_187m", jnp.bfloat16)


@pytest.mark.slow
@pytest.mark.filterwarnings(*WARNINGS)
@pytest.mark.parametrize("generation,core,algorithm,shape,dtype", _matrix())
def test_compiles_for_every_generation(generation, core, algorithm, shape, dtype):
    compile_core(core, algorithm, generation, shape, dtype)


@pytest.mark.slow
def test_vmem_budget_line_is_real_on_v4():
    """The budget is not vacuous: at Mamba-2-130M's heads (64 x 128, chunk 64) the longest length the
    budget admits compiles the backward kernel for v4, and the next chunk's length, which it refuses,
    runs out of VMEM (the explicit backend='tpu' keeps the kernel)."""
    h, p, n, q = 24, 64, 128, 64
    admitted = max(T for T in range(q, 4096, q) if tpu_vmem.fits(T, q, p, n, False))
    sharding = SingleDeviceSharding(tpu_device("v4"))

    def compile_backward(t):
        S = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding)
        args = (S(1, t, h, p), S(1, t, h), S(1, t, 1, n), S(1, t, 1, n), S(1, h, p, n))
        loss = lambda *a: sum(jnp.sum(o) for o in pallas_ssd(*a, q, backend="tpu"))
        return jax.jit(jax.grad(loss, argnums=tuple(range(5)))).lower(*args).compile()

    compile_backward(admitted)
    with pytest.raises(Exception, match="(?i)vmem"):
        compile_backward(admitted + q)
