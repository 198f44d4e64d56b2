"""The compiler's estimates for TPU: kernel vs chunked, compiled for TPU topologies on any machine.

With libtpu installed, `jax.experimental.topologies` describes a TPU slice without one, and
`jit(...).lower(...).compile()` runs the real XLA:TPU and Mosaic compilers for it. For each
generation, core and algorithm this benchmark compiles the forward pass and the forward+backward
at a model's shape and reports what the compiler estimates: XLA's FLOP count, the bytes it expects
the program to move through HBM, and the program's temporary HBM. A Mosaic kernel is opaque to
XLA's FLOP count (its matmuls are the chunked form's, so the FLOPs are the same), but its operands
and results are counted as bytes. These are estimates, not timings: `auto` on TPU uses them
(ssmgate/cores/auto.py ESTIMATED) until a TPU measures the table.

`python -m ssmgate.bench tpu_estimate [--tpu_generations=v4,v5e,v5p,v6e] [--tpu_cores=scalar_decay,rotation]
[--tpu_shape=b,t,h,p,n,g,r] [--tpu_algorithms=pallas/64,chunked/64,chunked/128] [--out] [--docs]`
(--docs replaces the block between '<!-- bench:tpu_estimate -->' markers).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from absl import flags

from ssmgate.bench.cores import core_fn, input_structs, write_result
from ssmgate.cores import auto
from ssmgate.train import topology

FLAGS = flags.FLAGS
# Topology names libtpu 0.0.42.1 accepts ('<generation>:<chips per axis>', one host's chips), per generation.
GENERATIONS = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2"}
flags.DEFINE_list("tpu_generations", sorted(GENERATIONS), f"TPU generations to compile for: {sorted(GENERATIONS)}.")
flags.DEFINE_list("tpu_cores", ["scalar_decay", "rotation"], "Cores compiled (scalar_decay, rotation).")
# Mamba-2-130M's heads (24 x 64 x 128, one group) at the longest length whose kernel fits VMEM.
flags.DEFINE_list("tpu_shape", ["8", "1024", "24", "64", "128", "1", "32"], "b,t,h,p,n,g,r compiled for.")
flags.DEFINE_list("tpu_algorithms", ["pallas/64", "chunked/64", "chunked/128"], "algorithm/chunk pairs compared.")


def tpu_device(generation: str):
    """One chip of a `generation` slice (a compile-only device: nothing runs on it)."""
    if generation not in GENERATIONS:
        raise ValueError(f"unknown TPU generation {generation!r}; expected one of {sorted(GENERATIONS)}")
    return topology.devices(GENERATIONS[generation])[0]


def estimate(generation: str, core: str, algorithm: str, chunk: int, shape, dtype=jnp.bfloat16) -> list[dict]:
    """The compiler's estimates of the forward pass and the forward+backward (traced for TPU)."""
    structs = input_structs(core, *shape, dtype,
                            sharding=jax.sharding.SingleDeviceSharding(tpu_device(generation)))
    fn = core_fn(core, algorithm, chunk)
    # the gradient of a loss of y computed in the program (a fixed cotangent would be a constant in it)
    train = jax.jit(jax.grad(lambda i: jnp.sum(fn(i)[0].astype(jnp.float32) ** 2)))
    rows = []
    for direction, program in (("forward", jax.jit(fn)), ("forward+backward", train)):
        start = time.perf_counter()
        with auto.for_backend("tpu"):
            compiled = program.lower(structs).compile()
        cost, memory = compiled.cost_analysis(), compiled.memory_analysis()
        rows.append({"generation": generation, "core": core, "algorithm": algorithm, "chunk_size": chunk,
                     "direction": direction, "compile_seconds": time.perf_counter() - start,
                     "xla_flops": cost.get("flops"), "hbm_bytes": cost.get("bytes accessed"),
                     "temp_bytes": memory.temp_size_in_bytes,
                     "mosaic_kernels": compiled.as_text().count('custom_call_target="tpu_custom_call"')})
    return rows


def markdown(result: dict) -> str:
    b, t, h, p, n, g, r = result["shape"]
    lines = [f"Compiled with libtpu {result['libtpu']} for one chip (b {b}, t {t}, h {h}, p {p}, n {n}, g {g}, "
             f"r {r}; bf16 x/B/C). The compiler's estimates, not measurements; a Mosaic kernel's FLOPs are "
             "invisible to XLA (its matmuls are the chunked form's).", "",
             "| generation | core | algorithm | direction | Mosaic kernels | XLA FLOPs (G) | HBM bytes (GiB) | "
             "temporaries (MiB) | compile (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for e in result["rows"]:
        lines.append(f"| {e['generation']} | {e['core']} | {e['algorithm']}/{e['chunk_size']} | {e['direction']} | "
                     f"{e['mosaic_kernels']} | {e['xla_flops'] / 1e9:.2f} | {e['hbm_bytes'] / 2**30:.2f} | "
                     f"{e['temp_bytes'] / 2**20:.0f} | {e['compile_seconds']:.1f} |")
    return "\n".join(lines)


def main(argv) -> None:
    if len(argv) > 1:
        raise SystemExit(f"ssmgate.bench tpu_estimate: unexpected arguments {argv[1:]}")
    unknown = [x for x in FLAGS.tpu_generations if x not in GENERATIONS]
    if unknown:
        raise SystemExit(f"--tpu_generations: unknown {unknown}; expected some of {sorted(GENERATIONS)}")
    bad_cores = [c for c in FLAGS.tpu_cores if c not in ("scalar_decay", "rotation")]
    try:
        shape = tuple(int(v) for v in FLAGS.tpu_shape)
        pairs = [(a.split("/")[0], int(a.split("/")[1])) for a in FLAGS.tpu_algorithms]
    except (ValueError, IndexError):
        raise SystemExit(f"--tpu_shape takes 7 integers b,t,h,p,n,g,r and --tpu_algorithms algorithm/chunk pairs; "
                         f"got {FLAGS.tpu_shape}, {FLAGS.tpu_algorithms}") from None
    if bad_cores or len(shape) != 7 or any(a not in ("pallas", "chunked") for a, _ in pairs):
        raise SystemExit(f"--tpu_cores takes scalar_decay/rotation, --tpu_shape 7 integers, --tpu_algorithms "
                         f"pallas|chunked/chunk; got {FLAGS.tpu_cores}, {FLAGS.tpu_shape}, {FLAGS.tpu_algorithms}")
    from importlib.metadata import version
    result = {"libtpu": version("libtpu"), "shape": shape, "rows": []}
    for generation in FLAGS.tpu_generations:
        for core in FLAGS.tpu_cores:
            for algorithm, chunk in pairs:
                result["rows"] += estimate(generation, core, algorithm, chunk, shape)
                print("\n".join(markdown({**result, "rows": result["rows"][-2:]}).splitlines()[-2:]), flush=True)
    print(markdown(result))
    write_result(result, markdown(result), "runs/bench/tpu_estimate.json", "tpu_estimate")
