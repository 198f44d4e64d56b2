"""A program's sharded training step compiled for a TPU slice without running it (`python -m ssmgate.aot`).

A program describes its step as a `TrainPlan`: the model, optimizer, replicas, loss and mesh it
passes to `run_experiment`, and its largest batch as shapes (no data is read: a paper's corpus
need not be here). `compile_plan` builds that run with `lm_runs.build_run` on the slice's
compile-only devices, exactly as a run on the pod would build it, lowers the jitted step with the
state's shardings and compiles it with the real XLA:TPU (and, for the cores' kernels, Mosaic)
compiler.

The compiled program's memory analysis is per device: arguments (the state and the batch),
outputs, the outputs that alias donated arguments (the new state reuses the old one's buffers),
and temporaries. What a device holds at the step's peak is arguments + outputs - aliased +
temporaries, compared with the device's HBM. The compiler's cost analysis gives FLOPs and HBM bytes
per device; their roofline (the slower of FLOPs at the peak rate and bytes at the HBM bandwidth) is
the step time reported as tokens/s and MFU. It is the compiler's estimate, not a measurement:
communication between chips is not in it, a Mosaic kernel's FLOPs are invisible to XLA's count
(its operands' bytes are counted), and XLA counts a loop's body once, so a step in microbatches
(--mesh_microbatches, ssmgate.train.step) reports k times its count.
"""
from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Callable

import jax

from ssmgate.cores import auto
from ssmgate.cores.pallas import ssd
from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.train import lm_runs, mesh as meshlib, optim, topology
from ssmgate.train.throughput import model_flops


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What a program's training step is made of, without its data."""
    model: ModelCfg
    optim: optim.OptimCfg
    replicas: tuple
    loss: Callable
    mesh: meshlib.MeshCfg
    batch: Callable[[], Any]   # () -> one replica's largest batch as jax.ShapeDtypeStructs
    force_sweep: bool = False

    def engine(self) -> dict:
        """The arguments of `run_experiment` that make the step (the program adds its data)."""
        return dict(model=self.model, optim=self.optim, replicas=self.replicas, loss=self.loss, mesh_cfg=self.mesh,
                    force_sweep=self.force_sweep)


def _never(seed, k):
    raise AssertionError("a compile-only run reads no batch")


def _leading(struct, n: int):
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct((n, *s.shape), s.dtype), struct)


def compile_plan(plan: TrainPlan, topo: topology.Topology) -> dict:
    """Compiles the plan's step for `topo`; the table's numbers (per device unless named otherwise).
    A mesh the slice's devices cannot hold, or a batch its data axis does not split, is a ValueError."""
    devices = topology.devices(topo.libtpu_name)
    mesh = meshlib.make_mesh(plan.mesh, devices)
    one = plan.batch()
    rows, seq_len = one.inputs.shape[:2]
    meshlib.check_batch(rows, mesh.shape["data"], plan.mesh.microbatches)
    with auto.for_backend("tpu"), ssd.partitioned_over(len(devices)):
        built = lm_runs.build_run(plan.model, plan.optim, plan.replicas, loss=plan.loss, eval_batches=(), mesh=mesh,
                                  mode=plan.mesh.params, force_sweep=plan.force_sweep, host_sample=_never,
                                  microbatches=plan.mesh.microbatches, remat=plan.mesh.remat,
                                  loss_chunk=plan.mesh.loss_chunk)
        n_rep = len(plan.replicas)
        batch = _leading(one, n_rep) if built.is_sweep else one
        start = time.perf_counter()
        lowered = built.step.lower(built.abstract, batch)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            compiled, refusal = None, " ".join(str(e).split())
        compile_s = time.perf_counter() - start
    hbm, peak, bandwidth = topo.per_device(len(devices))
    tokens = rows * seq_len * n_rep
    head = {
        "topology": topo.name, "libtpu_topology": topo.libtpu_name, "generation": topo.generation,
        "devices": len(devices), "hosts": len({d.process_index for d in devices}), "chips": topo.chips,
        "mesh": {k: int(v) for k, v in mesh.shape.items()}, "params": presets.param_count(plan.model),
        "replicas": n_rep, "batch_rows": int(rows), "seq_len": int(seq_len), "tokens_per_step": int(tokens),
        "hbm_bytes": int(hbm), "compile_s": compile_s, "microbatches": plan.mesh.microbatches}
    if compiled is None:  # the compiler's own verdict: the program cannot be placed in HBM
        return {**head, "fits": False, "refusal": refusal, "temp_bytes": _stated_bytes(refusal)}
    useful = model_flops(plan.model, rows, seq_len) * n_rep
    # XLA counts a loop's body once: with microbatches, the step's gradient loop runs it k times (the
    # optimizer's update outside it is then over-counted k times; it is small beside the model's).
    return {**head, **measure(compiled, hbm=hbm, peak=peak, bandwidth=bandwidth, tokens=tokens, useful_flops=useful,
                              devices=len(devices), loops=plan.mesh.microbatches)}


def measure(compiled, *, hbm: int, peak: float, bandwidth: float, tokens: int, useful_flops: float,
            devices: int = 1, loops: int = 1) -> dict:
    """A compiled program's memory per device (held at peak = arguments + outputs - aliased +
    temporaries; it fits when that and the program's code are within `hbm`, the HBM the compiler can
    use, ssmgate.train.topology), the compiler's FLOPs and bytes per device (times `loops` for a
    loop's body, which XLA counts once) and their roofline at `peak` FLOP/s and `bandwidth` bytes/s
    a device: the step time, as tokens/s and as MFU (`useful_flops` over the `devices`' peak)."""
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    held = (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)
    flops, moved = loops * float(cost.get("flops", 0.0)), loops * float(cost.get("bytes accessed", 0.0))
    step_s = max(flops / peak, moved / bandwidth)
    sizes = {"hbm_bytes": hbm, "held_bytes": int(held), "code_bytes": int(memory.generated_code_size_in_bytes)}
    return {
        "argument_bytes": int(memory.argument_size_in_bytes), "output_bytes": int(memory.output_size_in_bytes),
        "alias_bytes": int(memory.alias_size_in_bytes), "temp_bytes": int(memory.temp_size_in_bytes),
        "code_bytes": sizes["code_bytes"], "held_bytes": sizes["held_bytes"], "fits": _spare(sizes) >= 0,
        "xla_flops": flops, "xla_bytes": moved, "estimated_step_s": step_s,
        "estimated_tokens_per_s": tokens / step_s if step_s > 0 else None,
        "estimated_mfu": useful_flops / (step_s * peak * devices) if step_s > 0 else None,
        "mosaic_kernels": compiled.as_text().count('custom_call_target="tpu_custom_call"'),
    }


def _stated_bytes(message: str) -> int | None:
    """The temporaries XLA's refusal states ('... HLO temporaries (1.51T) exceeds ...'), in bytes."""
    m = re.search(r"temporaries \(([0-9.]+)([KMGTP]?)\)", message)
    return None if m is None else int(float(m.group(1)) * 1024 ** " KMGTP".index(m.group(2) or " "))


def table(r: dict) -> str:
    """The report of `compile_plan` as one table, and the shortfall in one line where it does not fit."""
    gib = lambda b: (f"{b / 2**40:.2f} TiB" if b >= 2**40 else f"{b / topology.GIB:.2f} GiB" if b >= topology.GIB
                     else f"{b / 2**20:.1f} MiB")
    reps = f" x {r['replicas']} replicas" if r["replicas"] > 1 else ""
    forward = r.get("kind") == "forward"   # ssmgate.train.compile_forward's report
    rows = [
        ("topology", f"{r['topology']} ({r['libtpu_topology']}): {r['chips']} chips, "
                     + ("one device of the slice (the evaluation is not sharded)" if forward else
                        f"{r['devices']} devices, {r['hosts']} host{'s' * (r['hosts'] != 1)}")),
        ("mesh", " x ".join(f"{k} {v}" for k, v in r["mesh"].items())),
        ("parameters", f"{r['params']:,}{reps}"),
        ("forward piece", f"{r['batch_rows']} windows x {r['seq_len']} tokens carrying the cache, for "
                          f"{len(r['models'])} models: {', '.join(r['models'])} (the largest below)") if forward else
        ("step", f"{r['batch_rows']} rows x {r['seq_len']} tokens{reps}"
                 + (f" in {r['microbatches']} microbatches" if r.get("microbatches", 1) > 1 else "")),
        ("compile time", f"{r['compile_s']:.1f} s"),
    ]
    if "refusal" in r:
        need = "" if r["temp_bytes"] is None else f"temporaries alone {gib(r['temp_bytes'])}, "
        rows.append(("held at peak / device", f"{need}more than the {gib(r['hbm_bytes'])} of HBM the compiler can "
                                              "use: does not fit"))
    else:
        est = r["estimated_step_s"]
        k = r.get("microbatches", 1)
        loop_note = f" ({k} x its count of the microbatch loop's body)" if k > 1 else ""
        kernel_note = (f" (and {r['mosaic_kernels']} Mosaic kernel calls it does not count)"
                       if r["mosaic_kernels"] else "")
        rows += [
            ("arguments / device", gib(r["argument_bytes"])),
            ("temporaries / device", gib(r["temp_bytes"])),
            ("outputs / device", f"{gib(r['output_bytes'])} ({gib(r['alias_bytes'])} in donated arguments)"),
            ("program code / device", gib(r["code_bytes"])),
            ("held at peak / device", f"{gib(r['held_bytes'])} and the code, of the {gib(r['hbm_bytes'])} of HBM the "
                                      f"compiler can use: {'fits' if r['fits'] else 'does not fit'}"
                                      + (f" ({gib(_spare(r))} spare)" if r["fits"] else "")),
            ("compiler FLOPs / device", f"{r['xla_flops']:.3e}" + loop_note + kernel_note),
            ("compiler's estimate", "no FLOPs or bytes counted" if not est else
             f"{est * 1e3:.1f} ms a {'piece' if forward else 'step'}, {r['estimated_tokens_per_s']:,.0f} tokens/s, MFU {r['estimated_mfu']:.1%} "
             "(roofline of its FLOPs and bytes; no communication; not a measurement)"),
        ]
    width = max(len(k) for k, _ in rows)
    lines = [f"  {k.ljust(width)}  {v}" for k, v in rows]
    if "refusal" in r:
        lines.append(f"does not fit: the compiler refused the step for a {r['generation']} device "
                     f"({gib(r['hbm_bytes'])} of HBM): {r['refusal']}")
    elif not r["fits"]:
        lines.append(f"does not fit: {gib(r['held_bytes'])} held per device at the {'piece' if forward else 'step'}'s peak, "
                     f"{gib(-_spare(r))} more (with the program's code) than the {gib(r['hbm_bytes'])} of HBM "
                     f"the compiler can use on a {r['generation']} device")
    return "\n".join(lines)


def _spare(r: dict) -> int:
    """HBM left on a device at the program's peak: usable - held - code (negative: the shortfall)."""
    return r["hbm_bytes"] - r["held_bytes"] - r["code_bytes"]
