"""scalar_decay (protocol §1.2) and rotation (protocol §1.3, Mamba-3 SISO): every algorithm against the
float64 reference, gradients, step, split (rotation with trapezoid, so the carried B_prev/x_prev
matter), extreme decays, half-precision inputs, vmap. The damped core has its regimes and its own
file; rotation's protocol §1.3.1 identities are in test_rotation.py."""
import jax.numpy as jnp
import numpy as np
import pytest

from tests.cores import checks
from tests.cores import common as cm

CORE_ALGS = [(core, alg) for core in ("scalar_decay", "rotation") for alg in cm.EXPLICIT[core]]
CORES = pytest.mark.parametrize("core", ["scalar_decay", "rotation"])
EACH_ALGORITHM = pytest.mark.parametrize("core,algorithm", CORE_ALGS, ids=[f"{c}-{a}" for c, a in CORE_ALGS])


@pytest.mark.parametrize("case", cm.REF_CASES, ids=lambda c: c.name)
@EACH_ALGORITHM
def test_matches_reference(core, algorithm, case):
    checks.check_reference(core, case, algorithm)


@CORES
@pytest.mark.filterwarnings(cm.AUTO_WARNING)
@pytest.mark.parametrize("case", [cm.full(65), cm.PLAIN], ids=lambda c: c.name)
def test_auto_matches_reference(core, case):
    checks.check_reference(core, case, "auto")


@pytest.mark.parametrize("core,algorithm", [(c, a) for c, a in CORE_ALGS if a != "sequential"])
def test_gradients_match_sequential(core, algorithm, rng):
    checks.check_gradients(core, algorithm, None, rng)


@CORES
@pytest.mark.parametrize("case", [cm.full(65), cm.PLAIN], ids=lambda c: c.name)
def test_step_equals_parallel(core, case):
    checks.check_step(core, case)


@pytest.mark.parametrize("k", cm.SPLIT_POINTS)
@EACH_ALGORITHM
def test_split_equals_whole(core, algorithm, k):
    checks.check_split(core, algorithm, k)


@EACH_ALGORITHM
def test_extreme_decays_finite(core, algorithm, rng):
    checks.check_extreme(core, algorithm, None, rng)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bf16", "fp16"])
@EACH_ALGORITHM
def test_half_precision_inputs(core, algorithm, dtype):
    checks.check_half(core, algorithm, dtype)


@EACH_ALGORITHM
def test_jit_vmap(core, algorithm):
    checks.check_vmap(core, algorithm)
