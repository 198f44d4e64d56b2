"""The sweep benchmark's end-to-end part: a grid of models trained as separate runs of
`python -m ssmgate.main --program=train`, one after another, against the same grid as one sweep run.

Each run is a fresh process, as a user launches them, so what is timed is everything a run costs:
start-up, compilation, training, evaluation, checkpoints, metrics and plots. The per-step
comparison (ssmgate.bench.train.bench_sweep) shares one compiled program between the 16 runs and
so measures the vmapped step alone; this measures what a researcher waits for. Every run's final
evaluation loss is compared with the sweep's for the same replica (the two must train the same
models), and each run's training loop (its summary's wall_s) is timed beside its whole process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ssmgate.models.config import ModelCfg
from ssmgate.tasks.synthetic_lm import SyntheticCfg

# A final loss of a separate run and of its sweep replica may differ by float rounding (a vmapped
# step sums in another order), amplified over the run; beyond this the two did not train one model.
LOSS_AGREEMENT = 1e-2


def run_flags(cfg: ModelCfg, task: SyntheticCfg, steps: int) -> list[str]:
    """The train program's flags for cfg on task; evaluation, metrics and checkpoints as a run has them."""
    return ["--program=train", f"--block={cfg.block}", f"--vocab_size={cfg.vocab_size}", f"--d_model={cfg.d_model}",
            f"--n_layers={cfg.n_layers}", f"--d_state={cfg.d_state}", f"--headdim={cfg.headdim}",
            f"--task={task.task}", f"--seq_len={task.seq_len}", f"--batch={task.batch}", f"--steps={steps}",
            "--opt_name=adamw", "--opt_weight_decay=0.0", f"--opt_warmup_steps={max(1, steps // 20)}",
            f"--log_every={max(1, steps // 5)}", f"--eval_every={max(1, steps // 2)}",
            f"--ckpt_every={max(1, steps // 2)}", "--seed=0"]


def _launch(flags: Sequence[str], run_dir: Path, log) -> tuple[float, dict]:
    """(wall seconds, summary.json) of one `python -m ssmgate.main` process."""
    cmd = [sys.executable, "-m", "ssmgate.main", *flags, f"--run_dir={run_dir}"]
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # every run compiles, as a run launched on its own does
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"bench runs: {' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    log(f"[bench runs] {run_dir.name}: {wall:.1f} s")
    return wall, summary


def bench_runs(cfg: ModelCfg, task: SyntheticCfg, lrs: Sequence[float], offsets: Sequence[float], steps: int,
               log=print, work_dir: str | None = None) -> dict:
    """Wall time of len(lrs) x len(offsets) separate runs against one sweep run of the same grid."""
    base = run_flags(cfg, task, steps)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        root = Path(tmp)
        sweep_wall, sweep_summary = _launch(
            base + ["--train_sweep", "--lr=" + ",".join(f"{lr:g}" for lr in lrs),
                    "--gate_offset=" + ",".join(f"{o:g}" for o in offsets)], root / "sweep", log)
        walls, losses, loops = [], [], []
        # sweep.grid's order: offsets outermost, then learning rates (one seed)
        for i, (offset, lr) in enumerate((o, lr) for o in offsets for lr in lrs):
            wall, summary = _launch(base + [f"--lr={lr:g}", f"--gate_offset={offset:g}"], root / f"run{i:02d}", log)
            walls.append(wall)
            losses.append(summary["final"]["loss"])
            loops.append(summary["wall_s"])  # the training loop's own time: steps, compilation, evals, checkpoints
    k = len(walls)
    sweep_losses = np.asarray(sweep_summary["final"]["loss"], np.float64)
    diff = np.abs(np.asarray(losses) - sweep_losses) / np.maximum(np.abs(sweep_losses), 1e-12)
    if not np.all(diff <= LOSS_AGREEMENT):
        raise RuntimeError(f"bench runs: the separate runs' final losses differ from the sweep's by up to "
                           f"{diff.max():.3g} (relative), expected <= {LOSS_AGREEMENT:g}: they did not train the same models")
    sequential = float(sum(walls))
    row = {"replicas": k, "steps": steps, "batch": task.batch, "seq_len": task.seq_len,
           "sweep_s": sweep_wall, "sequential_s": sequential, "speedup": sequential / sweep_wall,
           "run_s_mean": float(np.mean(walls)), "run_loop_s_mean": float(np.mean(loops)),
           "sweep_loop_s": float(sweep_summary["wall_s"]),
           "max_rel_loss_diff": float(diff.max())}
    log(f"[bench runs] {k} runs one after another {row['sequential_s']:.1f} s vs one sweep run {sweep_wall:.1f} s "
        f"-> {row['speedup']:.1f}x (a run: {row['run_s_mean']:.1f} s, of which its loop {row['run_loop_s_mean']:.1f} s)")
    return row
