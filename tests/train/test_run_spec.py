"""The run spec of the sweep programs: its replicas, one validation and one fingerprint."""
import dataclasses

import pytest

from ssmgate.config_error import ConfigError
from ssmgate.models.config import ModelCfg
from ssmgate.train import loop, mesh, optim, sweep
from ssmgate.train.run_spec import Grid, RunSpec

BASE_SPEC = RunSpec(model=ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8),
               optim=optim.OptimCfg(lr=1e-2, total_steps=10), loop=loop.LoopCfg(steps=10), mesh=mesh.MeshCfg(),
               grid=Grid(seed=3, seeds=2, offsets=(-2.0, 1.0)), stop=sweep.StopRule("accuracy", 0.5, 0.9), eval_n=8)


def with_(**changes):
    grid = changes.pop("grid", {})
    return dataclasses.replace(BASE_SPEC, grid=dataclasses.replace(BASE_SPEC.grid, **grid), **changes)


def test_replicas_are_seeds_by_learning_rates_by_offsets():
    assert [(r.offset, r.lr, r.seed) for r in BASE_SPEC.replicas] == [(-2, 1e-2, 3), (-2, 1e-2, 4), (1, 1e-2, 3),
                                                                 (1, 1e-2, 4)]
    sweep_lr = with_(grid={"more_lrs": (3e-2,), "seeds": 1})
    assert [(r.offset, r.lr) for r in sweep_lr.validate().replicas] == [(-2, 1e-2), (-2, 3e-2), (1, 1e-2), (1, 3e-2)]
    assert BASE_SPEC.lengen_examples == 8 and with_(lengen_eval_n=4).lengen_examples == 4


@pytest.mark.parametrize("changes, message", [
    ({"grid": {"seeds": 0}}, "--seeds=0: expected >= 1"),
    ({"grid": {"seed": -1}}, "--seed=-1: expected >= 0"),
    ({"grid": {"offsets": (1.0, 1.0)}}, "--gate_offset=1,1: expected distinct offsets"),
    ({"grid": {"more_lrs": (3e-2, -1.0)}}, "--lr=0.01,0.03,-1: expected positive, finite learning rates"),
    ({"eval_n": 0}, "--eval_n=0: expected >= 1"),
    ({"lengen_eval_n": 0}, "--lengen_eval_n=0: expected >= 1"),
    ({"stop": sweep.StopRule("accuracy", 1.5, None)}, "--escape_thr=1.5: expected a value of accuracy in (0, 1)"),
    ({"stop": sweep.StopRule("accuracy", None, 0.0)}, "--stop_thr=0.0: expected a value of accuracy in (0, 1]"),
    ({"stop": sweep.StopRule("accuracy", 0.9, 0.5)}, "--stop_thr=0.5: expected a value in [--escape_thr=0.9, 1]"),
])
def test_one_validation_names_the_flag(changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        with_(**changes).validate()


def test_thresholds_of_a_metric_that_is_no_accuracy_are_not_ranged():
    assert with_(stop=sweep.StopRule("loss", 0.0, 0.0)).validate()


def test_a_model_without_mamba2_gates_takes_no_offset():
    llama = ModelCfg(block="llama", vocab_size=16, d_model=16, n_layers=1, n_heads=2, mlp="swiglu")
    with pytest.raises(ConfigError, match="--block=llama has none"):
        dataclasses.replace(BASE_SPEC, model=llama).validate()


def test_the_fingerprint_covers_spec_and_task_but_not_the_cadence_or_mesh():
    base = BASE_SPEC.fingerprint({"task": 1})
    assert base == with_(loop=loop.LoopCfg(steps=10, log_every=7), mesh=mesh.MeshCfg(data=2)).fingerprint({"task": 1})
    assert base != BASE_SPEC.fingerprint({"task": 2})
    for changed in (with_(grid={"seeds": 1}), with_(optim=optim.OptimCfg(lr=2e-2, total_steps=10)),
                    with_(stop=sweep.StopRule("accuracy", 0.6, 0.9))):
        assert changed.fingerprint({"task": 1}) != base


def test_runs_keyed_before_a_field_retired_still_resume():
    # The key a checkpoint of this spec carried when ModelCfg still had a_log_offset (ssmgate at b4f9330).
    assert BASE_SPEC.fingerprint({"task": 1}) == "5b0b2cc97d087330"
    assert not hasattr(BASE_SPEC.model, "a_log_offset")
