"""Training benchmark (`python -m ssmgate.bench sweep`).

1. A sweep of 16 small Mamba-2 language models (4 learning rates x 4 gate offsets, the recall
   task; a tiny and a small size) trained by one vmapped, jitted step, against the same 16 runs
   one after another with one jitted single-run step (compiled once, reused). Both run the same number of steps from the
   same states; the table gives steady-state time per step of all 16 models, the first call
   (with compilation) separately, and the speed-up.
   Then where the time goes, per replica: forward and gradient of one model against the same
   vmapped, run one after another in one program (lax.map) and, for the recurrent core, folded
   into one call's batch; and the core's and the largest weight matmul's gradients alone.
2. Training throughput (forward + backward + AdamW) of 4-layer d=256 language models on the
   copy task: Mamba-2, Mamba-3 (SISO, rotation) and a Llama-style Transformer, in tokens/s, with
   the model FLOPs (6 x non-embedding params x tokens + the mixing terms) as a fraction of the
   machine's measured float32 matmul peak.

Shares --out, --docs and --reps with the other benchmarks; --docs replaces the block between
'<!-- bench:train -->' markers.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from ssmgate.bench import cli_runs
from ssmgate.bench.cores import _cpu_name, measure_matmul_flops, write_result
from ssmgate.cores import scalar_decay
from ssmgate.models.config import ModelCfg
from ssmgate.models.gates import offset_gates
from ssmgate.models.lm import build_model, init_params
from ssmgate.models.presets import count_breakdown
from ssmgate.tasks import synthetic_lm
from ssmgate.train import optim, sweep
from ssmgate.train.state import TrainState
from ssmgate.train.step import make_train_step
from ssmgate.train.throughput import model_flops  # noqa: F401  (also used by device_check and the tests)

FLAGS = flags.FLAGS
flags.DEFINE_integer("train_steps", 20, "Timed training steps per measurement.", lower_bound=1)
flags.DEFINE_integer("run_steps", 500, "Steps of each end-to-end run (16 separate runs vs one sweep run); 0 skips them.",
                     lower_bound=0)

SWEEP_MODEL = ModelCfg(block="mamba2", vocab_size=32, d_model=32, n_layers=2, d_state=16, headdim=16)
SWEEP_LRS, SWEEP_OFFSETS = np.logspace(-3.5, -2, 4), np.linspace(-3, 1, 4)
SWEEP_TASK = synthetic_lm.SyntheticCfg("recall", batch=16, seq_len=33, vocab_size=32)
# Two sizes: per-op overhead dominates a step of the tiny one, arithmetic the other.
SWEEP_SIZES = {
    "tiny": (ModelCfg(block="mamba2", vocab_size=32, d_model=16, n_layers=1, d_state=16, headdim=8),
             synthetic_lm.SyntheticCfg("recall", batch=4, seq_len=17, vocab_size=32)),
    "small": (SWEEP_MODEL, SWEEP_TASK),
}
THROUGHPUT_TASK = dict(batch=8, seq_len=256)


def _loss(model):
    def loss_fn(params, batch, rng):
        logits, _ = model.apply({"params": params}, batch.inputs)
        return synthetic_lm.lm_loss(logits, batch)
    return loss_fn


def _timed(fn, reps):
    """(first call incl. compilation, best of reps) in seconds; fn() must block."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return first, best


def bench_sweep(steps: int, reps: int, cfg: ModelCfg = SWEEP_MODEL, task=SWEEP_TASK, lrs=SWEEP_LRS,
                offsets=SWEEP_OFFSETS, log=print) -> dict:
    model = build_model(cfg)
    tx = optim.make_optimizer(optim.OptimCfg(name="adamw", lr=1e-3, total_steps=steps))
    step = make_train_step(_loss(model), tx)
    replicas = sweep.grid([0], lrs, offsets)
    tokens = jnp.zeros((1, 8), jnp.int32)
    init = lambda key, offset: offset_gates(model.init(key, tokens)["params"], offset)
    state0 = jax.jit(lambda: sweep.init_sweep(replicas, init, tx))()  # eagerly, Flax's init compiles op by op
    keys = [synthetic_lm.step_key(0, k) for k in range(steps)]
    sample = jax.jit(lambda key: synthetic_lm.sample(key, task))  # compiled once for every step's key
    batches = [sample(key) for key in keys]
    k = len(replicas)
    stacked = [jax.tree.map(lambda a: jnp.broadcast_to(a, (k,) + a.shape), b) for b in batches]

    vstep = jax.jit(sweep.sweep_step(step))
    one = jax.jit(step)
    singles = [jax.tree.map(lambda a: a[r], state0.train) for r in range(k)]

    def run_sweep():
        s = state0
        for b in stacked:
            s, _ = vstep(s, b)
        jax.block_until_ready(s)

    def run_sequential():
        for s in singles:
            for b in batches:
                s, _ = one(s, b)
            jax.block_until_ready(s)

    first_v, best_v = _timed(run_sweep, reps)
    first_s, best_s = _timed(run_sequential, reps)
    row = {"replicas": k, "steps": steps, "params_per_model": count_breakdown(cfg)["total"],
           "batch": task.batch, "seq_len": task.seq_len,
           "sweep_first_s": first_v, "sweep_s": best_v, "sequential_first_s": first_s, "sequential_s": best_s,
           "speedup": best_s / best_v, "speedup_first": first_s / first_v}
    log(f"[bench sweep] {k} Mamba-2 LMs ({row['params_per_model']:,} params each), {steps} steps: "
        f"vmapped {best_v:.3f}s vs sequential {best_s:.3f}s -> {row['speedup']:.1f}x "
        f"(with compilation {first_v:.2f}s vs {first_s:.2f}s)")
    return row


def _per_replica_times(fn, one, stacked, k: int, reps: int, folded=None) -> dict:
    """Seconds per replica of fn on one replica's input, vmapped over k stacked inputs, run one after
    another inside one program (lax.map), and, when given, as one call on the k inputs folded into
    its batch axis (`folded` = (fn_folded, input))."""
    timed = lambda f, a: _timed(lambda: jax.block_until_ready(f(a)), reps)[1]
    row = {"one_s": timed(jax.jit(fn), one),
           "vmapped_s": timed(jax.jit(jax.vmap(fn)), stacked) / k,
           "mapped_s": timed(jax.jit(lambda a: jax.lax.map(fn, a)), stacked) / k,
           "folded_s": None}
    if folded is not None:
        row["folded_s"] = timed(jax.jit(folded[0]), folded[1]) / k
    return row


def _core_inputs(cfg: ModelCfg, b: int, t: int, k: int):
    """k replicas' scalar_decay inputs at the shapes the sweep's Mamba-2 gives its core; each replica
    has its own decay (its gate offset), as in the sweep."""
    h, p, g, n = cfg.n_ssm_heads, cfg.headdim, cfg.n_groups, cfg.d_state
    keys = jax.random.split(jax.random.PRNGKey(3), 5)
    x = jax.random.normal(keys[0], (k, b, t, h, p))
    dt = jax.nn.softplus(jax.random.normal(keys[1], (k, b, t, h)) - 2.0)
    A = -jnp.exp(jnp.linspace(-3.0, 1.0, k)[:, None] + jnp.zeros((k, h)))
    B = jax.random.normal(keys[2], (k, b, t, g, n))
    C = jax.random.normal(keys[3], (k, b, t, g, n))
    w = jax.random.normal(keys[4], (k, b, t, h, p))
    return x, dt, A, B, C, w


def bench_split(reps: int, cfg: ModelCfg = SWEEP_MODEL, task=SWEEP_TASK, k: int = 16, log=print,
                models: Sequence[str] = ("Mamba-2", "Llama")) -> list[dict]:
    """Where a sweep's time goes, per replica: the forward pass and gradient of the sweep's Mamba-2
    and of a Llama of the same width, then two parts of the Mamba-2 gradient alone (its recurrent
    core, `scalar_decay` with `auto`, and its largest weight matmul, in_proj), each for one replica,
    k vmapped, k one after another in one program (lax.map) and, for the core, the k replicas
    folded into one call's batch (per-token decay carries each replica's gate)."""
    rows = []
    batch = jax.jit(lambda key: synthetic_lm.sample(key, task))(synthetic_lm.step_key(0, 0))
    b, t = batch.inputs.shape
    configs = {"Mamba-2": cfg, "Llama": dataclasses.replace(cfg, block="llama", n_heads=2, mlp="swiglu")}
    for name in models:
        model = build_model(configs[name])
        loss = _loss(model)
        stacked = jax.jit(jax.vmap(lambda key: model.init(key, batch.inputs[:1, :8])["params"]))(
            jax.random.split(jax.random.PRNGKey(0), k))
        one = jax.tree.map(lambda a: a[0], stacked)
        fwd = lambda p: loss(p, batch, None)[0]
        for what, fn in (("forward", fwd), ("gradient", jax.grad(fwd))):
            rows.append(dict(part=f"{name} {what}", replicas=k, **_per_replica_times(fn, one, stacked, k, reps)))

    x, dt, A, B, C, w = _core_inputs(cfg, b, t, k)

    def core_loss(args):
        x_, dt_, A_, B_, C_, w_ = args
        return jnp.sum(scalar_decay(x_, dt_, A_, B_, C_)[0] * w_)

    core_grad = jax.grad(core_loss)
    fold = lambda a: a.reshape((k * b,) + a.shape[2:])
    folded_args = (fold(x), fold(dt), fold(jnp.broadcast_to(A[:, None, None, :], dt.shape)), fold(B), fold(C), fold(w))
    stacked_args = (x, dt, A, B, C, w)
    # The folded call must compute the same gradients as the vmapped one, or its time means nothing.
    unfold = lambda a: a.reshape((k, b) + a.shape[1:])
    g_v, g_f = jax.jit(jax.vmap(core_grad))(stacked_args), jax.jit(core_grad)(folded_args)
    for i in (0, 1, 3, 4):  # x, dt, B, C (A's gradient is per replica in one, per token in the other)
        if not np.allclose(g_v[i], unfold(g_f[i]), rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"bench_split: the folded core's gradient {i} differs from the vmapped one")
    rows.append(dict(part="core gradient (scalar_decay, auto)", replicas=k, **_per_replica_times(
        core_grad, jax.tree.map(lambda a: a[0], stacked_args), stacked_args, k, reps, folded=(core_grad, folded_args))))

    d_out = 2 * cfg.d_inner + 2 * cfg.n_groups * cfg.d_state + cfg.n_ssm_heads
    keys = jax.random.split(jax.random.PRNGKey(4), 3)
    mm_args = (jax.random.normal(keys[0], (k, b, t, cfg.d_model)), jax.random.normal(keys[1], (k, cfg.d_model, d_out)),
               jax.random.normal(keys[2], (k, b, t, d_out)))
    mm_grad = jax.grad(lambda a: jnp.sum((a[0] @ a[1]) * a[2]))
    rows.append(dict(part=f"in_proj gradient ({b * t} x {cfg.d_model} @ {cfg.d_model} x {d_out})", replicas=k,
                     **_per_replica_times(mm_grad, jax.tree.map(lambda a: a[0], mm_args), mm_args, k, reps)))
    for r in rows:
        folded = "" if r["folded_s"] is None else f", folded {1e3 * r['folded_s']:.2f}"
        log(f"[bench split] {r['part']}: one {1e3 * r['one_s']:.2f}, vmapped {1e3 * r['vmapped_s']:.2f}, "
            f"lax.map {1e3 * r['mapped_s']:.2f}{folded} ms per replica")
    return rows


THROUGHPUT_MODELS = {
    "Mamba-2": ModelCfg(block="mamba2", vocab_size=256, d_model=256, n_layers=4, d_state=64, headdim=64),
    "Mamba-3": ModelCfg(block="mamba3", vocab_size=256, d_model=256, n_layers=4, d_state=64, headdim=64),
    "Transformer (Llama)": ModelCfg(block="llama", vocab_size=256, d_model=256, n_layers=4, n_heads=4, mlp="swiglu"),
}


def bench_throughput(steps: int, reps: int, peak: float, log=print) -> list[dict]:
    rows = []
    b, t = THROUGHPUT_TASK["batch"], THROUGHPUT_TASK["seq_len"]
    for name, cfg in THROUGHPUT_MODELS.items():
        model = build_model(cfg)
        tx = optim.make_optimizer(optim.OptimCfg(name="adamw", lr=1e-3, total_steps=steps))
        step = jax.jit(make_train_step(_loss(model), tx))
        task = synthetic_lm.SyntheticCfg("copy", batch=b, seq_len=t, vocab_size=cfg.vocab_size)
        batch = synthetic_lm.sample(synthetic_lm.step_key(0, 0), task)
        state0 = TrainState.create(init_params(cfg, jax.random.PRNGKey(0)), tx, jax.random.PRNGKey(1))

        def run():
            s = state0
            for _ in range(steps):
                s, _ = step(s, batch)
            jax.block_until_ready(s)

        first, best = _timed(run, reps)
        sec = best / steps
        flops = model_flops(cfg, b, t)
        row = {"model": name, "params": count_breakdown(cfg)["total"], "batch": b, "seq_len": t,
               "step_s": sec, "tokens_per_s": b * t / sec, "flops": flops, "peak_fraction": flops / sec / peak,
               "first_s": first}
        log(f"[bench train] {name}: {row['tokens_per_s']:,.0f} tokens/s ({1e3 * sec:.1f} ms/step), "
            f"{100 * row['peak_fraction']:.1f}% of the matmul peak")
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    lines = [f"Measured {result['date']} on {result['cpu']} ({result['cores']} cores), jax {result['jax']}, "
             f"`{result['command']}`; best of {result['reps']} repeats after a first call that compiles.", "",
             "**Sweep**: 16 Mamba-2 LMs (4 learning rates x 4 gate offsets, recall task) trained by one vmapped "
             "program vs one after another, the same steps from the same states.", "",
             "| models | params each | batch x length | steps | one vmapped program | 16 runs one after another | "
             "speed-up | speed-up incl. compilation |", "|---|---|---|---|---|---|---|---|"]
    for r in result["sweep"]:
        lines.append(f"| {r['name']} | {r['params_per_model']:,} | {r['batch']} x {r['seq_len']} | {r['steps']} | "
                     f"{r['sweep_s']:.3f} s | {r['sequential_s']:.3f} s | **{r['speedup']:.1f}×** | "
                     f"{r['speedup_first']:.1f}× |")
    k = result["split"][0]["replicas"] if result.get("split") else 16
    lines += ["", f"Where the time goes (small size; ms per replica: one model, {k} vmapped, {k} one after another in "
              f"one program, {k} folded into one call's batch; × one in brackets):", "",
              "| part | one | vmapped | lax.map | folded into the batch |", "|---|---|---|---|---|"]
    for r in result.get("split", []):
        cell = lambda s: "–" if s is None else f"{1e3 * s:.2f} ({s / r['one_s']:.2f}×)"
        lines.append(f"| {r['part']} | {1e3 * r['one_s']:.2f} | {cell(r['vmapped_s'])} | {cell(r['mapped_s'])} | "
                     f"{cell(r['folded_s'])} |")
    if result.get("runs"):
        r = result["runs"]
        lines += ["", f"**End to end**: the small sweep's {r['replicas']} models as {r['replicas']} separate runs of "
                  f"`python -m ssmgate.main --program=train` one after another against one sweep run of the same grid "
                  f"({r['steps']} steps of {r['batch']} x {r['seq_len']} each, evaluation and checkpoints twice, each a "
                  "fresh process without a compilation cache; every run's final loss within "
                  f"{r['max_rel_loss_diff']:.1e} of its sweep replica's):", "",
                  "| runs | one after another | one sweep run | speed-up | a separate run (its training loop) | "
                  "the sweep run's training loop |", "|---|---|---|---|---|---|",
                  f"| {r['replicas']} | {r['sequential_s']:.1f} s | {r['sweep_s']:.1f} s | **{r['speedup']:.1f}×** | "
                  f"{r['run_s_mean']:.1f} s ({r['run_loop_s_mean']:.1f} s) | {r['sweep_loop_s']:.1f} s |"]
    lines += ["",
              f"**Training throughput** (forward + backward + AdamW, float32; batch {THROUGHPUT_TASK['batch']}, "
              f"length {THROUGHPUT_TASK['seq_len']}, 4 layers, d_model 256; matmul peak "
              f"{result['matmul_peak_flops'] / 1e9:.1f} GFLOP/s):", "",
              "| model | params | ms / step | tokens/s | model GFLOP / step | % of matmul peak | × floor |",
              "|---|---|---|---|---|---|---|"]
    for r in result["throughput"]:
        lines.append(f"| {r['model']} | {r['params']:,} | {1e3 * r['step_s']:.1f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['flops'] / 1e9:.2f} | {100 * r['peak_fraction']:.1f} | {1 / r['peak_fraction']:.1f} |")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    reps = max(1, min(FLAGS.reps, 3))
    peak = measure_matmul_flops()
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu_name(), "cores": os.cpu_count(), "jax": jax.__version__,
              "command": "python -m ssmgate.bench " + " ".join(sys.argv[1:]), "reps": reps,
              "matmul_peak_flops": peak, "sweep": [dict(bench_sweep(FLAGS.train_steps, reps, cfg, task), name=name)
                        for name, (cfg, task) in SWEEP_SIZES.items()],
              "split": bench_split(reps),
              "throughput": bench_throughput(max(2, FLAGS.train_steps // 4), reps, peak),
              "runs": (cli_runs.bench_runs(SWEEP_MODEL, SWEEP_TASK, SWEEP_LRS, SWEEP_OFFSETS, FLAGS.run_steps)
                       if FLAGS.run_steps else None)}
    print(markdown(result))
    write_result(result, markdown(result), "runs/bench/train.json", "train")
