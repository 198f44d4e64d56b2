"""What the training loop's non-finite check costs (`python -m ssmgate.bench nan_check`).

The sweeps of `python -m ssmgate.bench sweep` (16 Mamba-2 LMs, one vmapped step; a tiny and a
small size) are driven three ways over the same batches: the host reads each step's metrics before
it dispatches the next (the loop's check until 2026-12-03), one step late (the loop's check now:
the device always has the next step queued), and never (the ceiling). Steps per second of each,
measured in one run; --docs replaces the block between '<!-- bench:nan_check -->' markers.
"""
from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
from absl import flags

from ssmgate.bench.cores import _cpu_name, write_result
from ssmgate.bench.train import SWEEP_LRS, SWEEP_OFFSETS, SWEEP_SIZES, _loss
from ssmgate.models.gates import offset_gates
from ssmgate.models.lm import build_model
from ssmgate.tasks import synthetic_lm
from ssmgate.train import optim, sweep
from ssmgate.train.step import make_train_step

FLAGS = flags.FLAGS
flags.DEFINE_integer("check_steps", 100, "Timed steps per way of driving the sweep.", lower_bound=2)
WAYS = (("read before the next step", 0), ("one step late", 1), ("never", None))


def bench_size(cfg, task, steps: int, reps: int) -> dict:
    model = build_model(cfg)
    tx = optim.make_optimizer(optim.OptimCfg(name="adamw", lr=1e-3, total_steps=steps))
    replicas = sweep.grid([0], SWEEP_LRS, SWEEP_OFFSETS)
    init = lambda key, offset: offset_gates(model.init(key, jnp.zeros((1, 8), jnp.int32))["params"], offset)
    state0 = jax.jit(lambda: sweep.init_sweep(replicas, init, tx))()
    sample = jax.jit(lambda key: synthetic_lm.sample(key, task))
    k = len(replicas)
    stacked = [jax.tree.map(lambda a: jnp.broadcast_to(a, (k,) + a.shape), sample(synthetic_lm.step_key(0, i)))
               for i in range(steps)]
    vstep = jax.jit(sweep.sweep_step(make_train_step(_loss(model), tx)))

    def drive(lag):
        def run():
            s, pending = state0, []
            for b in stacked:
                s, m = vstep(s, b)
                pending.append(m)
                if lag is not None and len(pending) > lag:
                    jax.device_get(pending.pop(0)["nonfinite"])
            jax.device_get([m["nonfinite"] for m in pending])
            jax.block_until_ready(s)
        return run

    # Interleaved repeats (one of each way per round), best of each: a burst of load from elsewhere
    # on the machine then hits every way alike instead of one way's repeats.
    runs = {name: drive(lag) for name, lag in WAYS}
    for run in runs.values():
        run()  # compile and warm up
    best = {name: float("inf") for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    rates = {name: steps / best[name] for name in runs}
    return {"replicas": k, "steps": steps, "batch": task.batch, "seq_len": task.seq_len, "steps_per_s": rates}


def markdown(result: dict) -> str:
    lines = [f"Measured {result['date']} on {result['cpu']} ({result['cores']} cores), jax {result['jax']}, "
             f"`{result['command']}`; best of {result['reps']} interleaved rounds. Steps per second of the sweep's vmapped step "
             "(× the first column in brackets):", "",
             "| sweep | " + " | ".join(name for name, _ in WAYS) + " |", "|---" * (len(WAYS) + 1) + "|"]
    for size, r in result["sizes"].items():
        base = r["steps_per_s"][WAYS[0][0]]
        cells = [f"{v:.1f}" if name == WAYS[0][0] else f"{v:.1f} ({v / base:.2f}×)" for name, v in r["steps_per_s"].items()]
        lines.append(f"| {size}: {r['replicas']} models, batch {r['batch']} x {r['seq_len']}, {r['steps']} steps | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    reps = max(1, FLAGS.reps)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu_name(), "cores": os.cpu_count(), "jax": jax.__version__,
              "command": "python -m ssmgate.bench " + " ".join(sys.argv[1:]), "reps": reps,
              "sizes": {name: bench_size(cfg, task, FLAGS.check_steps, reps) for name, (cfg, task) in SWEEP_SIZES.items()}}
    print(markdown(result))
    write_result(result, markdown(result), "runs/bench/nan_check.json", "nan_check")
