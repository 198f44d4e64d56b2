"""`python -m ssmgate.aot`: a program's training step compiled for a TPU slice by the real XLA:TPU
compiler on this CPU-only machine (ssmgate.train.compile_step, ssmgate.train.topology).

The default suite compiles a small step for one multi-host slice and runs the command on a quick
flag file; every paper-scale flag file, at the topology its header names, is the slow matrix
(tests/train/test_paper_topologies.py)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from ssmgate import platform_env
from ssmgate.models.config import ModelCfg
from ssmgate.tasks import synthetic_lm
from ssmgate.train import compile_step, topology
from ssmgate.train.mesh import MeshCfg
from ssmgate.train.optim import OptimCfg
from ssmgate.train.sweep import Replica

needs_libtpu = pytest.mark.skipif(not platform_env.libtpu_installed(), reason="needs libtpu (make venv installs it)")
WARNINGS = ("ignore:ssmgate.cores. no measured", "ignore:pallas_ssd. the gpu and tpu kernels",
            "ignore:Error reading persistent compilation cache entry")


@pytest.mark.parametrize("name,libtpu", [("v5p-8", "v5p:2x2x1"), ("v5p-16", "v5p:2x2x2"), ("v4-32", "v4:2x2x4"),
                                         ("v5e-16", "v5e:4x4"), ("v6e-64", "v6e:8x8"), ("v5litepod-4", "v5e:2x2"),
                                         ("v5e:2x4", "v5e:2x4")])
def test_slice_names_map_to_libtpu_topologies(name, libtpu):
    assert topology.parse(name).libtpu_name == libtpu


@pytest.mark.parametrize("name,message", [("v5p-6", "counts TensorCores"), ("v5e-3", "counts chips"),
                                          ("v7-8", "unknown topology"), ("v5e:2x2x1", "takes 2 axes"),
                                          ("tpu", "unknown topology")])
def test_bad_slice_names_say_what_is_accepted(name, message):
    with pytest.raises(ValueError, match=message):
        topology.parse(name)


def _plan(block="mamba2", batch=16, seq_len=64, vocab=256, replicas=1, mesh=MeshCfg(params="fsdp")):
    model = ModelCfg(block=block, vocab_size=vocab, d_model=128, n_layers=2, d_state=16, headdim=32, expand=2,
                     dtype="bfloat16")
    task = synthetic_lm.SyntheticCfg(task="copy", batch=batch, seq_len=seq_len, vocab_size=vocab)
    reps = tuple(Replica(seed=s, lr=1e-3) for s in range(replicas))
    return compile_step.TrainPlan(model, OptimCfg(lr=1e-3, total_steps=10), reps, synthetic_lm.lm_loss, mesh,
                                  batch=lambda: jax.eval_shape(lambda: synthetic_lm.sample(jax.random.PRNGKey(0), task)),
                                  force_sweep=replicas > 1)


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_a_step_compiles_for_a_multi_host_slice_and_reports_its_memory():
    r = compile_step.compile_plan(_plan(), topology.parse("v5e-16"))
    assert (r["devices"], r["hosts"], r["mesh"]) == (16, 4, {"replica": 1, "data": 16, "model": 1})
    assert r["fits"] and 0 < r["held_bytes"] + r["code_bytes"] < r["hbm_bytes"] == topology.CHIPS["v5e"].usable_bytes
    assert r["held_bytes"] == r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
    assert r["code_bytes"] > 0  # the program's code lives in HBM too
    assert r["alias_bytes"] > 0  # the state is donated: the new state reuses its buffers
    assert r["xla_flops"] > 0 and 0 < r["estimated_mfu"] < 1
    # partitioned over 16 devices, the kernel (a custom call XLA cannot partition) gives way to the chunked form
    assert r["mosaic_kernels"] == 0
    text = compile_step.table(r)
    assert "4 hosts" in text and "fits" in text and "not a measurement" in text


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_a_sweep_compiles_with_its_replicas_on_the_replica_axis():
    r = compile_step.compile_plan(_plan(replicas=4, mesh=MeshCfg(replica=4, params="replicated")),
                                  topology.parse("v5e-4"))
    assert r["mesh"] == {"replica": 4, "data": 1, "model": 1}
    assert r["replicas"] == 4 and r["tokens_per_step"] == 4 * 16 * 64


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_a_replica_axis_that_does_not_divide_the_sweep_is_refused_by_name():
    with pytest.raises(ValueError, match=r"--mesh_replica=2 does not divide the sweep's 3 replicas .* --mesh_data"):
        compile_step.compile_plan(_plan(replicas=3, mesh=MeshCfg(replica=2, params="replicated")),
                                  topology.parse("v5e-4"))


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_microbatches_shrink_the_temporaries_at_the_same_counted_work():
    one, four = (compile_step.compile_plan(_plan(batch=32, seq_len=256, mesh=MeshCfg(params="fsdp", microbatches=k)),
                                           topology.parse("v5e-4")) for k in (1, 4))
    assert four["microbatches"] == 4 and "in 4 microbatches" in compile_step.table(four)
    assert four["temp_bytes"] < 0.5 * one["temp_bytes"]
    assert four["xla_flops"] == pytest.approx(one["xla_flops"], rel=0.2)  # the loop's body counted 4 times


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_activations_stay_split_over_the_data_axis():
    """With FSDP weights and a tied head, GSPMD left to itself gathered the batch: each device computed the
    global batch's logits, and the temporaries grew with the slice. Pinned (mesh.activation_constraint)
    they shrink as the data axis grows at a fixed global batch, below one global batch's logits."""
    small, large = (compile_step.compile_plan(_plan(vocab=8192, batch=16, seq_len=256), topology.parse(t))
                    for t in ("v5e-4", "v5e-16"))
    global_logits = 16 * 256 * 8192 * 4
    assert large["temp_bytes"] < 0.5 * small["temp_bytes"] < 0.25 * global_logits


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_remat_shrinks_the_temporaries_for_one_more_forward():
    plain, remat = (compile_step.compile_plan(_plan(batch=32, seq_len=256, mesh=MeshCfg(params="fsdp", remat=r)),
                                              topology.parse("v5e-4")) for r in (False, True))
    assert remat["temp_bytes"] < 0.8 * plain["temp_bytes"]
    assert plain["xla_flops"] < remat["xla_flops"] < 1.6 * plain["xla_flops"]


@needs_libtpu
@pytest.mark.filterwarnings(*WARNINGS)
def test_a_step_the_compiler_cannot_place_is_reported_as_not_fitting():
    """v5e has 16 GiB a chip; a row of 131,072 tokens a device with a 32k vocabulary has 16 GiB of float32
    log-probabilities alone."""
    r = compile_step.compile_plan(_plan(batch=4, seq_len=131072, vocab=32768),
                                  topology.parse("v5e-4"))
    assert not r["fits"]
    assert "does not fit" in compile_step.table(r).splitlines()[-1]


def test_the_table_names_the_shortfall():
    r = {"topology": "v5e-4", "libtpu_topology": "v5e:2x2", "generation": "v5e", "devices": 4, "hosts": 1, "chips": 4,
         "mesh": {"replica": 1, "data": 4, "model": 1}, "params": 1000, "replicas": 1, "batch_rows": 8,
         "seq_len": 16, "tokens_per_step": 128, "hbm_bytes": 16 * topology.GIB, "compile_s": 1.0,
         "argument_bytes": 2 * topology.GIB, "output_bytes": 2 * topology.GIB, "alias_bytes": 2 * topology.GIB,
         "temp_bytes": 18 * topology.GIB, "held_bytes": 20 * topology.GIB, "fits": False, "xla_flops": 1e12,
         "xla_bytes": 1e9, "estimated_step_s": 0.01, "estimated_tokens_per_s": 12800.0, "estimated_mfu": 0.5,
         "mosaic_kernels": 0, "code_bytes": 512 << 20}
    last = compile_step.table(r).splitlines()[-1]
    assert last.startswith("does not fit: 20.00 GiB held per device")
    assert "4.50 GiB more (with the program's code) than the 16.00 GiB of HBM the compiler can use" in last


def test_a_step_within_the_hbm_but_not_with_its_code_does_not_fit():
    measured = {"argument_bytes": 4 * topology.GIB, "output_bytes": 0, "alias_bytes": 0, "temp_bytes": topology.GIB}

    class Compiled:
        def memory_analysis(self):
            return type("M", (), {**{f"{k[:-6]}_size_in_bytes": v for k, v in measured.items()},
                                  "generated_code_size_in_bytes": 64 << 20})()

        def cost_analysis(self):
            return {"flops": 1e9, "bytes accessed": 1e9}

        def as_text(self):
            return ""

    hbm = 5 * topology.GIB + (32 << 20)
    r = compile_step.measure(Compiled(), hbm=hbm, peak=1e12, bandwidth=1e11, tokens=100, useful_flops=1e9)
    assert r["held_bytes"] == 5 * topology.GIB < hbm and not r["fits"]
    assert compile_step.measure(Compiled(), hbm=hbm + (32 << 20), peak=1e12, bandwidth=1e11, tokens=100,
                                useful_flops=1e9)["fits"]


@needs_libtpu
@pytest.mark.parametrize("generation,libtpu_name", [("v4", "v4:2x2x1"), ("v5e", "v5e:2x2"), ("v5p", "v5p:2x2x1"),
                                                    ("v6e", "v6e:2x2")])
def test_the_usable_hbm_is_what_the_compiler_states(generation, libtpu_name):
    """A program whose temporaries are twice a chip's HBM, on one device: XLA:TPU refuses it and states the
    HBM it can use ('exceeds available HBM (15.75G)', in GiB); ssmgate.train.topology's figure is that one."""
    device = topology.devices(libtpu_name)[0]
    n = topology.CHIPS[generation].hbm_bytes // 4
    x = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))

    def f(v):  # two arrays of the argument's size alive at once, besides it
        a = jnp.sin(v)
        b = jnp.cos(v) * a[::-1]
        return (a * b[::-1]).sum() + (b * a).sum()

    with pytest.raises(jax.errors.JaxRuntimeError) as refused:
        jax.jit(f).lower(x).compile()
    stated = re.search(r"available HBM \(([0-9.]+)G\)", str(refused.value))
    assert stated, str(refused.value)[:500]
    assert abs(float(stated.group(1)) * topology.GIB - topology.CHIPS[generation].usable_bytes) < 0.01 * topology.GIB


REPO = Path(__file__).resolve().parents[2]


def _aot(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ssmgate.aot", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@needs_libtpu
def test_the_command_compiles_a_flag_file_and_writes_its_numbers(tmp_path):
    out = tmp_path / "aot.json"
    p = _aot("--flagfile=experiments/p1/quick/kv_best_first.flags", "--topology=v5e-4", f"--aot_json={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "held at peak / device" in p.stdout and "fits" in p.stdout
    report = json.loads(out.read_text())
    assert report["program"] == "p1_kv" and report["fits"] and report["devices"] == 4


@needs_libtpu
def test_the_command_compiles_an_official_checkpoints_intervention_forwards(tmp_path):
    """An evaluation run (the official interventions' files) has no step: its window forwards compile,
    the native model's and each intervention's, with the shape of the checkpoint's config.json."""
    from tests.interventions import upstream_mamba3 as up
    config = up.make_config(dict(d_state=16, headdim=8), d_model=32, n_layer=2, vocab_size=258)
    ckpt = up.write_checkpoint(tmp_path / "ckpt", config, up.random_state_dict(config))
    out = tmp_path / "aot.json"
    p = _aot("--flagfile=experiments/p2/interventions_official_siso.flags", f"--lm_init_official={ckpt}",
             "--tokenizer=byte", "--lm_windows=4096", "--lm_bc_window=4096", "--lm_piece_len=1024", "--lm_window_batch=2",
             "--topology=v5e-4", f"--aot_json={out}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "evaluation's forward pass" in p.stdout and "2 windows x 1024 tokens carrying the cache" in p.stdout
    report = json.loads(out.read_text())
    assert report["kind"] == "forward" and report["fits"] and report["devices"] == 1
    assert set(report["models"]) == {"native", "phase_removal", "phase_reversal", "phase_shuffle",
                                     "decay_permutation", "remove_B", "remove_C", "remove_both"}
    assert report["held_bytes"] == max(m["held_bytes"] for m in report["models"].values()) > 0
    missing = _aot("--flagfile=experiments/p2/interventions_official_siso.flags", "--topology=v5e-4", timeout=120)
    assert missing.returncode == 2 and "the forward pass has the checkpoint's shape" in missing.stderr


@pytest.mark.parametrize("args,message", [
    (("--flagfile=experiments/p1/quick/kv_best_first.flags", "--topology=v5p-6"), "counts TensorCores"),
    (("--flagfile=experiments/p1/quick/kv_best_first.flags",), "--topology is required"),
    (("--flagfile=experiments/p1/quick/fig1a.flags", "--topology=v5e-4"), "has no training step to compile"),
])
def test_the_command_refuses_bad_input_in_one_line(args, message):
    p = _aot(*args, timeout=120)
    assert p.returncode == 2 and message in p.stderr, p.stderr[-2000:]


@needs_libtpu
@pytest.mark.filterwarnings("ignore:ssmgate.cores. no measured")
def test_a_kernel_in_a_partitioned_program_gives_way_to_the_chunked_form():
    """JAX cannot partition a Mosaic custom call: inside a program spanning several devices the pallas
    core lowers the chunked form for TPU (with a warning); on one device it keeps the kernel."""
    from jax.sharding import SingleDeviceSharding
    from ssmgate.bench.cores import core_fn, input_structs
    from ssmgate.cores.pallas import ssd
    structs = input_structs("scalar_decay", 1, 64, 2, 16, 16, 1, 1, jax.numpy.float32,
                            sharding=SingleDeviceSharding(topology.devices("v5e:2x2")[0]))
    # a fresh jit each time: a traced program is cached by its inputs' shapes, not by the context
    kernels = lambda: jax.jit(core_fn("scalar_decay", "pallas", 16)).lower(structs).as_text().count("tpu_custom_call")
    assert kernels() == 1
    ssd._warn_partitioned.cache_clear()  # it warns once per width, and earlier compiles here may have
    with ssd.partitioned_over(4), pytest.warns(UserWarning, match="XLA cannot partition"):
        assert kernels() == 0
