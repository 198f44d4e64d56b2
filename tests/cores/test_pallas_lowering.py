"""The public cores' `algorithm="pallas"` lowered for accelerators on a CPU-only machine (issue #39).

`scalar_decay` and `rotation` pick their kernel per lowering platform (`lax.platform_dependent` in
`pallas_ssd`), so `jax.export(..., platforms=[...])` of the core itself, without a backend argument,
must contain the Triton custom call for cuda and the Mosaic one for tpu, forward and gradient, in
float32 and with bf16 x/B/C, at Mamba-2-130M-like and Mamba-3-like head, state and chunk sizes and
odd lengths. Counting the custom calls is what stops an interpreted fallback (plain HLO loops, no
custom call) from passing for a kernel. Lowering runs Pallas' Triton/Mosaic lowering rules (block
shapes, every primitive in the kernels, dtypes); the device compilers run only on the device
(launch/device_check.sh). Batch and length are small: lowering cost does not depend on them.

jax 0.10.2 emits `stablehlo.custom_call @__gpu$xla.gpu.triton` (Triton) and
`@tpu_custom_call` (Mosaic). Export's serialization check refuses the Triton target (it is not
on its list of stable custom calls), so the cuda export lifts that one check by name."""
import jax
import jax.numpy as jnp
import pytest
from jax import export

from ssmgate.bench.cores import core_fn, input_structs

# platform -> the kernel's custom-call target in the exported module
TARGETS = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}
# (b, t, h, p, n, g, r, chunk): Mamba-2-130M (d_model 768, expand 2: 24 heads of headdim 64,
# d_state 128, one B/C group) at the default chunk 64; the P2 187M Mamba-3 (the same heads, half
# the state's pairs rotating, r = 32 of 64) at its chunk 16. Odd lengths: a ragged last chunk.
SHAPES = {"mamba2_130m": (1, 75, 24, 64, 128, 1, 32, 64), "mamba3_187m": (1, 37, 24, 64, 128, 1, 32, 16)}


def _input_structs(core, shape, dtype):
    return input_structs(core, *shape[:7], dtype)


def _functions(core, chunk, algorithm="pallas"):
    fn = core_fn(core, algorithm, chunk)

    def forward(inputs):
        return fn(inputs)

    def gradient(inputs):
        def loss(i):
            y, final = fn(i)
            return jnp.sum(y.astype(jnp.float32) ** 2) + jnp.sum(getattr(final, "h", final))
        return jax.grad(loss)(inputs)

    return forward, gradient


def _lowered_text(fn, platforms, structs):
    disabled = [export.DisabledSafetyCheck.custom_call(TARGETS["cuda"])] if "cuda" in platforms else []
    return export.export(jax.jit(fn), platforms=platforms, disabled_checks=disabled)(structs).mlir_module()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", sorted(SHAPES), ids=str)
@pytest.mark.parametrize("platform", sorted(TARGETS))
@pytest.mark.parametrize("core", ["scalar_decay", "rotation"])
def test_core_lowers_to_the_platforms_kernel(core, platform, shape, dtype):
    """Forward: one forward kernel; gradient: the forward kernel that saves its chunk-start states and
    the backward kernel, each exactly once, as the platform's custom call."""
    structs = _input_structs(core, SHAPES[shape], dtype)
    forward, gradient = _functions(core, SHAPES[shape][-1])
    target = TARGETS[platform]
    for fn, names in ((forward, ["ssmgate_ssd_fwd"]), (gradient, ["ssmgate_ssd_fwd", "ssmgate_ssd_bwd"])):
        text = _lowered_text(fn, [platform], structs)
        calls = text.count(f"@{target}(")
        assert calls == len(names), (f"{core} {fn.__name__} for {platform}: {calls} `{target}` custom calls, "
                                     f"expected {len(names)} (none means the kernel fell back to an interpreter)")
        for name in names:
            assert name in text, f"{core} {fn.__name__} for {platform}: kernel {name} missing from the module"
        other = TARGETS["tpu" if platform == "cuda" else "cuda"]
        assert f"@{other}(" not in text, f"{platform} module holds the other platform's kernel {other}"


@pytest.mark.parametrize("core", ["scalar_decay", "rotation"])
def test_cpu_interprets(core):
    """Lowered for cpu the same call is Pallas' interpreter (no custom call): the CPU path the other
    tests of the kernels run. (One module for several platforms at once is not possible: jax 0.10.2
    lowers every kept branch for every platform, and a compiled pallas_call refuses cpu.)"""
    structs = _input_structs(core, SHAPES["mamba3_187m"], jnp.bfloat16)
    _, gradient = _functions(core, SHAPES["mamba3_187m"][-1])
    text = _lowered_text(gradient, ["cpu"], structs)
    assert not any(f"@{t}(" in text for t in TARGETS.values()), "the cpu module holds an accelerator kernel"
