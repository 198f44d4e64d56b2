"""The P2 state-tracking program (Table 2) at toy sizes: summary, LR choice, phase code, resume,
flags and the paper flag files."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from ssmgate import reproduce
from ssmgate.models import presets
from ssmgate.programs.p2_state_tracking import program as p2
from ssmgate.tasks import state_tracking as st
from ssmgate.train import loop, mesh, optim, sweep
from ssmgate.train.run_spec import Grid, RunSpec
from tests.main_runs import dry_run_flag_files, run_many

REPO = Path(__file__).resolve().parents[2]


def tiny_cfg(task="parity", models=("underdamped", "mamba2")):
    model = presets.state_tracking("m3_native", 1).replace(d_model=16, d_state=8, headdim=8)
    data = st.StateTrackDataCfg(task=task, batch=8, max_len=9 if task == "arith" else 8, L_min=3, L_max0=5,
                                L_max1=9 if task == "arith" else 8, ramp_steps=4)
    spec = RunSpec(model=model, optim=optim.OptimCfg(name="adamw", lr=1e-2, total_steps=6, warmup_steps=1),
                   loop=loop.LoopCfg(steps=6, log_every=3, tensorboard=False), mesh=mesh.MeshCfg(),
                   grid=Grid(more_lrs=(3e-3,)), stop=sweep.StopRule("accuracy"))
    return p2.StateTrackingCfg(data=data, spec=spec, models=models, val_n=16, test_n=24, test_lens=(12, 13)).validate()


def with_stop(cfg, stop_thr, **spec_changes):
    """cfg with the early-stopping threshold (and other spec fields) changed."""
    spec = dataclasses.replace(cfg.spec, stop=sweep.StopRule("accuracy", stop_thr=stop_thr), **spec_changes)
    return dataclasses.replace(cfg, spec=spec)


def test_table_row_summary_lr_choice_and_phase_code(tmp_path):
    cfg = tiny_cfg()
    out = p2.run(cfg, tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == out
    assert out["models"] == ["underdamped", "mamba2"] and out["test_lens"] == [12, 13]
    for name in cfg.models:
        assert out["chosen_lr"][name] in cfg.lrs
        assert out["chosen_lr"][name] == cfg.lrs[int(np.argmax(out["val_accuracy"][name]))]
        for length, acc in out["accuracy"][name].items():
            assert 0.0 <= acc <= 1.0
            assert out["scaled_accuracy"][name][length] == pytest.approx(100 * (acc - 0.5) / 0.5)
        assert (tmp_path / name / "checkpoints" / "6").is_dir()
    code = out["phase_code"]
    h, r = cfg.spec.model.n_ssm_heads, cfg.spec.model.n_rot_pairs
    assert len(code["pairs_deg"]) == h * r and code["ideal_deg"] == [0.0, 180.0]
    best = code["pairs_deg"][code["head"] * r + code["pair"]]
    assert code["deg"] == best and all(-180 < d <= 180 for d in code["deg"])
    score = [abs(a) + abs(abs(b) - 180) for a, b in code["pairs_deg"]]
    assert min(score) == abs(best[0]) + abs(abs(best[1]) - 180)
    # A second run resumes every row from its final checkpoint and reproduces the summary.
    again = p2.run(cfg, tmp_path)
    assert again["accuracy"] == out["accuracy"] and again["chosen_lr"] == out["chosen_lr"]
    # ...and says so, so that ssmgate.reproduce keeps the first run's wall time instead of the resume's.
    assert out["resumed_from"] is None and again["resumed_from"] == cfg.spec.loop.steps


def test_a_grid_resumed_partway_reports_the_earliest_step_a_model_continued_from():
    assert p2.grid_resumed_from([None, None]) is None
    assert p2.grid_resumed_from([1400, 1400]) == 1400  # every row at its last step: nothing trained
    assert p2.grid_resumed_from([1400, 700]) == 700
    assert p2.grid_resumed_from([1400, None]) == 0     # a row trained from scratch: the cost is not the grid's


def test_arithmetic_tests_odd_lengths_and_has_no_phase_code(tmp_path):
    # len_quantum 4: the curriculum's batches are 8 then 9 tokens wide (two stages, one compile each).
    cfg = dataclasses.replace(tiny_cfg("arith", models=("critical",)), len_quantum=4)
    assert [st.curriculum_width(cfg.data, k, 4) for k in (0, 3, 4)] == [8, 8, 9]
    out = p2.run(cfg, tmp_path)
    assert out["test_lens"] == [11, 13] and "phase_code" not in out
    assert set(out["scaled_accuracy"]["critical"]) == {"11", "13"}


def test_length_buckets_run_and_need_a_quantum(tmp_path):
    cfg = dataclasses.replace(tiny_cfg("arith", models=("underdamped",)), len_quantum=4, len_buckets=True)
    stages = {st.length_bucket(cfg.data, k, 4, cfg.spec.grid.seed) for k in range(6)}
    assert stages <= {(1, 4), (5, 8), (9, 9)} and len(stages) > 1
    out = p2.run(cfg, tmp_path)
    assert set(out["scaled_accuracy"]["underdamped"]) == {"11", "13"}
    assert p2.describe(cfg).count("length bucket") == 1
    with pytest.raises(p2.ConfigError, match="--st_len_buckets with --st_len_quantum=0: expected --st_len_quantum >= 1"):
        dataclasses.replace(cfg, len_quantum=0).validate()
    assert cfg.fingerprint("underdamped") != dataclasses.replace(cfg, len_buckets=False).fingerprint("underdamped")


def test_early_stopping_freezes_replicas_at_the_threshold(tmp_path):
    """With --stop_thr a replica whose validation accuracy reaches it stops training there; the
    program ends when every replica has stopped, and tests the frozen parameters."""
    cfg = with_stop(tiny_cfg(models=("mamba2",)), 1e-6,
                    loop=loop.LoopCfg(steps=6, log_every=3, eval_every=2, tensorboard=False))
    out = p2.run(cfg, tmp_path)
    assert out["stopped_step"]["mamba2"] == [2, 2]  # any accuracy >= 1e-6: both stop at the first evaluation
    assert (tmp_path / "mamba2" / "checkpoints" / "2").is_dir() and not (tmp_path / "mamba2" / "checkpoints" / "6").exists()
    assert "validation accuracy reaches 1e-06" in p2.describe(cfg)
    assert p2.run(tiny_cfg(models=("mamba2",)), tmp_path / "plain")["stopped_step"]["mamba2"] == [-1, -1]
    assert cfg.fingerprint("mamba2") != with_stop(cfg, None).fingerprint("mamba2")
    for bad in (0.0, 1.5):
        with pytest.raises(p2.ConfigError, match=f"--stop_thr={bad}: expected a value of accuracy in"):
            with_stop(cfg, bad).validate()
    escaping = dataclasses.replace(cfg, spec=dataclasses.replace(cfg.spec, stop=sweep.StopRule("accuracy", 0.5, 0.9)))
    with pytest.raises(p2.ConfigError, match="--escape_thr=0.5: state tracking has no escape step"):
        escaping.validate()


def test_rows_swap_only_the_transition():
    cfg = tiny_cfg(models=tuple(p2.MODELS))
    widths = {(m.d_model, m.d_state, m.n_layers, m.headdim) for m in map(cfg.model_for, cfg.models)}
    assert widths == {(16, 8, 1, 8)}
    assert cfg.model_for("mamba2").block == "mamba2"
    assert [cfg.model_for(n).transition for n in ("underdamped", "overdamped", "critical", "m3_static")] == \
        ["native", "over", "critical", "static"]


def test_paper_flag_files_dry_run_and_bad_flags_name_themselves():
    tasks = ("parity", "mod3", "arith")
    files = [f"experiments/p2/state_tracking_{task}.flags" for task in tasks]
    files += [f"experiments/p2/{scale}/state_tracking_{task}.flags" for scale in ("cpu", "quick") for task in tasks]
    base = ["--program=p2_state_tracking", "--steps=5", "--batch=4", "--lr=1e-3", "--dry_run"]
    bad = ((["--task=copy"], "--task=copy: expected one of parity, mod3, arith"),
           (["--task=parity", "--st_models=gru"], "--st_models=gru: expected some of"),
           (["--task=arith", "--st_l_min=4"], "--st_l_min=4"),
           (["--task=parity", "--st_l_max0=200"], "--st_l_max1=160: expected >= L_max0 = 200"),
           (["--task=mod3", "--st_hold_steps=-1"], "--st_hold_steps=-1: expected >= 0"))
    dry = dry_run_flag_files(files)
    results = [dry[f] for f in files] + run_many([[*base, *extra] for extra, _ in bad])
    for path, res in zip(files, results):
        assert res.returncode == 0, (path, res.stderr[-2000:])
        scale = path.split("/")[2] if path.count("/") == 3 else "paper"
        task = path.rsplit("_", 1)[1].split(".")[0]
        if scale == "paper":
            assert "0.0001, 0.000193" in res.stdout and "underdamped_companion" in res.stdout
            continue
        rows = [line.split(":")[0].strip() for line in res.stdout.splitlines() if "parameters" in line]
        assert rows == list(p2.TABLE_MODELS), (path, rows)
        changes = " ".join(reproduce.changes_from_paper("p2", f"state_tracking_{task}", scale))
        assert "a_activation: (unset) -> softplus" in changes and "steps: 10000 ->" in changes
        if scale == "cpu":  # parity's and mod 3's sweeps of 4 split over two CPU devices; arithmetic's 2 on one
            devices = 1 if task == "arith" else 2
            assert f"mesh {{'replica': {devices}, 'data': 1, 'model': 1}}: each model's" in res.stdout, path
    for (extra, message), res in zip(bad, results[len(files):]):
        assert res.returncode != 0 and message in res.stderr, (extra, res.stderr[-1500:])
    # A replica axis that does not divide each model's sweep is refused before anything runs.
    res, = run_many([[*base, "--task=parity", "--lr=1e-3,3e-3,1e-2", "--cpu_devices=2", "--mesh_replica=2"]])
    assert res.returncode != 0 and "--mesh_replica=2 does not divide each model's 3 replicas" in res.stderr, res.stderr
