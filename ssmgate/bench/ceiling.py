"""SSD ceiling: how fast could the chunked form's forward pass be on this machine, at most?

The chunked (SSD) forward pass of `scalar_decay` is, besides its segment sums and elementwise work,
three batched contractions per chunk of Q tokens: the intra-chunk product (per head, Q x Q by
Q x p), the chunk states (per group, n x Q by Q x (h/g) p) and the read of the carried state (per
group, Q x n by n x (h/g) p). This benchmark times each one alone, as a jitted einsum on random
data, in every operand layout the chunked form could choose (token-major as the inputs come,
head-major, group-major), and keeps the fastest. Their sum is a lower bound on any chunked forward
pass built from XLA's batched matmuls here; `sequential` over the time of that bound is the most
any such formulation could gain over the scan. Prints a table, writes JSON; `--docs` replaces the
block between '<!-- bench:ceiling -->' markers.

`python -m ssmgate.bench ssd_ceiling [--shape=b,t,h,p,n,g,r] [--chunk_sizes=...] [--reps=N] [--out] [--docs]`
(the cores benchmark's flags; r is unused).
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from ssmgate.bench.cores import _cpu_name, core_fn, make_inputs, measure_matmul_flops, time_call, write_result

FLAGS = flags.FLAGS  # --shape, --chunk_sizes, --reps, --out and --docs are the cores benchmark's flags

# Per stage: (operand shapes as functions of (b, c, q, h, g, j, p, n), einsum) for every layout tried.
# Letters: b batch, c chunk, q/s token in chunk, h head = (g group, j head in group), p, n channels.
STAGES = {
    "intra (W xs)": [
        ("token-major", lambda b, c, q, h, g, j, p, n: [(b, c, h, q, q), (b, c, q, h, p)], "bchqs,bcshp->bcqhp"),
        ("head-major", lambda b, c, q, h, g, j, p, n: [(b, c, h, q, q), (b, c, h, q, p)], "bchqs,bchsp->bchqp"),
    ],
    "chunk states (B^T xs)": [
        ("token-major, state (p, n)", lambda b, c, q, h, g, j, p, n: [(b, c, q, g, j, p), (b, c, q, g, n)],
         "bcsgjp,bcsgn->bcgjpn"),
        ("token-major, state (n, p)", lambda b, c, q, h, g, j, p, n: [(b, c, q, g, j, p), (b, c, q, g, n)],
         "bcsgjp,bcsgn->bcgnjp"),
        ("group-major", lambda b, c, q, h, g, j, p, n: [(b, c, g, q, j, p), (b, c, g, n, q)],
         "bcgsjp,bcgns->bcgnjp"),
    ],
    "state read (C S)": [
        ("state (p, n)", lambda b, c, q, h, g, j, p, n: [(b, c, q, g, n), (b, c, g, j, p, n)],
         "bcqgn,bcgjpn->bcqgjp"),
        ("state (n, p)", lambda b, c, q, h, g, j, p, n: [(b, c, q, g, n), (b, c, g, n, j, p)],
         "bcqgn,bcgnjp->bcqgjp"),
    ],
}


def stage_flops(stage: str, b, t, h, g, p, n, q) -> float:
    """Multiply-adds x 2 of one stage over the whole (padded) sequence."""
    tokens = b * (-(-t // q) * q)
    return float(2 * tokens * {"intra (W xs)": q * h * p, "chunk states (B^T xs)": h * p * n,
                               "state read (C S)": h * p * n}[stage])


def time_stage(stage: str, b, t, h, g, p, n, q, reps: int) -> list[dict]:
    """Every layout of one stage, timed alone on random float32 operands."""
    c = -(-t // q)
    rng = np.random.default_rng(0)
    rows = []
    for layout, shapes, spec in STAGES[stage]:
        operands = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes(b, c, q, h, g, h // g, p, n)]
        fn = jax.jit(lambda *ops, spec=spec: jnp.einsum(spec, *ops))
        rows.append({"layout": layout, "seconds": time_call(lambda ops: fn(*ops), operands, reps, 20.0)})
    return rows


def measure(shape, chunks, reps, log=print) -> dict:
    b, t, h, p, n, g, r = shape
    peak = measure_matmul_flops()
    log(f"[ssd ceiling] matmul peak {peak / 1e9:.1f} GFLOP/s")
    inputs = make_inputs("scalar_decay", *shape)
    sequential = jax.jit(core_fn("scalar_decay", "sequential"))
    seq = time_call(sequential, inputs, reps, 30.0)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu_name(), "cores": os.cpu_count(), "jax": jax.__version__,
              "device": str(jax.devices()[0]), "command": "python -m ssmgate.bench " + " ".join(sys.argv[1:]),
              "shape": dict(zip("bthpngr", shape)), "matmul_peak_flops": peak, "chunks": []}
    for q in chunks:
        stages = []
        for stage in STAGES:
            timed = time_stage(stage, b, t, h, g, p, n, q, reps)
            best = min(timed, key=lambda x: x["seconds"])
            flops = stage_flops(stage, b, t, h, g, p, n, q)
            stages.append({"stage": stage, "layouts": timed, "best_layout": best["layout"], "seconds": best["seconds"],
                           "flops": flops, "flops_per_s": flops / best["seconds"]})
            log(f"[ssd ceiling] Q={q} {stage}: best {best['layout']} {best['seconds'] * 1e3:.2f} ms "
                f"({flops / best['seconds'] / 1e9:.1f} GFLOP/s; " +
                ", ".join(f"{x['layout']} {x['seconds'] * 1e3:.2f}" for x in timed) + ")")
        bound = sum(s["seconds"] for s in stages)
        result["chunks"].append({"chunk": q, "stages": stages, "bound_s": bound})
        log(f"[ssd ceiling] Q={q}: the three contractions alone take {bound * 1e3:.1f} ms")
    # Timed before and after the stages, the best kept: this VM class has slow spells (the scan at
    # 17 ms in one process, 40 ms in the next) that would otherwise decide the ratio.
    seq = min(seq, time_call(sequential, inputs, reps, 30.0))
    result["sequential_fwd_s"] = seq
    log(f"[ssd ceiling] scalar_decay sequential forward: {seq * 1e3:.1f} ms")
    for c in result["chunks"]:
        c["max_speedup_vs_sequential"] = seq / c["bound_s"]
        log(f"[ssd ceiling] Q={c['chunk']}: a chunked forward pass is at most {seq / c['bound_s']:.2f}x faster "
            f"than sequential here")
    return result


def markdown(result: dict) -> str:
    sh = result["shape"]
    lines = [f"Measured {result['date']} on `{result['device']}` ({result['cpu']}, {result['cores']} cores), jax "
             f"{result['jax']}, float32, b={sh['b']} t={sh['t']} h={sh['h']} p={sh['p']} n={sh['n']} g={sh['g']}; "
             f"matmul peak {result['matmul_peak_flops'] / 1e9:.1f} GFLOP/s; `scalar_decay` `sequential` forward "
             f"{result['sequential_fwd_s'] * 1e3:.1f} ms. Command: `{result['command']}`.", "",
             "| chunk | intra (W xs) | chunk states (Bᵀ xs) | state read (C S) | sum = lower bound | "
             "most a chunked forward can gain over sequential |", "|---|---|---|---|---|---|"]
    for c in result["chunks"]:
        cells = [f"{s['seconds'] * 1e3:.2f} ms, {s['flops_per_s'] / 1e9:.0f} GFLOP/s ({s['best_layout']})"
                 for s in c["stages"]]
        lines.append(f"| {c['chunk']} | " + " | ".join(cells) +
                     f" | {c['bound_s'] * 1e3:.1f} ms | {c['max_speedup_vs_sequential']:.2f}× |")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    try:
        shape = tuple(int(v) for v in FLAGS.shape)
        chunks = [int(c) for c in FLAGS.chunk_sizes]
    except ValueError:
        raise SystemExit(f"--shape takes 7 integers b,t,h,p,n,g,r and --chunk_sizes integers; got {FLAGS.shape}, "
                         f"{FLAGS.chunk_sizes}") from None
    if len(shape) != 7 or min(shape[:6]) < 1 or shape[2] % shape[5] or min(chunks, default=0) < 1:
        raise SystemExit(f"--shape takes 7 positive integers b,t,h,p,n,g,r with g dividing h, and --chunk_sizes "
                         f"positive ones; got {FLAGS.shape}, {FLAGS.chunk_sizes}")
    result = measure(shape, chunks, FLAGS.reps)
    print(markdown(result))
    write_result(result, markdown(result), "runs/bench/ssd_ceiling.json", "ceiling")
