"""scalar_decay (SPEC 1.2): every algorithm against the float64 reference, gradients, step, split,
extreme decays, half-precision inputs, vmap."""
import jax.numpy as jnp
import numpy as np
import pytest

from tests.cores import checks
from tests.cores import common as cm

CORE = "scalar_decay"
ALGS = cm.EXPLICIT[CORE]


@pytest.mark.parametrize("case", cm.REF_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("algorithm", ALGS)
def test_matches_reference(algorithm, case):
    checks.check_reference(CORE, case, algorithm)


@pytest.mark.filterwarnings(cm.AUTO_WARNING)
@pytest.mark.parametrize("case", [cm.full(65), cm.PLAIN], ids=lambda c: c.name)
def test_auto_matches_reference(case):
    checks.check_reference(CORE, case, "auto")


@pytest.mark.parametrize("algorithm", cm.PARALLEL[CORE])
def test_gradients_match_sequential(algorithm, rng):
    checks.check_gradients(CORE, algorithm, None, rng)


@pytest.mark.parametrize("case", [cm.full(65), cm.PLAIN], ids=lambda c: c.name)
def test_step_equals_parallel(case):
    checks.check_step(CORE, case)


@pytest.mark.parametrize("k", cm.SPLIT_POINTS)
@pytest.mark.parametrize("algorithm", ALGS)
def test_split_equals_whole(algorithm, k):
    checks.check_split(CORE, algorithm, k)


@pytest.mark.parametrize("algorithm", ALGS)
def test_extreme_decays_finite(algorithm, rng):
    checks.check_extreme(CORE, algorithm, None, rng)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_half_precision_inputs(algorithm, dtype):
    checks.check_half(CORE, algorithm, dtype)


@pytest.mark.parametrize("algorithm", ALGS)
def test_jit_vmap(algorithm):
    checks.check_vmap(CORE, algorithm)
