"""The training benchmark's harness at toy sizes (the real one runs by hand: python -m ssmgate.bench sweep)."""
import dataclasses

import pytest

from ssmgate.bench import cli_runs, train
from ssmgate.models.config import ModelCfg


def test_sweep_and_throughput_rows_and_markdown(monkeypatch):
    tiny = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8)
    task = dataclasses.replace(train.SWEEP_TASK, vocab_size=16, batch=4, seq_len=9)
    row = train.bench_sweep(steps=2, reps=1, cfg=tiny, task=task, lrs=[1e-3, 1e-2], offsets=[-1.0, 0.0],
                            log=lambda *_: None)
    assert row["replicas"] == 4 and row["sweep_s"] > 0 and row["speedup"] == row["sequential_s"] / row["sweep_s"]
    monkeypatch.setattr(train, "THROUGHPUT_MODELS", {"Mamba-2": tiny,
                                                     "Transformer": ModelCfg(block="llama", vocab_size=16, d_model=16,
                                                                             n_layers=1, n_heads=2, mlp="swiglu")})
    monkeypatch.setattr(train, "THROUGHPUT_TASK", {"batch": 2, "seq_len": 8})
    rows = train.bench_throughput(steps=2, reps=1, peak=1e9, log=lambda *_: None)
    assert [r["model"] for r in rows] == ["Mamba-2", "Transformer"]
    assert all(r["tokens_per_s"] > 0 and 0 < r["flops"] for r in rows)
    split = train.bench_split(1, cfg=tiny, task=task, k=2, log=lambda *_: None, models=("Mamba-2",))
    assert [r["part"] for r in split][:2] == ["Mamba-2 forward", "Mamba-2 gradient"]
    assert split[2]["part"].startswith("core gradient") and split[2]["folded_s"] > 0 and split[3]["folded_s"] is None
    assert all(r[key] > 0 for r in split for key in ("one_s", "vmapped_s", "mapped_s"))
    text = train.markdown({"date": "d", "cpu": "c", "cores": 2, "jax": "j", "command": "cmd", "reps": 1,
                           "matmul_peak_flops": 1e9, "sweep": [dict(row, name="toy")], "split": split, "throughput": rows})
    for cell in ("| toy | ", "speed-up", "| Mamba-2 gradient |", "| core gradient (scalar_decay, auto) |", "| Transformer |"):
        assert cell in text


def test_model_flops_grow_with_the_sequence_for_attention_only_quadratically():
    att = ModelCfg(block="llama", vocab_size=16, d_model=16, n_layers=1, n_heads=2, mlp="swiglu")
    ssm = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8)
    assert train.model_flops(ssm, 1, 200) / train.model_flops(ssm, 1, 100) == 2.0
    assert train.model_flops(att, 1, 200) / train.model_flops(att, 1, 100) > 2.0


TOY = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8)
TOY_TASK = dataclasses.replace(train.SWEEP_TASK, vocab_size=16, batch=4, seq_len=9)


# Slow: it starts a training process per replica. The sweep's agreement with separate runs is tested
# in-process by tests/train (test_loop.py, test_mesh.py), the harness's flags and refusals below.
@pytest.mark.slow
def test_end_to_end_runs_train_the_sweeps_models_in_separate_processes(tmp_path):
    row = cli_runs.bench_runs(TOY, TOY_TASK, lrs=[1e-3], offsets=[-1.0, 0.0], steps=4, log=lambda *_: None,
                              work_dir=str(tmp_path))
    assert row["replicas"] == 2 and row["steps"] == 4
    assert row["speedup"] == pytest.approx(row["sequential_s"] / row["sweep_s"])
    assert row["max_rel_loss_diff"] <= cli_runs.LOSS_AGREEMENT
    assert 0 < row["run_loop_s_mean"] < row["run_s_mean"] and 0 < row["sweep_loop_s"] < row["sweep_s"]
    assert not list(tmp_path.iterdir())  # the runs' directories are removed
    text = train.markdown({"date": "d", "cpu": "c", "cores": 2, "jax": "j", "command": "cmd", "reps": 1,
                           "matmul_peak_flops": 1e9, "sweep": [], "split": [], "throughput": [], "runs": row})
    assert "**End to end**" in text and f"**{row['speedup']:.1f}×**" in text


def test_end_to_end_runs_that_train_other_models_than_the_sweep_are_an_error(monkeypatch, tmp_path):
    def fake_launch(flags, run_dir, log):
        sweep = "--train_sweep" in flags
        return 1.0, {"final": {"loss": [1.0, 2.0] if sweep else 1.5}, "steps": 4, "wall_s": 0.5}
    monkeypatch.setattr(cli_runs, "_launch", fake_launch)
    with pytest.raises(RuntimeError, match="did not train the same models"):
        cli_runs.bench_runs(TOY, TOY_TASK, lrs=[1e-3], offsets=[-1.0, 0.0], steps=4, log=lambda *_: None,
                            work_dir=str(tmp_path))


def test_run_flags_name_the_models_and_tasks_fields():
    flags = cli_runs.run_flags(TOY, TOY_TASK, steps=40)
    for flag in ("--block=mamba2", "--d_model=16", "--d_state=8", "--headdim=8", "--task=recall", "--seq_len=9",
                 "--batch=4", "--steps=40", "--vocab_size=16"):
        assert flag in flags
