"""The `p1_tools` program: gate-scaled replicas of a pretrained model fine-tuned as one sweep on
tool-calling prompts, decoded and scored at every pool size; resume, bad inputs, the report."""
import dataclasses
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from ssmgate.models import lm
from ssmgate.models.config import ModelCfg
from ssmgate.train import lm_runs
from ssmgate.programs.p1_tools import program as p1_tools
from ssmgate.programs.p1_tools import report as p1_tools_report
from ssmgate.config_error import ConfigError
from ssmgate.train import loop, mesh as meshlib, optim, sweep
from ssmgate.train.checkpoint import Checkpointer
from ssmgate.train.run_spec import Grid, RunSpec
from ssmgate.train.state import TrainState
from tests.main_runs import dry_run_flag_files

REPO = Path(__file__).resolve().parents[2]
TINY = ModelCfg(block="mamba2", vocab_size=258, d_model=16, n_layers=1, d_state=8, headdim=8, expand=2)


def make_cfg(model=TINY, scales=(0.5, 2.0), init_run="", steps=2):
    """`scales`: P1's gate scales s, trained as the offsets ln s."""
    tools = p1_tools.ToolsCfg(k_max=2, seq_len=1024, batch=2, eval_k=(1, 3), weak_betas=(0.05,), weak_k=(3,),
                              max_new=6, eval_batch=4, max_test=4)
    spec = RunSpec(model=model, optim=optim.OptimCfg(name="adamw", lr=1e-3, total_steps=steps),
                   loop=loop.LoopCfg(steps, log_every=1, tensorboard=False), mesh=meshlib.MeshCfg(),
                   grid=Grid(offsets=tuple(math.log(s) for s in scales)))
    return p1_tools.P1ToolsCfg(tools=tools, spec=spec, init_run=init_run).validate()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A 'pretraining' run directory: a checkpoint of TINY's parameters, as p2_lm leaves it."""
    root = tmp_path_factory.mktemp("p1_tools")
    params = lm.init_params(TINY, jax.random.PRNGKey(3))
    state = TrainState.create(params, optim.make_optimizer(optim.OptimCfg(name="adamw", lr=1e-3, total_steps=2)),
                              jax.random.PRNGKey(0))
    with Checkpointer(root / "pre" / "checkpoints") as c:
        c.save(5, state, meta={"fingerprint": "pretraining"}, force=True)
    return root, params


@pytest.fixture(scope="module")
def finished(pretrained):
    root, _ = pretrained
    cfg = make_cfg(init_run="pre")
    return cfg, root / "sft", p1_tools.run(cfg, str(root / "sft"))


def test_a_sweep_of_gate_scales_is_trained_decoded_and_scored(finished):
    cfg, run_dir, s = finished
    assert s["gate_scales"] == ["0.5", "2"] and s["steps"] == 2 and s["k_max_train"] == 2
    assert s["n_test"] == 4 and s["n_train"] + len(s["held_out_functions"]) >= 324
    for metric in p1_tools.STRICT + p1_tools.LENIENT:
        assert set(s[metric]) == {"0.5", "2"} and set(s[metric]["0.5"]) == {"1", "3"}
        assert all(0.0 <= v <= 1.0 for row in s[metric].values() for v in row.values())
    assert set(s["weak"]) == {"0.05"} and set(s["weak"]["0.05"]["2"]) == {"3"}
    assert 0.0 <= s["weak_recall"]["0.05"]["3"] <= 1.0 and s["bm25_recall"]["1"] > 0.5
    assert all(len(v) == 3 for v in s["samples"]["3"].values())
    cells = [json.loads(line) for line in (run_dir / p1_tools.CELLS_FILE).read_text().splitlines()]
    assert [c["key"] for c in cells] == ["v2|main|1", "v2|main|3", "v2|seen|2", "v2|weak0.05|3"]
    seen = cells[2]["value"]     # as many training questions as held-out ones, in pools of k_max
    assert s["n_seen"] == 4 and len(seen["pools"]) == 4 and all(len(p) == 2 for p in seen["pools"])
    for metric in p1_tools.STRICT + p1_tools.LENIENT:
        assert set(s[f"seen_{metric}"]) == {"0.5", "2"} and 0.0 <= s[f"seen_{metric}"]["2"] <= 1.0
    kept = cells[1]["value"]     # every output and pool kept: the scores are recomputed from them
    assert len(kept["pools"]) == 4 and all(len(p) == 3 for p in kept["pools"])
    assert kept["outputs"]["2"][:3] == s["samples"]["3"]["2"] and len(kept["outputs"]["0.5"]) == 4
    assert all(n >= a for n, a in zip(s["name_accuracy"]["2"].values(), s["accuracy"]["2"].values()))
    assert s["init_run"].endswith("pre")


def test_rerunning_resumes_training_and_measures_nothing_again(finished):
    cfg, run_dir, first = finished
    lines = (run_dir / p1_tools.CELLS_FILE).read_text()
    again = p1_tools.run(cfg, str(run_dir))
    assert again["resumed_from"] == 2 and again["params_digest"] == first["params_digest"]
    assert again["accuracy"] == first["accuracy"] and (run_dir / p1_tools.CELLS_FILE).read_text() == lines


def test_replicas_start_from_the_pretrained_weights_with_their_gate_scale(pretrained):
    _, params = pretrained
    replicas = [sweep.Replica(0, 1e-3, math.log(s)) for s in (0.25, 4.0)]
    built = lm_runs.build_run(TINY, optim.OptimCfg(name="adamw", lr=1e-3, total_steps=2), replicas,
                              loss=p1_tools.text_loss, eval_batches=[], mesh=meshlib.make_mesh(meshlib.MeshCfg()),
                              mode="replicated", force_sweep=True, base_params=params,
                              host_sample=lambda seed, k: None)
    start = built.init_state().train.params
    a_log = params["layers_0"]["mixer"]["A_log"]
    for r, s in enumerate((0.25, 4.0)):
        np.testing.assert_allclose(start["layers_0"]["mixer"]["A_log"][r], a_log + math.log(s), rtol=1e-6)
        np.testing.assert_array_equal(start["embed"]["embedding"][r], params["embed"]["embedding"])


def test_bad_inputs_name_what_is_wrong(pretrained, tmp_path):
    root, _ = pretrained
    with pytest.raises(ConfigError, match="expected distinct offsets"):
        make_cfg(scales=(2.0, 2.0))
    with pytest.raises(ConfigError, match="--block=llama has none"):
        make_cfg(model=dataclasses.replace(TINY, block="llama", n_heads=2, mlp="swiglu"))
    with pytest.raises(ConfigError, match="--tools_k_max=0"):
        dataclasses.replace(make_cfg(), tools=dataclasses.replace(make_cfg().tools, k_max=0)).validate()
    with pytest.raises(ConfigError, match="holds no checkpoints"):
        p1_tools.run(make_cfg(init_run=str(tmp_path / "nothing")), str(tmp_path / "sft"))
    wider = dataclasses.replace(TINY, d_model=32)
    with pytest.raises(ConfigError, match="do not fit the model flags"):
        p1_tools.run(make_cfg(model=wider, init_run=str(root / "pre")), str(tmp_path / "sft2"))


def test_the_report_section(finished, tmp_path):
    cfg, run_dir, s = finished
    fake = json.loads(json.dumps(s))
    fake["gate_scales"] = ["0.06", "16"]
    for metric in p1_tools.STRICT + p1_tools.LENIENT:
        fake[metric] = {"0.06": fake[metric]["0.5"], "16": fake[metric]["2"]}
        fake[f"seen_{metric}"] = {"0.06": 0.25, "16": 0.75}
    fake["accuracy"]["0.06"]["3"], fake["accuracy"]["16"]["3"] = 0.3, 0.2
    fake["hallucination"]["0.06"]["3"], fake["hallucination"]["16"]["3"] = 0.3, 0.5
    fake["weak"] = {b: {"0.06": row["0.5"], "16": row["2"]} for b, row in fake["weak"].items()}
    entry, md = p1_tools_report.build({"tools_sft": fake}, "quick", {}, {}, tmp_path, run_dir.parent)
    assert entry["checks"] == {"weak_gate_accuracy_above_strong_at_k3": True,
                               "hallucination_s16_above_s0.06_at_k3": True}
    assert entry["accuracy"]["0.06"]["3"] == 0.3 and (tmp_path / "p1_tools.png").exists()
    assert "| model | accuracy at k=3 |" in md and "| s = 0.06 | 0.3 |" in md
    assert "Runs without a summary (failed or not run): tools_pretrain, tools_transformer_pretrain, " \
           "tools_transformer" in md
    assert "β = 0.05:" in md and "| recall@k |" in md   # Fig 5's BFCL row as a table
    assert "| model | seen: accuracy | seen: right name | held out: accuracy | held out: right name |" in md
    assert entry["seen_accuracy"] == fake["seen_accuracy"] and entry["n_seen"] == 4
    assert "| s = 16 | 0.75 | 0.75 |" in md


TINY_LLAMA = ModelCfg(block="llama", vocab_size=258, d_model=16, n_layers=1, n_heads=2, mlp="swiglu", d_mlp=16)


def test_a_transformer_is_fine_tuned_and_scored_as_one_replica_and_reported_beside_the_gates(finished, tmp_path):
    """Fig 4's Transformer: the same program with a Llama and no gate (s = 1), beside the Mamba gates."""
    _, _, mamba = finished
    s = p1_tools.run(make_cfg(model=TINY_LLAMA, scales=(1.0,)), str(tmp_path / "tools_transformer"))
    assert s["gate_scales"] == ["1"] and set(s["accuracy"]["1"]) == {"1", "3"}
    entry, md = p1_tools_report.build({"tools_sft": mamba, "tools_transformer": s}, "quick", {}, {}, tmp_path,
                                      tmp_path)
    assert entry["transformer_accuracy"] == s["accuracy"]["1"] and entry["transformer_k_max_train"] == 2
    assert set(entry["transformer_weak"]) == {"0.05"}
    assert "| Transformer |" in md and (tmp_path / "p1_tools.png").exists()
    below = all(s["accuracy"]["1"]["3"] < row["3"] for row in mamba["accuracy"].values())
    assert entry["checks"]["transformer_accuracy_below_every_gate_at_k3"] is below   # False on a tie (0 = 0)
    assert "transformer_accuracy_falls_beyond_training_limit_k2" not in entry["checks"]  # k = 2 not evaluated


def _fig4(gates: dict, transformer: dict, k_train=8) -> dict:
    return {"gate_scales": list(gates), "accuracy": gates, "transformer_accuracy": transformer,
            "transformer_k_max_train": k_train}


@pytest.mark.parametrize("gates, transformer, below, falls", [
    ({"0.06": {"8": 0.5, "32": 0.3}, "16": {"8": 0.5, "32": 0.2}}, {"8": 0.6, "32": 0.01}, True, True),
    ({"0.06": {"8": 0.5, "32": 0.3}, "16": {"8": 0.5, "32": 0.2}}, {"8": 0.6, "32": 0.2}, False, True),   # ties s=16
    ({"0.06": {"8": 0.5, "32": 0.3}, "16": {"8": 0.5, "32": 0.0}}, {"8": 0.6, "32": 0.1}, False, True),   # above one
    ({"0.06": {"8": 0.5, "32": 0.3}, "16": {"8": 0.5, "32": 0.2}}, {"8": 0.1, "32": 0.1}, True, False),   # no fall
])
def test_the_transformer_checks_of_fig4(gates, transformer, below, falls):
    checks = p1_tools_report.checks(_fig4(gates, transformer))
    assert checks["transformer_accuracy_below_every_gate_at_k32"] is below
    assert checks["transformer_accuracy_falls_beyond_training_limit_k8"] is falls
    assert all(checks.notes[n][0] and checks.notes[n][1] for n in checks)
    no_limit = p1_tools_report.checks(_fig4(gates, {"32": 0.01}))   # the training limit was not evaluated
    assert "transformer_accuracy_falls_beyond_training_limit_k8" not in no_limit


def _fig5(s006: dict, s1: dict, beta="10") -> dict:
    return {"weak": {beta: {"0.06": s006, "1": s1, "16": {k: 0.0 for k in s1}}}}


@pytest.mark.parametrize("s006, s1, passed", [
    ({"4": 0.5, "32": 0.1}, {"4": 0.5, "32": 0.45}, True),    # s = 0.06 drops, s = 1 about stable
    ({"4": 0.5, "32": 0.1}, {"4": 0.5, "32": 0.8}, True),     # s = 1 rises by less than s = 0.06 falls
    ({"4": 0.5, "32": 0.4}, {"4": 0.5, "32": 0.2}, False),    # s = 1 moves more
    ({"4": 0.5, "32": 0.4}, {"4": 0.3, "32": 0.4}, False),    # a tie fails
    ({"4": 0.0, "32": 0.0}, {"4": 0.0, "32": 0.0}, False),    # nothing learnt: nothing falls
    ({"4": 0.2, "32": 0.5}, {"4": 0.5, "32": 0.5}, False),    # s = 0.06 rises
])
def test_the_fig5_bfcl_check(s006, s1, passed):
    checks = p1_tools_report.checks(_fig5(s006, s1))
    assert checks == {"fig5_bfcl_beta10_s0.06_falls_more_than_s1_moves_k4_to_k32": passed}
    assert p1_tools_report.checks(_fig5(s006, s1, beta="0.05")) == {}   # only the ordered retriever (beta 10)


def test_flag_files_dry_run():
    paths = ("experiments/p1/tools_sft.flags", "experiments/p1/cpu/tools_sft.flags")
    for path, res in dry_run_flag_files(paths).items():
        assert res.returncode == 0, (path, res.stderr[-2000:])
        assert "gate scales: 0.06, 0.12, 0.25, 1, 4, 8, 16 (one vmapped sweep)" in res.stdout


def test_transformer_flag_files_dry_run():
    """Fig 4's Transformer: the 2B Llama at paper scale, about the cpu Mamba-2's size (252,208) at cpu scale."""
    scales = ("", "cpu/", "quick/")
    sft = [f"experiments/p1/{where}tools_transformer.flags" for where in scales]
    pre = [f"experiments/p1/{where}tools_transformer_pretrain.flags" for where in scales]
    got = dry_run_flag_files(sft + pre)
    for path, res in got.items():
        assert res.returncode == 0, (path, res.stderr[-2000:])
        assert "block='llama'" in res.stdout, path
    for path in sft:
        out = got[str(path)].stdout
        assert "gate scales: 1 (one vmapped sweep)" in out and "init_run: tools_transformer_pretrain" in out
    assert "total                        1,953,613,824" in got[pre[0]].stdout
    assert "total              263,040" in got[pre[1]].stdout and "total              263,040" in got[sft[1]].stdout
    assert "weak_betas=()" in got[sft[1]].stdout and "weak_betas=(0.05, 10.0)" in got[sft[0]].stdout
