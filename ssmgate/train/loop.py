"""The training loop: owns every side effect of a run (DESIGN.md "Training contract").

One loop serves a single run and a vmapped sweep; what differs comes in as functions:
  step_fn(state, batch) -> (state, metrics)   jitted, pure; metrics["nonfinite"] as in train.step
  batch_fn(k) -> batch                        the batch of step k, a function of (seed, k) only
  eval_fn(state) -> dict                      optional, every `eval_every` steps and at the end
  after_eval(state, k, evals) -> state        optional (a sweep's early stopping / escape steps)
  done_fn(state) -> bool                      optional: stop before `steps` (every replica stopped)

Resume is automatic: when <run_dir>/checkpoints holds a checkpoint the loop restores the latest
readable one onto `abstract_state` (the current mesh's shardings), drops the metrics lines written
after it and continues; because batches depend only on (seed, k), the resumed run ends with the
parameters of an uninterrupted one. A non-finite loss or gradient in a single run saves the last
good state and raises `TrainingDiverged` naming the step and the quantity; in a sweep the step
freezes the replica instead and the loop reports it.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from ssmgate.train.checkpoint import CheckpointError, Checkpointer  # noqa: F401  (CheckpointError re-exported)
from ssmgate.train.run_dir import RunDir, say, to_jsonable
from ssmgate.train.writers import MetricWriters

NONFINITE_WHAT = {1: "the loss", 2: "a gradient"}


class TrainingDiverged(RuntimeError):
    """A single run's loss or gradient is not finite; the message names the step and the quantity."""


@dataclasses.dataclass(frozen=True)
class LoopCfg:
    steps: int
    log_every: int = 50
    eval_every: int = 0        # 0: evaluate only at the end
    ckpt_every: int = 0        # 0: checkpoint only at the end (and when stopping on a non-finite step)
    keep_ckpts: int = 3
    tensorboard: bool = True
    name: str = "train"

    def validate(self) -> "LoopCfg":
        for field in ("steps", "log_every"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}={getattr(self, field)}: expected an integer >= 1")
        for field in ("eval_every", "ckpt_every"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field}={getattr(self, field)}: expected an integer >= 0 (0 = only at the end)")
        if self.keep_ckpts < 1:
            raise ValueError(f"keep_ckpts={self.keep_ckpts}: expected >= 1")
        return self


@dataclasses.dataclass
class LoopResult:
    state: Any
    step: int
    resumed_from: Optional[int]
    last_eval: dict
    wall_s: float


def _mean_records(records: list[dict]) -> dict:
    """Averages a window of per-step metrics (scalars or per-replica arrays) over the window."""
    keys = [k for k in records[0] if k != "nonfinite"]
    return {k: np.mean(np.stack([np.asarray(r[k], np.float64) for r in records]), axis=0) for k in keys}


def _short(metrics: dict, keys=("loss", "accuracy", "seq_accuracy", "grad_norm")) -> str:
    parts = []
    for k in keys:
        if k in metrics:
            v = np.asarray(metrics[k])
            parts.append(f"{k} {float(v):.4g}" if v.ndim == 0 else f"{k} {float(v.min()):.3g}..{float(v.max()):.3g}")
    return ", ".join(parts)


def _check_nonfinite(metrics: dict, k: int) -> Optional[str]:
    """The message for a non-finite single-run step, or None (sweeps freeze replicas themselves)."""
    code = np.asarray(metrics.get("nonfinite", 0))
    if code.ndim == 0 and int(code) != 0:
        return f"step {k + 1}: {NONFINITE_WHAT.get(int(code), 'a quantity')} is not finite"
    return None


def run(run_dir: RunDir, cfg: LoopCfg, *, init_state: Callable[[], Any], abstract_state, step_fn, batch_fn,
        eval_fn=None, after_eval=None, done_fn=None, meta: dict, fingerprint: str) -> LoopResult:
    cfg.validate()
    t0 = time.perf_counter()
    ckpt = Checkpointer(run_dir.file("checkpoints"), keep=cfg.keep_ckpts, save_every=cfg.ckpt_every or None)
    meta = dict(meta, fingerprint=fingerprint)
    resumed_from = None
    if ckpt.latest_step() is not None:
        start, state, _ = ckpt.restore(abstract_state, expect_fingerprint=fingerprint)
        resumed_from = start
        dropped = run_dir.truncate_metrics(start) if jax.process_index() == 0 else 0
        say(f"[{cfg.name}] resumed from the checkpoint of step {start}"
             + (f" (dropped {dropped} metrics lines written after it)" if dropped else ""))
    else:
        start, state = 0, init_state()
    writers = MetricWriters(run_dir, tensorboard=cfg.tensorboard)
    window: list[dict] = []
    last_eval: dict = {}
    eval_step = None
    t_window, k_window = time.perf_counter(), start
    k = start

    def evaluate(state, k):
        nonlocal last_eval, eval_step
        eval_step = k
        if eval_fn is None:
            return state
        evals = jax.device_get(eval_fn(state))
        last_eval = {f"eval_{name}": v for name, v in evals.items()}
        writers.write(k, last_eval, kind="eval")
        if after_eval is not None:
            state = after_eval(state, k, evals)
        return state

    try:
        while k < cfg.steps:
            state_before = state
            state, metrics = step_fn(state, batch_fn(k))
            # One host sync per step: a non-finite step must stop the run before the next one is
            # dispatched (the metrics are a few scalars, or K-vectors in a sweep).
            metrics = jax.device_get(metrics)
            message = _check_nonfinite(metrics, k)
            if message is not None:
                ckpt.save(k, state_before, meta=meta, force=True)
                writers.write(k + 1, {"error": message}, kind="error")
                raise TrainingDiverged(f"{message}; the last good state (step {k}) is saved in "
                                       f"{run_dir.file('checkpoints')}/{k}")
            window.append(metrics)
            k += 1
            if k % cfg.log_every == 0 or k == cfg.steps:
                avg = _mean_records(window)
                now = time.perf_counter()
                steps_per_s = (k - k_window) / max(now - t_window, 1e-9)
                writers.write(k, dict(avg, steps_per_s=steps_per_s), kind="train")
                eta = (cfg.steps - k) / max(steps_per_s, 1e-9)
                say(f"[{cfg.name}] step {k}/{cfg.steps} | {_short(avg)} | {steps_per_s:.2f} steps/s, ETA {eta:.0f}s")
                window, t_window, k_window = [], now, k
            if cfg.eval_every and k % cfg.eval_every == 0 and k < cfg.steps:
                state = evaluate(state, k)
            if ckpt.should_save(k) and k < cfg.steps:
                ckpt.save(k, state, meta=meta)
            if done_fn is not None and done_fn(state):
                say(f"[{cfg.name}] every replica has stopped at step {k}")
                break
        if eval_step != k:
            state = evaluate(state, k)
        if ckpt.latest_step() != k:
            ckpt.save(k, state, meta=meta, force=True)
    finally:
        writers.close()
        ckpt.close()
    return LoopResult(state, k, resumed_from, to_jsonable(last_eval), time.perf_counter() - t0)
