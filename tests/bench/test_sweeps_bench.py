"""The sweep benchmark's timing harness on a toy grid (the real grids run by hand: python -m ssmgate.bench fig1_sweeps)."""
import jax
import jax.numpy as jnp

from ssmgate.bench import sweeps


def test_bench_grid_times_the_sweep_and_the_loop():
    one = lambda p, x: jnp.sum(p * x)
    params, data = jnp.arange(4.0), jnp.ones(4)
    sweep = jax.vmap(one)
    lines = []
    row = sweeps.bench_grid("toy", 1, one, (params, data, data), sweep, reps=1, log=lines.append)
    assert row["replicas"] == 4 and row["speedup"] == row["loop_s"] / row["sweep_s"] > 0
    assert lines and lines[0].startswith("| toy | 4 |")
    text = sweeps.markdown({"date": "d", "cpu": "c", "cores": 2, "jax": "j", "command": "cmd", "reps": 1, "rows": [row]})
    assert "| toy | 4 |" in text and text.count("\n") >= 3
