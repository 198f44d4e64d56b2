"""The non-finite-check benchmark's harness at toy sizes (the real one: python -m ssmgate.bench nan_check)."""
import dataclasses

from ssmgate.bench import nan_check, train
from ssmgate.models.config import ModelCfg


def test_three_ways_of_reading_metrics_are_timed_and_tabled():
    tiny = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8)
    task = dataclasses.replace(train.SWEEP_TASK, vocab_size=16, batch=2, seq_len=9)
    row = nan_check.bench_size(tiny, task, steps=3, reps=1)
    assert row["replicas"] == 16 and list(row["steps_per_s"]) == [name for name, _ in nan_check.WAYS]
    assert all(v > 0 for v in row["steps_per_s"].values())
    text = nan_check.markdown({"date": "d", "cpu": "c", "cores": 2, "jax": "j", "command": "cmd", "reps": 1,
                               "sizes": {"toy": row}})
    assert "| toy: 16 models, batch 2 x 9, 3 steps | " in text and "one step late" in text
