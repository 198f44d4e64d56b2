"""Property checks shared by test_scalar_decay.py, test_rotation.py and test_damped.py.

Each check takes the core's name (and the damped regime) and asserts one property of the contract
(docs/extending.md, "The core contract"; protocol §1.2/1.3/1.5); the per-core files parametrize them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tests.cores import common as cm

REF_TOL = 1e-5      # fp32 vs the float64 reference (outputs and final states)
GRAD_TOL = 1e-4     # gradients of every algorithm vs the sequential one
EXTREME_GRAD_TOL = 1e-5  # the same at dt*|A| in [1e-6, 50]: segment sums that cancel show up here first
PAIR_TOL = 2e-5     # two fp32 algorithms that each sit within REF_TOL of the reference
GRAD_CASE = cm.Case("grad13", b=2, t=13, h=4, p=3, g=2, n=8, r=2, chunk=4)  # 3 chunks + 1 token


def check_reference(core, case, algorithm, regime=None):
    inp = cm.case_inputs(core, case, regime)
    got = cm.run(core, inp, algorithm, case, regime)
    cm.assert_close(core, got, cm.case_reference(core, case, regime), REF_TOL,
                    f"{core}/{algorithm}/{regime} on {case.name} vs float64 reference")


def check_step(core, case, regime=None):
    """Running the one-token step over the sequence equals the reference and every parallel form."""
    inp = cm.case_inputs(core, case, regime)
    stepped = cm.run_steps(core, inp, regime)
    cm.assert_close(core, stepped, cm.case_reference(core, case, regime), REF_TOL, "step loop vs reference")
    for algorithm in cm.PARALLEL[core]:
        cm.assert_close(core, stepped, cm.run(core, inp, algorithm, case, regime), PAIR_TOL,
                        f"step loop vs {algorithm}")


def check_split(core, algorithm, k, regime=None):
    """run(0..k) then run(k..t) from the first final state == run(0..t)."""
    case = cm.SPLIT_CASE
    inp = cm.case_inputs(core, case, regime)
    whole = cm.run(core, inp, algorithm, case, regime)
    y1, s1 = cm.run(core, cm.time_slice(inp, 0, k, inp["init"]), algorithm, case, regime)
    y2, s2 = cm.run(core, cm.time_slice(inp, k, case.t, s1), algorithm, case, regime)
    cm.assert_close(core, (jnp.concatenate([y1, y2], axis=1), s2), whole, REF_TOL,
                    f"{core}/{algorithm} split at {k} of {case.t}")
    # and the split run is as accurate as the whole one
    cm.assert_close(core, (jnp.concatenate([y1, y2], axis=1), s2), cm.case_reference(core, case, regime),
                    REF_TOL, "split run vs reference")


def grad_inputs(core, case, regime, rng):
    inp = cm.make_inputs(core, case, rng)
    y_shape = (case.b, case.t, case.h, case.p)
    # final-state shapes without running anything: the input state has them
    proj = cm.projection_weights(y_shape, inp["init"], rng)
    return inp, proj


def _grad_leaves(grads):
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in
            jax.tree_util.tree_flatten_with_path(grads)[0]}


def check_gradients(core, algorithm, regime, rng, case=GRAD_CASE):
    """Gradients w.r.t. every float input (x, dt, A, B, C, theta/nu, trap, D, every initial_state
    field) of a random projection of y and the final state, against the sequential algorithm."""
    inp, proj = grad_inputs(core, case, regime, rng)
    want, (y_seq, _) = cm.grad_runner(core, "sequential", None, regime)(inp, proj)
    chunk = case.chunk if algorithm in cm.CHUNKED else None
    got, (y, _) = cm.grad_runner(core, algorithm, chunk, regime)(inp, proj)
    assert cm.rel_err(y, y_seq) <= PAIR_TOL
    want, got = _grad_leaves(want), _grad_leaves(got)
    expected = {"['x']", "['dt']", "['A']", "['B']", "['C']", "['D']"}
    if core != "scalar_decay":
        expected |= {"['theta']", "['trap']"}
    assert expected <= set(want), f"missing gradients: {expected - set(want)}"
    assert len([k for k in want if k.startswith("['init']")]) == len(cm.STATE_FIELDS[core])
    errors = {}
    for name, w in want.items():
        if core == "damped" and regime == "critical" and name == "['theta']":
            # nu only sets r for 'critical': its gradient is exactly zero.
            assert not np.any(w) and not np.any(got[name]), f"{name}: nu must not matter for 'critical'"
            continue
        assert np.max(np.abs(w)) > 0, f"sequential gradient of {name} is identically zero"
        errors[name] = cm.rel_err(got[name], w)
    bad = {k: v for k, v in errors.items() if not v <= GRAD_TOL}
    assert not bad, f"{core}/{algorithm}/{regime}: gradient errors vs sequential above {GRAD_TOL}: {bad}"


def extreme_inputs(core, case, rng):
    """dt * |A| log-uniform over [1e-6, 50] per token (both ends present), dt in [1e-3, 1]."""
    inp = cm.make_inputs(core, case, rng)
    shape = (case.b, case.t, case.h)
    prod = np.exp(rng.uniform(np.log(1e-6), np.log(50.0), shape))
    prod[:, 0], prod[:, 1] = 1e-6, 50.0
    prod[:, -1] = 50.0
    prod[:, -2] = 1e-6
    dt = inp["dt"]
    rate = (prod / dt).astype(np.float32)
    inp["A"] = rate if core == "damped" else -rate
    return inp


def check_extreme(core, algorithm, regime, rng, case=GRAD_CASE):
    """Extreme decays dt*|A| in [1e-6, 50] give finite outputs, states and gradients; the outputs
    still agree with the float64 reference and the gradients with the sequential algorithm's."""
    inp = extreme_inputs(core, case, rng)
    proj = cm.projection_weights((case.b, case.t, case.h, case.p), inp["init"], rng)
    chunk = case.chunk if algorithm in cm.CHUNKED else None
    grads, (y, final) = cm.grad_runner(core, algorithm, chunk, regime)(inp, proj)
    cm.assert_all_finite((y, final), f"{core}/{algorithm}/{regime} outputs")
    cm.assert_all_finite(grads, f"{core}/{algorithm}/{regime} gradients")
    cm.assert_close(core, (y, final), cm.reference_run(core, inp, regime), REF_TOL, "extreme decays vs reference")
    want, _ = cm.grad_runner(core, "sequential", None, regime)(inp, proj)
    got, want = _grad_leaves(grads), _grad_leaves(want)
    errors = {k: cm.rel_err(got[k], w) for k, w in want.items()}
    assert max(errors.values()) <= EXTREME_GRAD_TOL, f"extreme decays: gradient errors vs sequential {errors}"


def check_half(core, algorithm, dtype, regime=None):
    """bf16/fp16 inputs: y in the input dtype, float32 final state, close to the fp32 run."""
    case = cm.SPLIT_CASE
    inp32 = cm.case_inputs(core, case, regime)
    inp = jax.tree.map(lambda a: np.asarray(a).astype(dtype), inp32)
    y, final = cm.run(core, inp, algorithm, case, regime)
    assert y.dtype == jnp.dtype(dtype), f"y has dtype {y.dtype}, expected {np.dtype(dtype).name}"
    for name, leaf in zip(cm.STATE_FIELDS[core], cm.state_leaves(core, final)):
        assert leaf.dtype == jnp.float32, f"final_state.{name} has dtype {leaf.dtype}, expected float32"
    # Close to the fp32 run on the unrounded inputs: 4 eps of the input dtype (bf16: 3.1e-2).
    cm.assert_close(core, (y, final), cm.run(core, inp32, algorithm, case, regime), 4 * float(jnp.finfo(dtype).eps),
                    f"{np.dtype(dtype).name} vs fp32 run")
    # Exactly what float32 gives on the rounded inputs: state to REF_TOL, y to its output rounding.
    want_y, want_state = cm.reference_run(core, jax.tree.map(lambda a: np.asarray(a, np.float32), inp), regime)
    out_eps = float(jnp.finfo(dtype).eps) / 2  # unit roundoff of y's dtype
    assert cm.rel_err(y, want_y) <= out_eps + REF_TOL
    cm.assert_close(core, (want_y, final), (want_y, want_state), REF_TOL, "state (rounded inputs) vs reference")


def check_vmap(core, algorithm, regime=None):
    """jit(vmap(core)) over an extra leading axis equals the reference per slice."""
    case = cm.TINY
    chunk = case.chunk if algorithm in cm.CHUNKED else None
    inps = [cm.case_inputs(core, case, regime, seed) for seed in (0, 1, 2)]
    stacked = jax.tree.map(lambda *leaves: np.stack(leaves), *inps)
    fn = jax.jit(jax.vmap(lambda inp: cm.call_core(core, inp, algorithm=algorithm, chunk_size=chunk,
                                                   regime=regime)))
    ys, finals = fn(stacked)
    for i, inp in enumerate(inps):
        cm.assert_close(core, (ys[i], jax.tree.map(lambda a: a[i], finals)), cm.reference_run(core, inp, regime),
                        REF_TOL, f"vmap slice {i}")

