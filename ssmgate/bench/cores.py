"""Core benchmark: core x algorithm x {forward, forward+backward}.

For each row it reports tokens/s, the speed-up over the `sequential` reference, the relative error
against a float64 run of the sequential reference, the algorithm's FLOP count and the fraction of
this machine's measured matmul FLOP/s it reaches (1 / that fraction = how many times the FLOP floor
the run takes). Prints a table and writes JSON. `--write_auto_table` also measures every size class
of `algorithm="auto"` and writes ssmgate/cores/auto_table.json for this backend.
"""
from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from ssmgate.cores import auto, registry

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "runs/bench/cores.json", "Where to write the JSON results.")
flags.DEFINE_list("shape", ["2", "2048", "8", "64", "64", "1", "16"], "b,t,h,p,n,g,r of the benchmark inputs.")
flags.DEFINE_list("core", list(registry.benchmarked()), "Cores to benchmark (those of ssmgate/cores/registry.py "
                  "with a FLOP model).")
flags.DEFINE_list("chunk_sizes", ["16", "32", "64", "128"], "Chunk sizes tried for the chunked scalar_decay and rotation.")
flags.DEFINE_list("damped_chunk_sizes", ["4", "8", "16"], "Chunk sizes tried for a core whose chunked form costs "
                  "O(chunk^2) per chunk (the damped core's transports), so they are shorter.")
flags.DEFINE_integer("reps", 5, "Timed repetitions per row (the minimum is reported).", lower_bound=1)
flags.DEFINE_float("max_seconds", 20.0, "Stop repeating a row once this much time was spent on it.", lower_bound=0.0)
flags.DEFINE_bool("write_auto_table", False, "Measure the auto size classes and write the auto table.")
flags.DEFINE_string("report", None, "Markdown file to write this run's tables to (overwritten).")
flags.DEFINE_string("docs", None, "Markdown file whose block between the markers "
                    "'<!-- bench:cores -->' and '<!-- /bench:cores -->' (with --backend=gpu|tpu: "
                    "'bench:device') is replaced by this run's tables.")
flags.DEFINE_enum("backend", "cpu", ["cpu", "gpu", "tpu"],
                  "cpu: this benchmark (sequential, associative, chunked; pallas only interprets on CPU). "
                  "gpu|tpu: the Pallas device benchmark of ssmgate/bench/device.py (checks on the device, "
                  "pallas vs chunked vs associative at --shape, default DEVICE_SHAPE); run by launch/device_bench.sh.")

# Mamba-2-130M-like (24 heads of 64 x 128, one group; rotation turns half the state's pairs)
DEVICE_SHAPE = (8, 2048, 24, 64, 128, 1, 32)


def cpu_algorithms(core: str) -> tuple[str, ...]:
    """What the CPU benchmark times for a core: every exact algorithm but the Pallas kernel (which only
    interprets on CPU), and `auto` where ssmgate.cores.auto knows the core."""
    exact = tuple(a for a in registry.get(core).algorithms if a != "pallas")
    return exact + (("auto",) if core in auto.FALLBACK else ())

# Size classes of the auto table: (max_t, the t measured for it); None = no upper bound.
AUTO_CLASSES = ((32, 32), (256, 256), (1024, 1024), (None, 2048))
# Width classes: (max per-head state size p·n, the (b, h, p, n) measured for it); None = no upper
# bound, measured at the benchmark's --shape. The narrow class is the state of the P1 CPU-scale
# models (4 heads x 16 x 16, batch 32), whose best chunk differs from a 64 x 64 state's.
AUTO_WIDTHS = ((512, (32, 4, 16, 16)), (None, None))


def _draw(rng, draw: str, size: tuple, n: int):
    """One input's values (registry.DRAWS): the ranges a trained Mamba-2/3 layer sees."""
    if draw == "normal":
        return rng.normal(size=size)
    if draw == "normal_over_sqrt_n":
        return rng.normal(size=size) / np.sqrt(n)
    if draw == "log_uniform_dt":   # dt in [1e-3, 1e-1]
        return np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), size=size))
    if draw in ("minus_uniform_1_16", "uniform_1_16"):   # decay rates A in [-16, -1]
        return (-1 if draw.startswith("minus") else 1) * rng.uniform(1.0, 16.0, size=size)
    if draw == "pi_tanh_normal":
        return np.pi * np.tanh(rng.normal(size=size))
    if draw == "sigmoid_normal":
        return 1.0 / (1.0 + np.exp(-rng.normal(size=size)))
    raise ValueError(f"unknown draw {draw!r}; expected one of {registry.DRAWS}")


def _shape(axes: str, b, t, h, p, n, g, r, rank) -> tuple:
    sizes = dict(b=b, t=t, h=h, p=p, n=n, g=g, r=r, k=rank)
    return tuple(sizes[a] for a in axes)


def make_inputs(core: str, b: int, t: int, h: int, p: int, n: int, g: int, r: int, seed: int = 0,
                rank: int = 4) -> dict:
    """Float32 inputs of `core` (ssmgate.cores.registry) at these sizes, drawn in the registry's order."""
    rng = np.random.default_rng(seed)
    return {i.name: jnp.asarray(_draw(rng, i.draw, _shape(i.axes, b, t, h, p, n, g, r, rank), n), jnp.float32)
            for i in registry.get(core).inputs}


HALF_INPUTS = ("x", "B", "C")   # the inputs of a bf16 model in bf16; dt, A, theta, trap, D stay float32


def input_structs(core: str, b: int, t: int, h: int, p: int, n: int, g: int, r: int, dtype=jnp.float32,
                  rank: int = 4, sharding=None) -> dict:
    """The shapes and dtypes of `core_fn(core, ...)`'s inputs (HALF_INPUTS in `dtype`), for lowering and
    compiling without data; rotation_mimo's x, B, C carry a rank axis of `rank`."""
    return {i.name: jax.ShapeDtypeStruct(_shape(i.axes, b, t, h, p, n, g, r, rank),
                                         dtype if i.name in HALF_INPUTS else jnp.float32, sharding=sharding)
            for i in registry.get(core).inputs}


def core_fn(core: str, algorithm: str, chunk_size=None):
    """f(inputs) -> (y, final_state) for one core/algorithm, with the benchmark's fixed options."""
    return registry.get(core).call(algorithm, chunk_size)


def flop_count(core: str, algorithm: str, chunk, b, t, h, p, n, g, r) -> float:
    """The core's forward FLOPs (its registry entry's model)."""
    c = registry.get(core)
    if c.flops is None:
        raise ValueError(f"core {core!r} has no FLOP model in ssmgate/cores/registry.py")
    return c.flops(algorithm, chunk, b, t, h, p, n, g, r)


def _cpu_name() -> str:
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else (platform.processor() or platform.machine())


def _block(tree):
    return jax.block_until_ready(tree)


def time_call(fn, args, reps: int, max_seconds: float) -> float:
    """Best wall time of `reps` calls after one warm-up (compile) call."""
    _block(fn(args))
    best, spent = float("inf"), 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        _block(fn(args))
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
        if spent > max_seconds:
            break
    return best


def measure_matmul_flops(size: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of a float32 size x size matmul: the machine's practical FLOP ceiling."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), jnp.float32)
    mm = jax.jit(lambda m: m @ m)
    return 2.0 * size**3 / time_call(mm, a, reps, 30.0)


def reference_outputs(core: str, inputs: dict):
    """The sequential algorithm in float64: the float64 reference (tests hold it to numpy loops)."""
    with jax.enable_x64(True):
        i64 = {k: jnp.asarray(np.asarray(v), jnp.float64) for k, v in inputs.items()}
        y, _ = jax.jit(core_fn(core, "sequential"))(i64)
        return np.asarray(y)


def relative_error(y, ref) -> float:
    return float(np.max(np.abs(np.asarray(y, np.float64) - ref)) / np.max(np.abs(ref)))


def forward_backward(fn, inputs):
    """jit(grad) of <y, w> with a fixed random cotangent w, w.r.t. every float input."""
    y, _ = jax.eval_shape(fn, inputs)
    w = jnp.asarray(np.random.default_rng(1).normal(size=y.shape), jnp.float32)
    return jax.jit(jax.grad(lambda i: jnp.vdot(fn(i)[0], w)))


def bench_core(core: str, shape: tuple, peak: float, chunk_sizes, reps, max_seconds, log=print) -> list[dict]:
    """Rows for every algorithm (every chunk size in chunk_sizes[core]) and `auto`, forward and
    forward+backward."""
    b, t, h, p, n, g, r = shape
    inputs = make_inputs(core, *shape)
    ref = reference_outputs(core, inputs)
    rows, seq_time = [], {}
    configs = [(a, c) for a in cpu_algorithms(core) for c in (chunk_sizes[core] if a == "chunked" else [None])]
    for algorithm, chunk in configs:
        fn = core_fn(core, algorithm, chunk)
        fwd = jax.jit(fn)
        err = relative_error(fwd(inputs)[0], ref)
        flops = _auto_flops(core, shape) if algorithm == "auto" else {
            "fwd": flop_count(core, algorithm, chunk, *shape), "fwd+bwd": 3 * flop_count(core, algorithm, chunk, *shape)}
        for mode, f in (("fwd", fwd), ("fwd+bwd", forward_backward(fn, inputs))):
            sec = time_call(f, inputs, reps, max_seconds)
            if algorithm == "sequential":
                seq_time[mode] = sec
            row = {"core": core, "algorithm": algorithm, "chunk": chunk, "mode": mode, "seconds": sec,
                   "tokens_per_s": b * t / sec, "speedup_vs_sequential": seq_time[mode] / sec,
                   "rel_err": err, "flops": flops[mode], "peak_fraction": flops[mode] / sec / peak}
            rows.append(row)
            log(format_row(row))
    return rows


def _auto_flops(core, shape) -> dict:
    """FLOPs of what `auto` runs at this size: its forward choice; its training choice, x 3."""
    (f_alg, f_chunk), (t_alg, t_chunk) = auto.choose(core, shape[1], shape[3] * shape[4])
    return {"fwd": flop_count(core, f_alg, f_chunk, *shape), "fwd+bwd": 3 * flop_count(core, t_alg, t_chunk, *shape)}


HEADER = (f"{'core':13s} {'algorithm':12s} {'chunk':>5s} {'mode':8s} {'ms':>9s} {'Mtok/s':>8s} "
          f"{'x seq':>6s} {'rel err':>8s} {'GFLOP':>7s} {'peak %':>7s} {'x floor':>7s}")


def format_row(row: dict) -> str:
    chunk = "-" if row["chunk"] is None else str(row["chunk"])
    return (f"{row['core']:13s} {row['algorithm']:12s} {chunk:>5s} {row['mode']:8s} {row['seconds'] * 1e3:9.1f} "
            f"{row['tokens_per_s'] / 1e6:8.3f} {row['speedup_vs_sequential']:6.2f} {row['rel_err']:8.1e} "
            f"{row['flops'] / 1e9:7.2f} {100 * row['peak_fraction']:7.1f} {1 / row['peak_fraction']:7.1f}")


def markdown_tables(result: dict) -> str:
    """The run as markdown: the main table and, if measured, the auto table."""
    sh = result["shape"]
    lines = [f"Measured on `{result['device']}` ({result['cpu']}, {result['cores']} cores), jax {result['jax']}, "
             f"float32, b={sh['b']} t={sh['t']} h={sh['h']} p={sh['p']} n={sh['n']} g={sh['g']} r={sh['r']}; "
             f"matmul peak {result['matmul_peak_flops'] / 1e9:.1f} GFLOP/s. Command: `{result['command']}`.", "",
             "| core | algorithm | chunk | pass | ms | Mtok/s | × sequential | rel. err | GFLOP | % of peak | × floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['core']} | {r['algorithm']} | {r['chunk'] or '-'} | {r['mode']} | {r['seconds'] * 1e3:.1f} | "
                     f"{r['tokens_per_s'] / 1e6:.3f} | {r['speedup_vs_sequential']:.2f} | {r['rel_err']:.1e} | "
                     f"{r['flops'] / 1e9:.2f} | {100 * r['peak_fraction']:.1f} | {1 / r['peak_fraction']:.1f} |")
    measured = result.get("auto_table") or result.get("auto_table_in_use")
    if measured:
        when = "measured by this run" if "auto_table" in result else \
            "in use: ssmgate/cores/auto_table.json, measured by an earlier `--write_auto_table` run"
        lines += ["", f"`auto` table ({when}): fastest forward and fastest forward+backward per width class "
                  "(per-head state p·n) and size class (t); g, r as above; timings in ms, forward | forward+backward:",
                  "", "| core | p·n ≤ | t ≤ | measured b, h, p, n, t | forward | forward+backward | all timings |",
                  "|---|---|---|---|---|---|---|"]
        for core, classes in measured.items():
            for c in classes:
                timings = ", ".join(f"{e['algorithm']}{'/' + str(e['chunk_size']) if e['chunk_size'] else ''} "
                                    f"{e['fwd_seconds'] * 1e3:.1f} \\| {e['train_seconds'] * 1e3:.1f}"
                                    for e in c["timings"])
                ms = c.get("measured_shape") or sh
                lines.append(f"| {core} | {c.get('max_state') or '∞'} | {c['max_t'] or '∞'} | "
                             f"{ms['b']}, {ms['h']}, {ms['p']}, {ms['n']}, {c['measured_t']} | {_choice(c['forward'])} | "
                             f"{_choice(c['train'])} | {timings} |")
    return "\n".join(lines)


def update_docs(path: str, block: str, name: str = "cores") -> None:
    """Replaces the block between '<!-- bench:NAME -->' and '<!-- /bench:NAME -->' in `path`."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    p = pathlib.Path(path)
    text = p.read_text() if p.exists() else ""
    if start not in text or end not in text:
        raise SystemExit(f"--docs: {path} has no '{start}' ... '{end}' block to replace")
    head, rest = text.split(start, 1)
    p.write_text(head + start + "\n" + block + "\n" + end + rest.split(end, 1)[1])


def write_result(result: dict, block: str, default_out: str, docs_name: str, log=print) -> None:
    """A benchmark's last step: its JSON to --out (default_out unless given), its markdown block
    into --docs between the '<!-- bench:docs_name -->' markers when --docs is given."""
    out = pathlib.Path(FLAGS.out if FLAGS["out"].present else default_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out}")
    if FLAGS.docs:
        update_docs(FLAGS.docs, block, name=docs_name)
        log(f"updated {FLAGS.docs}")


def measure_auto_table(cores, base_shape, chunk_sizes, reps, max_seconds, log=print, algorithms=None) -> dict:
    """Per core, width class and size class, the fastest forward and the fastest forward+backward
    (algorithm, chunk) on this backend among algorithms[core] (default: the exact ones of
    `cpu_algorithms`), with every timing behind the choice."""
    algorithms = algorithms or {c: tuple(a for a in cpu_algorithms(c) if a != "auto") for c in cores}
    table = {}
    for core in cores:
        classes = []
        for max_state, measured in AUTO_WIDTHS:
            b, _, h, p, n, g, r = base_shape
            if measured is not None:
                b, h, p, n = measured
                r = min(r, n // 2)
            for max_t, t in AUTO_CLASSES:
                inputs = make_inputs(core, b, t, h, p, n, g, r)
                timings = []
                for algorithm in algorithms[core]:
                    for chunk in (chunk_sizes[core] if algorithm in ("chunked", "pallas") else [None]):
                        fn = core_fn(core, algorithm, chunk)
                        timings.append({"algorithm": algorithm, "chunk_size": chunk,
                                        "fwd_seconds": time_call(jax.jit(fn), inputs, reps, max_seconds),
                                        "train_seconds": time_call(forward_backward(fn, inputs), inputs, reps,
                                                                   max_seconds)})
                entry = {"max_state": max_state, "max_t": max_t, "measured_t": t,
                         "measured_shape": {"b": b, "h": h, "p": p, "n": n}}
                for kind in ("fwd", "train"):
                    best = min(timings, key=lambda e: e[f"{kind}_seconds"])
                    entry["forward" if kind == "fwd" else "train"] = {"algorithm": best["algorithm"],
                                                                       "chunk_size": best["chunk_size"]}
                entry["timings"] = timings
                log(f"auto {core:13s} p*n<={max_state} t<={max_t}: forward {_choice(entry['forward'])}, "
                    f"train {_choice(entry['train'])}; "
                    + ", ".join(f"{e['algorithm']}/{e['chunk_size']}={e['fwd_seconds'] * 1e3:.1f}|"
                                f"{e['train_seconds'] * 1e3:.1f}ms" for e in timings))
                classes.append(entry)
        table[core] = classes
    return table


def _choice(c: dict) -> str:
    return c["algorithm"] + (f" (chunk {c['chunk_size']})" if c["chunk_size"] else "")


def main(argv) -> None:
    if len(argv) > 1:
        raise SystemExit(f"ssmgate.bench cores: unexpected arguments {argv[1:]}")
    try:
        shape = tuple(int(v) for v in FLAGS.shape)
        ssd_chunks = [int(c) for c in FLAGS.chunk_sizes]
        damped_chunks = [int(c) for c in FLAGS.damped_chunk_sizes]
    except ValueError as e:
        raise SystemExit(f"--shape, --chunk_sizes and --damped_chunk_sizes take integers: {e}")
    if min(ssd_chunks + damped_chunks, default=1) < 1:
        raise SystemExit(f"chunk sizes must be positive; got {FLAGS.chunk_sizes} and {FLAGS.damped_chunk_sizes}")
    unknown = [c for c in FLAGS.core if c not in registry.CORES]
    if unknown:
        raise SystemExit(f"--core: unknown {unknown}; expected some of {', '.join(registry.benchmarked())}")
    unmodelled = [c for c in FLAGS.core if c not in registry.benchmarked()]
    if unmodelled and FLAGS.backend == "cpu":
        raise SystemExit(f"--core: {unmodelled} have no FLOP model in ssmgate/cores/registry.py; the CPU "
                         f"benchmark times {', '.join(registry.benchmarked())}")
    chunk_sizes = {core: damped_chunks if registry.get(core).short_chunks else ssd_chunks for core in registry.CORES}
    if len(shape) != 7 or min(shape) < 1:
        raise SystemExit(f"--shape takes 7 positive integers b,t,h,p,n,g,r; got {FLAGS.shape}")
    log = lambda s: print(s, flush=True)
    if FLAGS.backend != "cpu":
        return _device_main(DEVICE_SHAPE if not FLAGS["shape"].present else shape, chunk_sizes, log)
    backend = jax.default_backend()
    peak = measure_matmul_flops()
    log(f"backend {backend} ({_cpu_name()}, {os.cpu_count()} cores); "
        f"measured float32 matmul peak {peak / 1e9:.1f} GFLOP/s; b,t,h,p,n,g,r = {shape}")
    log(HEADER)
    rows = []
    for core in FLAGS.core:
        rows += bench_core(core, shape, peak, chunk_sizes, FLAGS.reps, FLAGS.max_seconds, log)
    result = {"backend": backend, "device": str(jax.devices()[0]), "jax": jax.__version__,
              "cpu": _cpu_name(), "cores": os.cpu_count(), "command": " ".join(["python -m ssmgate.bench"] + sys.argv[1:]),
              "python": sys.version.split()[0], "matmul_peak_flops": peak,
              "shape": dict(zip("b t h p n g r".split(), shape)), "rows": rows}
    if FLAGS.write_auto_table:
        measured = measure_auto_table(FLAGS.core, shape, chunk_sizes, max(1, FLAGS.reps // 2), FLAGS.max_seconds, log)
        table = dict(auto.load_table())
        table[backend] = {**table.get(backend, {}), **measured}
        auto.TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n")
        auto.load_table.cache_clear()
        result["auto_table"] = measured
        log(f"wrote {auto.TABLE_PATH}")
    if "auto_table" not in result and backend in auto.load_table():
        result["auto_table_in_use"] = auto.load_table()[backend]
    if FLAGS.report:
        report = pathlib.Path(FLAGS.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("# Core benchmark\n\n" + markdown_tables(result) + "\n")
        log(f"wrote {report}")
    if FLAGS.docs:
        update_docs(FLAGS.docs, markdown_tables(result))
        log(f"updated {FLAGS.docs}")
    out = pathlib.Path(FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {out}")


def _device_main(shape, chunk_sizes, log) -> None:
    """--backend=gpu|tpu: ssmgate/bench/device.py, then (--write_auto_table) the auto classes with
    pallas among the candidates; JSON to --out, markdown to --report and --docs."""
    from ssmgate.bench import device

    command = " ".join(["python -m ssmgate.bench"] + sys.argv[1:])
    chunk = 64 if 64 in chunk_sizes["scalar_decay"] else chunk_sizes["scalar_decay"][0]   # the timed rows' chunk
    result = device.run(FLAGS.backend, shape, chunk, FLAGS.reps, FLAGS.max_seconds, command, log)
    cores = [c for c in FLAGS.core if c in device.DEVICE_ALGORITHMS]
    if FLAGS.write_auto_table:
        try:
            measured = measure_auto_table(cores, shape, chunk_sizes, max(1, FLAGS.reps // 2), FLAGS.max_seconds,
                                          log, algorithms=device.DEVICE_ALGORITHMS)
        except Exception as e:  # noqa: BLE001 - the measured rows above are still written
            log(f"auto table not measured: {e!r}")
        else:
            table = dict(auto.load_table())
            table[jax.default_backend()] = {**table.get(jax.default_backend(), {}), **measured}
            auto.TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n")
            auto.load_table.cache_clear()
            result["auto_table"] = measured
            log(f"wrote {auto.TABLE_PATH}")
    block = device.markdown(result)
    if FLAGS.report:
        report = pathlib.Path(FLAGS.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("# Device benchmark of the Pallas kernels\n\n" + block + "\n")
        log(f"wrote {report}")
    if FLAGS.docs:
        update_docs(FLAGS.docs, block, name="device")
        log(f"updated {FLAGS.docs}")
    out = pathlib.Path(FLAGS.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {out}")
    if not result["checks_passed"]:
        raise SystemExit("device checks FAILED (see the 'check FAIL' lines above)")
