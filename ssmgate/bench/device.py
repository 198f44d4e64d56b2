"""Device benchmark of the Pallas kernels (issue #9): `python -m ssmgate.bench cores --backend=gpu`
(or tpu), run by launch/device_bench.sh on a machine with the accelerator.

1. Correctness on the device: `pallas` (compiled for the chip, not interpreted) against a float64
   run of the `sequential` reference on the host CPU, outputs, final states and gradients, float32
   and bf16 inputs, for scalar_decay and rotation (trapezoid, half the pairs rotated).
2. Speed at Mamba-2-130M-like sizes (default b=8 t=2048 h=24 p=64 n=128 g=1, bf16 x/B/C): tokens/s
   of `pallas`, `chunked` (XLA) and `associative`, forward and forward+backward, the ratio to
   `chunked`, and the fraction of the chip's roofline reached. The roofline uses the chip's own
   measured bf16 matmul FLOP/s and copy bandwidth (not datasheet numbers): the floor of a row is
   max(FLOPs / peak, bytes / bandwidth), FLOPs those of the chunked SSD (cores.flop_count), bytes
   one read of the inputs and one write of y (x3 for forward+backward, as the FLOPs).
3. With --write_auto_table, the `auto` size classes measured with `pallas` among the candidates.

Every check and row is caught on its own, so one failure (an out-of-memory `associative`, a
lowering the installed JAX rejects) is reported and the rest still runs.
"""
from __future__ import annotations

import datetime
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.bench import cores as bench
from ssmgate.cores import registry

# the cores with a Pallas kernel, timed against their associative and chunked forms
DEVICE_ALGORITHMS = {core: ("associative", "chunked", "pallas") for core in registry.with_kernel()}
HALF_INPUTS = ("x", "B", "C")       # cast to bf16 for the timed rows (dt, A, theta, trap stay float32)
CHECK_SHAPE = (2, 300, 4, 64, 128, 1, 32)
CHECK_TOL = {"float32": {"y": 1e-4, "state": 1e-4, "grad": 1e-3}, "bfloat16": {"y": 3e-2, "state": 3e-2}}


def measure_bandwidth(n_bytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes/s of x -> 2x + 1 over n_bytes of float32 (read once, written once)."""
    x = jnp.ones((n_bytes // 4,), jnp.float32)
    f = jax.jit(lambda v: 2.0 * v + 1.0)
    return 2.0 * n_bytes / bench.time_call(f, x, reps, 30.0)


def measure_bf16_flops(size: int = 8192, reps: int = 5) -> float:
    a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), jnp.bfloat16)
    mm = jax.jit(lambda m: jnp.dot(m, m, preferred_element_type=jnp.float32))
    return 2.0 * size**3 / bench.time_call(mm, a, reps, 30.0)


def _to_half(inputs: dict) -> dict:
    return {k: v.astype(jnp.bfloat16) if k in HALF_INPUTS else v for k, v in inputs.items()}


def _grads(fn, inputs):
    y, _ = jax.eval_shape(fn, inputs)
    w = jnp.asarray(np.random.default_rng(1).normal(size=y.shape), y.dtype)
    return jax.jit(jax.grad(lambda i: jnp.vdot(fn(i)[0].astype(w.dtype), w)))(inputs)


def _state_array(final):
    return final if not hasattr(final, "h") else final.h


def _reference(core: str, inputs: dict):
    """float64 sequential on the host CPU: y, final state, gradients."""
    cpu = jax.devices("cpu")[0]
    with jax.enable_x64(True), jax.default_device(cpu):
        i64 = {k: jnp.asarray(np.asarray(v, np.float64)) for k, v in inputs.items()}
        fn = bench.core_fn(core, "sequential")
        y, final = jax.jit(fn)(i64)
        grads = _grads(fn, i64)
        return np.asarray(y), np.asarray(_state_array(final)), {k: np.asarray(v) for k, v in grads.items()}


def check_correctness(log=print) -> list[dict]:
    """pallas on the device vs the float64 reference; one dict per compared quantity."""
    results = []

    def add(result: dict) -> None:
        results.append(result)
        log(_check_line(result))

    for core in DEVICE_ALGORITHMS:
        inputs = bench.make_inputs(core, *CHECK_SHAPE)
        try:
            ref_y, ref_state, ref_grads = _reference(core, inputs)
        except Exception as e:  # noqa: BLE001 - reported, the rest still runs
            add({"core": core, "check": "reference", "ok": False, "error": repr(e)})
            continue
        for dtype in ("float32", "bfloat16"):
            run_inputs = inputs if dtype == "float32" else _to_half(inputs)
            fn = bench.core_fn(core, "pallas", 64)
            try:
                y, final = jax.jit(fn)(run_inputs)
                got = {"y": (np.asarray(y, np.float64), ref_y),
                       "state": (np.asarray(_state_array(final), np.float64), ref_state)}
                if dtype == "float32":
                    grads = _grads(fn, run_inputs)
                    got.update({f"grad_{k}": (np.asarray(v, np.float64), ref_grads[k]) for k, v in grads.items()})
                for what, (g, w) in got.items():
                    tol = CHECK_TOL[dtype]["grad" if what.startswith("grad") else what]
                    err = bench.relative_error(g, w)
                    add({"core": core, "dtype": dtype, "check": what, "rel_err": err, "tol": tol,
                         "ok": bool(err <= tol)})
            except Exception as e:  # noqa: BLE001
                add({"core": core, "dtype": dtype, "check": "run", "ok": False,
                     "error": "".join(traceback.format_exception_only(e)).strip()})
    return results


def _check_line(r: dict) -> str:
    status = "ok  " if r["ok"] else "FAIL"
    if "error" in r:
        return f"check {status} {r['core']:13s} {r.get('dtype', ''):9s} {r['check']}: {r['error']}"
    return f"check {status} {r['core']:13s} {r['dtype']:9s} {r['check']:10s} rel err {r['rel_err']:.1e} (tol {r['tol']:.0e})"


def io_bytes(core: str, b, t, h, p, n, g, r) -> float:
    """One read of the inputs (bf16 x, B, C; float32 dt, theta, trap) and one write of bf16 y."""
    per_token = 2 * h * p + 2 * 2 * g * n + 4 * h + 2 * h * p
    if core == "rotation":
        per_token += 4 * h * r + 4 * h
    return float(b * t * per_token)


def bench_rows(shape, chunk: int, peak: float, bandwidth: float, reps: int, max_seconds: float,
               log=print) -> list[dict]:
    b, t = shape[0], shape[1]
    rows = []
    for core, algorithms in DEVICE_ALGORITHMS.items():
        inputs = _to_half(bench.make_inputs(core, *shape))
        base = {}
        for algorithm in ("chunked",) + tuple(a for a in algorithms if a != "chunked"):
            c = chunk if algorithm in ("chunked", "pallas") else None
            fn = bench.core_fn(core, algorithm, c)
            flops = bench.flop_count(core, "chunked", chunk, *shape)
            nbytes = io_bytes(core, *shape)
            for mode, scale in (("fwd", 1.0), ("fwd+bwd", 3.0)):
                row = {"core": core, "algorithm": algorithm, "chunk": c, "mode": mode, "dtype": "bf16 x/B/C",
                       "flops": scale * flops, "bytes": scale * nbytes}
                try:
                    f = jax.jit(fn) if mode == "fwd" else bench.forward_backward(fn, inputs)
                    sec = bench.time_call(f, inputs, reps, max_seconds)
                    floor = max(row["flops"] / peak, row["bytes"] / bandwidth)
                    row.update(seconds=sec, tokens_per_s=b * t / sec, roofline_fraction=floor / sec,
                               bound="FLOP" if row["flops"] / peak >= row["bytes"] / bandwidth else "bytes")
                    if algorithm == "chunked":
                        base[mode] = sec
                    row["vs_chunked"] = base[mode] / sec if mode in base else None
                except Exception as e:  # noqa: BLE001
                    row["error"] = "".join(traceback.format_exception_only(e)).strip()[:400]
                rows.append(row)
                log(format_row(row))
    return rows


HEADER = (f"{'core':13s} {'algorithm':12s} {'chunk':>5s} {'mode':8s} {'ms':>9s} {'Mtok/s':>8s} "
          f"{'x chunked':>9s} {'roofline %':>10s} {'bound':>5s}")


def format_row(row: dict) -> str:
    chunk = "-" if row["chunk"] is None else str(row["chunk"])
    head = f"{row['core']:13s} {row['algorithm']:12s} {chunk:>5s} {row['mode']:8s}"
    if "error" in row:
        return f"{head} failed: {row['error']}"
    vs = "-" if row["vs_chunked"] is None else f"{row['vs_chunked']:.2f}"
    return (f"{head} {row['seconds'] * 1e3:9.2f} {row['tokens_per_s'] / 1e6:8.2f} {vs:>9s} "
            f"{100 * row['roofline_fraction']:10.1f} {row['bound']:>5s}")


def markdown(result: dict) -> str:
    sh = result["shape"]
    lines = [f"Measured {result['date']} on `{result['device_kind']}` ({result['backend']}), jax {result['jax']}, "
             f"b={sh['b']} t={sh['t']} h={sh['h']} p={sh['p']} n={sh['n']} g={sh['g']} r={sh['r']}, bf16 x/B/C; "
             f"measured bf16 matmul {result['bf16_flops'] / 1e12:.0f} TFLOP/s, copy bandwidth "
             f"{result['bandwidth'] / 1e12:.2f} TB/s. Command: `{result['command']}`.", "",
             "Correctness on the device (pallas vs float64 sequential on the host):", "",
             "| core | inputs | quantity | rel. err | tolerance | ok |", "|---|---|---|---|---|---|"]
    for c in result["checks"]:
        if "error" in c:
            lines.append(f"| {c['core']} | {c.get('dtype', '')} | {c['check']} | error: {c['error'][:120]} | | no |")
        else:
            lines.append(f"| {c['core']} | {c['dtype']} | {c['check']} | {c['rel_err']:.1e} | {c['tol']:.0e} | "
                         f"{'yes' if c['ok'] else 'NO'} |")
    lines += ["", "| core | algorithm | chunk | pass | ms | Mtok/s | × chunked | % of roofline | bound |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['core']} | {r['algorithm']} | {r['chunk'] or '-'} | {r['mode']} | failed: "
                         f"{r['error'][:120]} | | | | |")
            continue
        vs = "-" if r["vs_chunked"] is None else f"{r['vs_chunked']:.2f}"
        lines.append(f"| {r['core']} | {r['algorithm']} | {r['chunk'] or '-'} | {r['mode']} | {r['seconds'] * 1e3:.2f} | "
                     f"{r['tokens_per_s'] / 1e6:.2f} | {vs} | {100 * r['roofline_fraction']:.1f} | {r['bound']} |")
    return "\n".join(lines)


def run(backend: str, shape, chunk: int, reps: int, max_seconds: float, command: str, log=print) -> dict:
    """The whole device benchmark; raises SystemExit when JAX's backend is not `backend`."""
    actual = jax.default_backend()
    if actual != backend:
        raise SystemExit(f"--backend={backend}, but JAX's default backend is {actual!r} "
                         f"(devices {jax.devices()}); run this on a machine with the accelerator")
    kind = jax.devices()[0].device_kind
    log(f"device {kind}; jax {jax.__version__}; b,t,h,p,n,g,r = {shape}; chunk {chunk}")
    peak, bandwidth = measure_bf16_flops(), measure_bandwidth()
    log(f"measured bf16 matmul {peak / 1e12:.0f} TFLOP/s, copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    checks = check_correctness(log)
    log(HEADER)
    rows = bench_rows(shape, chunk, peak, bandwidth, reps, max_seconds, log)
    return {"backend": backend, "device_kind": kind, "jax": jax.__version__, "command": command,
            "date": datetime.date.today().isoformat(), "bf16_flops": peak, "bandwidth": bandwidth,
            "shape": dict(zip("b t h p n g r".split(), shape)), "checks": checks, "rows": rows,
            "checks_passed": all(c["ok"] for c in checks)}
