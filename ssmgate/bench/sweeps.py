"""Sweep benchmark: one vmapped, jitted program for a whole grid vs a Python loop of separate runs.

For the Fig 1a grid (alpha0 x seeds, the paper's sizes and 25 steps) and the Fig 1c grid (tau at
d=128, ell=1024, a few steps of the uniform-query protocol, one seed) it times the sweep as one
program and as a loop that calls one jitted single-run function per grid point (compiled once,
reused), both first call (with compilation) and steady state. Shares --out, --docs and --reps with
the cores benchmark; --docs replaces the block between '<!-- bench:sweeps -->' markers.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from ssmgate.bench.cores import _cpu_name, write_result
from ssmgate.programs import registry
from ssmgate.tasks import perturbed_labels as tasks
from ssmgate.train.sgd_sweep import sgd_run

p1_fig1 = registry.PROGRAMS["p1_fig1"].module("program")  # the Fig 1 program whose sweeps this times

FLAGS = flags.FLAGS
flags.DEFINE_integer("sweep_steps_1c", 10, "SGD steps timed for the Fig 1c grid (per grid point).", lower_bound=1)


def fig1a_grid():
    cfg = p1_fig1.ToyGateCfg(panel="a", d=512, P=32, ell=8, delta=4, eps=0.1, lr=0.1, batch=128, steps=25,
                             seeds=5, alpha0=tuple(np.logspace(-2, -0.05, 13)))
    _, seed_r, params, data, batch_fn, lift = p1_fig1._short_setup(cfg)
    loss = p1_fig1._loss_fn(p1_fig1._model(cfg))

    def one(p, data):
        return sgd_run(loss, p, jnp.asarray(-1), batch_fn, data, 0, lr=cfg.lr, steps=cfg.steps)[0]

    # The sweep shares a seed's data across its alpha0 (as `make reproduce` runs it); the loop gives
    # each run the data of its seed.
    sweep = lambda params, data: lift(jax.vmap(one, in_axes=(0, None)), 1)(params, data)
    per_replica = jax.tree.map(lambda a: a[np.asarray(seed_r - cfg.seed)], data)
    return "Fig 1a: 13 alpha0 x 5 seeds, d=512, 25 steps", cfg.steps, one, (params, data, per_replica), sweep


def fig1c_grid(steps):
    cfg = p1_fig1.ToyGateCfg(panel="c", d=128, ell=1024, delta=None, lr=0.1, batch=128, steps=steps, seeds=1,
                             tau=tuple(np.logspace(0, 4, 9)) + (1e6,), eval_delta=(1,), n_test=1)
    R = len(cfg.tau)
    params = p1_fig1._init_params(cfg, np.log(1.0 / np.asarray(cfg.tau)))
    loss = p1_fig1._loss_fn(p1_fig1._model(cfg))
    key = jax.random.key(0)
    keys = jnp.stack([key] * R)  # every grid point of the seed sees the same batches

    def batch_fn(key, k):
        return tasks.sample_fresh(jax.random.fold_in(key, k), cfg.batch, cfg.d, cfg.ell, None)

    def one(p, key):
        return sgd_run(loss, p, jnp.asarray(-1), batch_fn, key, 0, lr=cfg.lr, steps=steps,
                       trainable={"log_rate": False})[0]

    # The sweep shares one key (and so one batch per step) across tau; the loop cannot.
    sweep = lambda params, keys: jax.vmap(one, in_axes=(0, None))(params, keys[0])
    return (f"Fig 1c: 10 tau, d=128, ell=1024, {steps} steps", steps, one, (params, keys, keys), sweep)


def _time(fn, reps):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return first, best


def bench_grid(name, steps, one, args, sweep, reps=2, log=print):
    """args: (params with a replica axis, the sweep's data, the same data per replica for the loop)."""
    params, data, per_replica = args
    R = len(jax.tree.leaves(params)[0])
    sweep_jit = jax.jit(sweep)
    single = jax.jit(one)
    take = lambda tree, i: jax.tree.map(lambda a: a[i], tree)

    def loop():
        return [single(take(params, i), take(per_replica, i)) for i in range(R)]

    s_first, s_best = _time(lambda: sweep_jit(params, data), reps)
    l_first, l_best = _time(loop, reps)
    row = {"grid": name, "replicas": R, "steps": steps,
           "sweep_first_s": s_first, "sweep_s": s_best, "loop_first_s": l_first, "loop_s": l_best,
           "speedup": l_best / s_best, "speedup_first": l_first / s_first}
    log(f"| {name} | {R} | {s_first:.2f} | {s_best:.2f} | {l_first:.2f} | {l_best:.2f} | "
        f"{row['speedup']:.1f}x | {row['speedup_first']:.1f}x |")
    return row


HEADER = ("| grid | replicas | sweep, first call (s) | sweep (s) | loop, first call (s) | loop (s) | "
          "speed-up | speed-up, first calls |\n|---|---|---|---|---|---|---|---|")


def markdown(result) -> str:
    lines = [f"Measured {result['date']} on {result['cpu']} ({result['cores']} cores), jax {result['jax']}, "
             f"`{result['command']}`. 'first call' includes compilation (the loop compiles its single-run "
             f"function once); the others are the best of {result['reps']} repeats.\n", HEADER]
    for r in result["rows"]:
        lines.append(f"| {r['grid']} | {r['replicas']} | {r['sweep_first_s']:.2f} | {r['sweep_s']:.2f} | "
                     f"{r['loop_first_s']:.2f} | {r['loop_s']:.2f} | {r['speedup']:.1f}x | {r['speedup_first']:.1f}x |")
    return "\n".join(lines)


def main(argv) -> None:
    if len(argv) > 1:
        raise SystemExit(f"ssmgate.bench fig1_sweeps: unexpected arguments {argv[1:]}")
    log = lambda s: print(s, flush=True)
    reps = max(1, min(FLAGS.reps, 3))
    log(HEADER)
    a = fig1a_grid()
    c = fig1c_grid(FLAGS.sweep_steps_1c)
    rows = [bench_grid(*a, reps=reps, log=log), bench_grid(*c, reps=reps, log=log)]
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu_name(), "cores": os.cpu_count(), "jax": jax.__version__,
              "backend": jax.default_backend(), "reps": reps,
              "command": " ".join(["python -m ssmgate.bench"] + sys.argv[1:]), "rows": rows}
    write_result(result, markdown(result), "runs/bench/sweeps.json", "sweeps", log)
