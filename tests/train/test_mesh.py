"""Mesh, partition table and sharded training.

The partition table is checked in-process on an AbstractMesh (no devices needed). Sharded
training runs this file as a script in a subprocess with 8 fake CPU devices (XLA_FLAGS must be
set before jax starts, and must not leak into the rest of the test session).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from ssmgate.train import mesh as M
from ssmgate.train.optim import OptimCfg, make_optimizer, set_learning_rate
from ssmgate.train.state import TrainState
from ssmgate.tree_paths import path_str
from tests.subprocess_env import with_cpu_devices

REPO = Path(__file__).resolve().parents[2]


def abstract_mesh(replica=1, data=1, model=1):
    return AbstractMesh((replica, data, model), M.AXES)


def specs_by_path(specs):
    return {path_str(kp): s for kp, s in
            jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, P))[0]}


def lm_shapes(**cfg):
    lm = pytest.importorskip("ssmgate.models.lm")
    from ssmgate.models.config import ModelCfg
    model_cfg = ModelCfg(vocab_size=256, d_model=32, d_state=16, headdim=16, n_layers=1, **cfg)
    return jax.eval_shape(lambda: lm.init_params(model_cfg, jax.random.key(0)))


# ---------------------------------------------------------------------------- mesh config

def test_axis_sizes_resolve_data_and_name_the_flags():
    assert M.MeshCfg().axis_sizes(8) == (1, 8, 1)
    assert M.MeshCfg(replica=2, model=2).axis_sizes(8) == (2, 2, 2)
    with pytest.raises(ValueError, match=r"--mesh_replica=1 x --mesh_data=3 x --mesh_model=2 does not match "
                                         r"the 8 devices: expected sizes whose product is 8"):
        M.MeshCfg(data=3, model=2).axis_sizes(8)
    with pytest.raises(ValueError, match=r"--mesh_data=-1 \(all remaining\) x --mesh_model=1 does not match the 8"):
        M.MeshCfg(replica=3).axis_sizes(8)
    with pytest.raises(ValueError, match=r"--mesh_model=0: expected an integer >= 1"):
        M.MeshCfg(model=0).validate()
    with pytest.raises(ValueError, match=r"MeshCfg.params='zero': expected one of"):
        M.MeshCfg(params="zero").validate()


def test_make_mesh_on_the_local_devices():
    mesh = M.make_mesh(M.MeshCfg())
    assert mesh.axis_names == M.AXES and mesh.size == jax.device_count()


def test_mesh_for_description_is_abstract_when_the_devices_are_missing():
    mesh, note = M.mesh_for_description(M.MeshCfg())
    assert isinstance(mesh, jax.sharding.Mesh) and note == ""
    mesh, note = M.mesh_for_description(M.MeshCfg(replica=1, data=32, model=8, params="fsdp_tp"))
    assert dict(mesh.shape) == {"replica": 1, "data": 32, "model": 8}
    assert note == f" (abstract: 256 devices, {jax.device_count()} here)"
    shapes = lm_shapes(block="mamba2")
    table = M.describe_shardings(shapes, M.param_shardings(shapes, mesh, "fsdp_tp"))
    assert re.search(r"layers_0/mixer/in_proj/kernel +\(32, 164\) +\(data, None\) +164\n", table), table
    with pytest.raises(ValueError, match="--mesh_model=[0-9]+ does not match"):  # data=-1 needs real devices
        M.mesh_for_description(M.MeshCfg(model=3 * jax.device_count() + 1))


# ---------------------------------------------------------------------------- partition table

@pytest.mark.parametrize("cfg", [dict(block="mamba2", mlp="swiglu"), dict(block="mamba3", mimo_rank=2),
                                 dict(block="mamba3", transition="static"),
                                 dict(block="gpt_neox", mlp="gelu", tie_embeddings=False),
                                 dict(block="llama", mlp="swiglu")])
def test_table_covers_every_param_of_the_model_zoo(cfg):
    plan = M.partition_specs(lm_shapes(**cfg), abstract_mesh(data=2, model=2), "fsdp_tp")
    uncovered = [n for n in plan.notes if "no partition-table row" in n]
    assert not uncovered, f"add rows to ssmgate.train.mesh.PARTITION_TABLE for: {uncovered}"


def test_mamba2_specs_per_mode():
    shapes = lm_shapes(block="mamba2", mlp="swiglu")  # d_inner 64, 4 heads, in_proj 164, conv 96
    pre = "layers_0/"
    tp = specs_by_path(M.partition_specs(shapes, abstract_mesh(data=4, model=2), "tp").specs)
    assert tp[pre + "mixer/in_proj/kernel"] == P(None, "model")
    assert tp[pre + "mixer/out_proj/kernel"] == P("model", None)
    assert tp[pre + "mixer/conv/kernel"] == P(None, "model")
    assert tp[pre + "mixer/A_log"] == P("model")
    assert tp[pre + "mlp/down/kernel"] == P("model", None)
    assert tp["embed/embedding"] == P("model", None)
    assert tp[pre + "norm/scale"] == P(None)
    fsdp = specs_by_path(M.partition_specs(shapes, abstract_mesh(data=4), "fsdp").specs)
    assert fsdp[pre + "mixer/in_proj/kernel"] == P("data", None)
    assert fsdp[pre + "mixer/out_proj/kernel"] == P(None, "data")
    assert fsdp["embed/embedding"] == P(None, "data")
    assert fsdp[pre + "mixer/A_log"] == P(None)
    both = specs_by_path(M.partition_specs(shapes, abstract_mesh(data=4, model=2), "fsdp_tp").specs)
    assert both[pre + "mixer/in_proj/kernel"] == P("data", "model")
    replicated = M.partition_specs(shapes, abstract_mesh(data=4, model=2), "replicated")
    assert all(all(a is None for a in s) for s in specs_by_path(replicated.specs).values())
    assert not replicated.notes


def test_indivisible_dims_fall_back_to_replicated_and_are_recorded():
    shapes = lm_shapes(block="mamba2")
    plan = M.partition_specs(shapes, abstract_mesh(model=8), "tp")  # 4 heads, in_proj width 164
    specs = specs_by_path(plan.specs)
    assert specs["layers_0/mixer/A_log"] == P(None)
    assert specs["layers_0/mixer/in_proj/kernel"] == P(None, None)
    assert "layers_0/mixer/A_log: dim 0 (heads, size 4) not divisible by model=8: replicated" in plan.notes
    assert any(n.startswith("layers_0/mixer/in_proj/kernel: dim 1 (inner, size 164)") for n in plan.notes)


def test_unknown_params_default_to_fsdp_on_the_leading_axis():
    shapes = {"new_module": {"w": jax.ShapeDtypeStruct((8, 3), jnp.float32),
                             "v": jax.ShapeDtypeStruct((8,), jnp.float32)}}
    fsdp = M.partition_specs(shapes, abstract_mesh(data=4), "fsdp")
    assert specs_by_path(fsdp.specs) == {"new_module/v": P(None), "new_module/w": P("data", None)}
    assert "new_module/w: no partition-table row for rank 2: default (leading axis on data)" in fsdp.notes
    tp = M.partition_specs(shapes, abstract_mesh(model=2), "tp")
    assert specs_by_path(tp.specs) == {"new_module/v": P(None), "new_module/w": P(None, None)}


def test_state_specs_mirror_params_in_optimizer_moments():
    params = {"layers_0": {"mlp": {"up": {"kernel": jax.ShapeDtypeStruct((8, 16), jnp.float32)},
                                   "up_norm": {"scale": jax.ShapeDtypeStruct((8,), jnp.float32)}}}}
    tx = make_optimizer(OptimCfg(name="adamw"))
    state = jax.eval_shape(lambda: TrainState.create(params, tx, jax.random.key(0)))
    mesh = abstract_mesh(data=2, model=2)
    specs = specs_by_path(M.state_specs(state, mesh, "fsdp_tp").specs)
    moments = [p for p in specs if p.endswith("up/kernel")]
    assert len(moments) == 3  # params, mu, nu
    assert all(specs[p] == P("data", "model") for p in moments)
    assert all(s == P() for p, s in specs.items() if not p.endswith(("kernel", "scale")))

    stacked = jax.eval_shape(lambda: jax.vmap(lambda k: TrainState.create(params, tx, k))(
        jax.random.split(jax.random.key(0), 4)))
    rspecs = specs_by_path(M.state_specs(stacked, abstract_mesh(replica=2, data=2, model=2), "fsdp_tp",
                                         replica_axis=True).specs)
    assert all(rspecs[p] == P("replica", "data", "model") for p in moments)
    assert rspecs["step"] == P("replica") and rspecs["rng"] == P("replica")


def test_batch_sharding_specs():
    mesh = M.make_mesh(M.MeshCfg())
    assert M.batch_sharding(mesh, 3).spec == P("data", None, None)
    assert M.batch_sharding(mesh, 2, replica_axis=True).spec == P("replica", "data", None)


# ---------------------------------------------------------------------------- sharded training (subprocess)

V, E, F, H, B, T, STEPS = 64, 16, 32, 8, 16, 8, 20


def init_mlp(key):
    """A 2-layer residual MLP LM whose param paths are table rows (vocab, embed, mlp, heads)."""
    k = iter(jax.random.split(key, 8))
    n = lambda shape, scale: scale * jax.random.normal(next(k), shape)
    layer = lambda: {"mlp_norm": {"scale": jnp.ones(E)}, "mlp": {"up": {"kernel": n((E, F), E ** -0.5)},
                                                                 "down": {"kernel": n((F, E), F ** -0.5)}},
                     "mixer": {"A_log": jnp.linspace(-2.0, 1.0, H)}}
    return {"embed": {"embedding": n((V, E), 1.0)}, "layers_0": layer(), "layers_1": layer(),
            "final_norm": {"scale": jnp.ones(E)}, "lm_head": {"kernel": n((E, V), E ** -0.5)}}


def mlp_loss(params, batch, rng):
    del rng
    rms = lambda x, s: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * s
    x = params["embed"]["embedding"][batch["tokens"][:, :-1]]
    for name in ("layers_0", "layers_1"):
        p = params[name]
        gate = jnp.repeat(jnp.exp(-jnp.exp(p["mixer"]["A_log"])), F // H)  # one gate per head of F/H channels
        u = jax.nn.gelu(rms(x, p["mlp_norm"]["scale"]) @ p["mlp"]["up"]["kernel"]) * gate
        x = x + u @ p["mlp"]["down"]["kernel"]
    logits = rms(x, params["final_norm"]["scale"]) @ params["lm_head"]["kernel"]
    logp = jax.nn.log_softmax(logits)
    loss = -jnp.mean(jnp.take_along_axis(logp, batch["tokens"][:, 1:, None], -1))
    return loss, {}


def batch_at(seed, k):
    return {"tokens": jax.random.randint(jax.random.fold_in(jax.random.key(seed), k), (B, T + 1), 0, V)}


def loss_curve(run, state, batches):
    losses = []
    for k in range(STEPS):
        state, metrics = run(state, batches(k))
        losses.append(np.asarray(metrics["loss"]).tolist())
    return state, losses


def sharded_training_main():
    """Loss curves: one device; tp / fsdp / fsdp_tp meshes (and Muon on fsdp_tp); a 2-replica lr sweep."""
    from ssmgate.train.step import make_train_step

    assert jax.device_count() == 8, jax.devices()
    out = {}
    for opt in ("adamw", "muon"):
        cfg = OptimCfg(name=opt, lr=1e-2, warmup_steps=2, total_steps=STEPS, weight_decay=0.1, clip_norm=1.0)
        tx = make_optimizer(cfg)
        step = make_train_step(mlp_loss, tx)

        def create(lr=cfg.lr):
            state = TrainState.create(init_mlp(jax.random.key(0)), tx, jax.random.key(1))
            return state.replace(opt_state=set_learning_rate(state.opt_state, lr))

        single = jax.jit(step)
        for seed, lr in ((0, cfg.lr), (1, 3e-3))[:2 if opt == "adamw" else 1]:
            out[f"{opt}_single_seed{seed}"] = loss_curve(single, create(lr), lambda k: batch_at(seed, k))[1]

        meshes = (("tp", (1, 4, 2)), ("fsdp", (1, 8, 1)), ("fsdp_tp", (1, 4, 2)))
        for mode, sizes in meshes if opt == "adamw" else meshes[2:]:
            mesh = M.make_mesh(M.MeshCfg(*sizes, params=mode))
            shardings = M.state_shardings(jax.eval_shape(create), mesh, mode)
            bsh = M.batch_sharding(mesh, 2)
            state, out[f"{opt}_{mode}"] = loss_curve(M.jit_step(step, shardings, bsh),
                                                     jax.jit(create, out_shardings=shardings)(),
                                                     lambda k: jax.device_put(batch_at(0, k), bsh))
            out[f"{opt}_{mode}_specs"] = {path_str(kp): str(leaf.sharding.spec) for kp, leaf in
                                          jax.tree_util.tree_flatten_with_path(state.params)[0]}
            out["describe"] = M.describe_shardings(state.params, jax.tree.map(lambda a: a.sharding, state.params))

        if opt == "adamw":  # replica r trains with (seed r, lr r); one compiled step serves both lrs
            mesh = M.make_mesh(M.MeshCfg(replica=2, data=4, model=1, params="fsdp"))
            create_all = lambda: jax.vmap(create)(jnp.array([cfg.lr, 3e-3]))
            shardings = M.state_shardings(jax.eval_shape(create_all), mesh, "fsdp", replica_axis=True)
            bsh = M.batch_sharding(mesh, 2, replica_axis=True)
            both = lambda k: jax.device_put(jax.tree.map(lambda a, b: jnp.stack([a, b]), batch_at(0, k),
                                                         batch_at(1, k)), bsh)
            state, losses = loss_curve(M.jit_step(jax.vmap(step), shardings, bsh),
                                       jax.jit(create_all, out_shardings=shardings)(), both)
            out["sweep"] = np.asarray(losses).T.tolist()
            out["sweep_up_spec"] = str(state.params["layers_0"]["mlp"]["up"]["kernel"].sharding.spec)
    print("RESULT " + json.dumps(out))


@pytest.fixture(scope="module")
def sharded_run():
    env = with_cpu_devices(8, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, __file__], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("name", ["adamw_tp", "adamw_fsdp", "adamw_fsdp_tp", "muon_fsdp_tp"])
def test_sharded_loss_curve_matches_one_device(sharded_run, name):
    ref = np.asarray(sharded_run[name.split("_")[0] + "_single_seed0"])
    assert ref[-1] < ref[0] - 0.1  # it trains
    np.testing.assert_allclose(sharded_run[name], ref, rtol=1e-5)


def test_sharded_params_live_where_the_table_says(sharded_run):
    up, emb = "layers_0/mlp/up/kernel", "embed/embedding"
    assert sharded_run["adamw_tp_specs"][up] == str(P(None, "model"))
    assert sharded_run["adamw_tp_specs"]["layers_0/mixer/A_log"] == str(P("model"))
    assert sharded_run["adamw_fsdp_specs"][up] == str(P("data", None))
    assert sharded_run["muon_fsdp_tp_specs"][emb] == str(P("model", "data"))
    assert sharded_run["sweep_up_spec"] == str(P("replica", "data", None))
    table = sharded_run["describe"]
    assert re.search(r"layers_1/mlp/down/kernel +\(32, 16\) +\(model, data\) +64\n", table), table
    assert table.splitlines()[-1].startswith("total")


def test_replica_sweep_matches_separate_runs(sharded_run):
    for r in range(2):
        np.testing.assert_allclose(sharded_run["sweep"][r], sharded_run[f"adamw_single_seed{r}"], rtol=1e-5)
    assert sharded_run["sweep"][0] != sharded_run["sweep"][1]


if __name__ == "__main__":
    sharded_training_main()


def test_a_batch_must_split_into_each_devices_microbatches():
    from ssmgate.train.mesh import check_batch
    check_batch(64, 4, 8)  # 16 rows a device, 2 a slice
    with pytest.raises(ValueError, match="--mesh_microbatches=8 on each of the 4 devices.*multiple of 32"):
        check_batch(48, 4, 8)
