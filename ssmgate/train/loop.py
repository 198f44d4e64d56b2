"""The training loop: owns every side effect of a run (docs/extending.md, "The training contract").

One loop serves a single run and a vmapped sweep; what differs comes in as functions:
  step_fn(state, batch) -> (state, metrics)   jitted, pure; metrics["nonfinite"] as in train.step
  batch_fn(k) -> batch                        the batch of step k, a function of (seed, k) only
  eval_fn(state) -> dict                      optional, every `eval_every` steps and at the end
  after_eval(state, k, evals) -> state        optional (a sweep's early stopping / escape steps)
  done_fn(state) -> bool                      optional: stop before `steps` (every replica stopped);
                                              asked after evaluations and at progress lines

Resume is automatic: when <run_dir>/checkpoints holds a checkpoint the loop restores the latest
readable one onto `abstract_state` (the current mesh's shardings), drops the metrics lines written
after it and continues; because batches depend only on (seed, k), the resumed run ends with the
parameters of an uninterrupted one. Without a checkpoint it starts at step 0 and drops any metrics
lines of an earlier attempt, so metrics.jsonl always tells the story of the checkpoints.

The host never waits for the step it has just dispatched: the metrics of step k are read after
step k + 1 is queued, so an accelerator always has work. A non-finite loss or gradient in a single
run halts the state at its last good value (train.step), and the loop, one step later, saves that
state and raises `TrainingDiverged` naming the step and the quantity (also recorded in
metrics.jsonl); in a sweep the step freezes the replica instead and the loop reports it.
SIGTERM and SIGINT (train.preemption) finish the current step, save and raise `Preempted`.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from ssmgate.train.checkpoint import CheckpointError, Checkpointer  # noqa: F401  (CheckpointError re-exported)
from ssmgate.train.preemption import Preempted, StopRequests
from ssmgate.train.run_dir import RunDir, say, to_jsonable
from ssmgate.train.step import unhalt
from ssmgate.train.throughput import Throughput, format_rate, peak_flops
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
    ckpt_async: bool = False   # saves return once the state is copied to the host (checkpoint.py)
    profile_steps: Optional[tuple[int, int]] = None  # (first, last): a jax.profiler trace of those steps
    wandb_project: str = ""    # W&B project to log to ("" = none; needs the wandb package)

    def validate(self) -> "LoopCfg":
        for field in ("steps", "log_every"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}={getattr(self, field)}: expected an integer >= 1")
        for field in ("eval_every", "ckpt_every"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field}={getattr(self, field)}: expected an integer >= 0 (0 = only at the end)")
        if self.keep_ckpts < 1:
            raise ValueError(f"keep_ckpts={self.keep_ckpts}: expected >= 1")
        if self.profile_steps is not None:
            first, last = self.profile_steps
            if not 1 <= first <= last <= self.steps:
                raise ValueError(f"profile_steps={first}:{last}: expected FIRST:LAST with 1 <= FIRST <= LAST <= "
                                 f"steps={self.steps}")
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
    """The progress line's metrics; a sweep's as the range over its replicas whose value is finite
    (a diverged replica would make every range nan..nan) and how many are not."""
    parts = []
    for k in keys:
        if k in metrics:
            v = np.asarray(metrics[k], np.float64)
            if v.ndim == 0:
                parts.append(f"{k} {float(v):.4g}")
                continue
            finite = v[np.isfinite(v)]
            text = f"{k} {finite.min():.3g}..{finite.max():.3g}" if finite.size else f"{k} nan"
            parts.append(text + (f" ({v.size - finite.size} of {v.size} not finite)" if finite.size < v.size else ""))
    return ", ".join(parts)


def _check_nonfinite(metrics: dict, k: int) -> Optional[str]:
    """The message for a non-finite single-run step, or None (sweeps freeze replicas themselves)."""
    code = np.asarray(metrics.get("nonfinite", 0))
    if code.ndim == 0 and int(code) != 0:
        return f"step {k + 1}: {NONFINITE_WHAT.get(int(code), 'a quantity')} is not finite"
    return None


def _progress_rates(steps_per_s: float, throughput: Optional[Throughput], peak: Optional[float]) -> tuple[dict, str]:
    """The throughput metrics of a progress line and their text."""
    rates, text = {"steps_per_s": steps_per_s}, f"{steps_per_s:.2f} steps/s"
    if throughput is not None:
        rates["tokens_per_s"] = tokens_per_s = steps_per_s * throughput.tokens_per_step
        text += f", {format_rate(tokens_per_s)} tokens/s"
        if peak and throughput.model_flops_per_step:
            rates["mfu"] = mfu = steps_per_s * throughput.model_flops_per_step / peak
            text += f", MFU {100 * mfu:.1f}%"
    return rates, text


class _Profile:
    """A jax.profiler trace of steps first..last (1-based) into <run_dir>/profile."""

    def __init__(self, run_dir: RunDir, steps: Optional[tuple[int, int]]):
        self.dir, self.steps, self.on = run_dir.file("profile"), steps, False

    def before_step(self, k: int) -> None:
        if self.steps is not None and k + 1 == self.steps[0]:
            jax.profiler.start_trace(str(self.dir))
            self.on = True

    def after_step(self, k: int, state) -> None:
        if self.on and k == self.steps[1]:
            self.stop(state)

    def stop(self, state=None) -> None:
        if self.on:
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            self.on = False
            say(f"[profile] trace of steps {self.steps[0]}..{self.steps[1]} in {self.dir}")


def _close_quietly(*closers) -> None:
    """Runs every closer; their own errors (a full disk fails them too) would hide the first one."""
    for close in closers:
        try:
            close()
        except Exception:
            pass


def _start(run_dir: RunDir, cfg: LoopCfg, ckpt: Checkpointer, init_state, abstract_state, fingerprint: str,
           main: bool):
    """(start step, state, resumed_from): the latest readable checkpoint, else a fresh state; the
    metrics lines after the start are dropped and the staged flags become the run's record."""
    resumed_from = None
    if ckpt.latest_step() is not None:
        start, state, _ = ckpt.restore(abstract_state, expect_fingerprint=fingerprint)
        resumed_from = start
        dropped = run_dir.truncate_metrics(start) if main else 0
        say(f"[{cfg.name}] resumed from the checkpoint of step {start}"
            + (f" (dropped {dropped} metrics lines written after it)" if dropped else ""))
    else:
        start, state = 0, init_state()
        dropped = run_dir.truncate_metrics(0) if main else 0
        if dropped:
            say(f"[{cfg.name}] no checkpoint: starting at step 0 (dropped {dropped} metrics lines of an earlier attempt)")
    if main:
        run_dir.promote("flags.txt")  # the configuration is accepted: its flags become the run's record
    return start, state, resumed_from


def run(run_dir: RunDir, cfg: LoopCfg, *, init_state: Callable[[], Any], abstract_state, step_fn, batch_fn,
        eval_fn=None, after_eval=None, done_fn=None, meta: dict, fingerprint: str,
        throughput: Optional[Throughput] = None) -> LoopResult:
    """`throughput` (tokens and model FLOPs of one step) adds tokens/s and MFU to the progress lines."""
    cfg.validate()
    t0 = time.perf_counter()
    ckpt = Checkpointer(run_dir.file("checkpoints"), keep=cfg.keep_ckpts, save_every=cfg.ckpt_every or None,
                        async_save=cfg.ckpt_async)
    meta = dict(meta, fingerprint=fingerprint)
    main = jax.process_index() == 0
    try:
        start, state, resumed_from = _start(run_dir, cfg, ckpt, init_state, abstract_state, fingerprint, main)
    except BaseException:
        _close_quietly(ckpt.close)
        raise
    peak = peak_flops()[0] if throughput is not None and throughput.model_flops_per_step else None
    logged_eval_at_start = any(r.get("kind") == "eval" and r.get("step") == start for r in run_dir.read_metrics()) \
        if main and start == cfg.steps else False
    writers = None  # made inside the try below: a failure there must still close the checkpointer
    profile = _Profile(run_dir, cfg.profile_steps)
    window: list[dict] = []
    last_eval: dict = {}
    eval_step = None
    t_window, k_window = time.perf_counter(), start
    k = start
    pending = None  # (k, metrics on device) of the step dispatched last, read one step later

    def evaluate(state, k, write=True):
        nonlocal last_eval, eval_step
        eval_step = k
        if eval_fn is None:
            return state
        evals = jax.device_get(eval_fn(state))
        last_eval = {f"eval_{name}": v for name, v in evals.items()}
        if write:
            writers.write(k, last_eval, kind="eval")
        if after_eval is not None:
            state = after_eval(state, k, evals)
        return state

    def settle(state):
        """Reads the pending step's metrics (waiting for it); stops the run if it was not finite."""
        nonlocal pending
        if pending is None:
            return
        k_bad, metrics = pending[0], jax.device_get(pending[1])
        pending = None
        message = _check_nonfinite(metrics, k_bad)
        if message is not None:
            good = unhalt(state)  # the halted state holds the values after step k_bad - 1 ...
            ckpt.save(k_bad, good, meta=meta, force=True, wait=True)  # ... whatever was dispatched after
            writers.write(k_bad + 1, {"error": message}, kind="error")
            raise TrainingDiverged(f"{message}; the last good state (step {k_bad}) is saved in "
                                   f"{run_dir.file('checkpoints')}/{k_bad}")
        window.append(metrics)

    with StopRequests() as stop:
        try:
            writers = MetricWriters(run_dir, tensorboard=cfg.tensorboard, wandb_project=cfg.wandb_project,
                                    config=meta.get("config"))
            while k < cfg.steps:
                profile.before_step(k)
                state, metrics = step_fn(state, batch_fn(k))
                settle(state)  # the previous step's metrics: by now the device is busy with step k
                pending = (k, metrics)
                k += 1
                profile.after_step(k, state)
                log_now = k % cfg.log_every == 0 or k == cfg.steps
                eval_now = bool(cfg.eval_every) and k % cfg.eval_every == 0 and k < cfg.steps
                save_now = ckpt.should_save(k) and k < cfg.steps
                stop_now = stop.requested(k)  # every step: a multi-process run agrees on the step this way
                if log_now or eval_now or save_now or stop_now:
                    settle(state)
                if log_now:
                    avg = _mean_records(window)
                    now = time.perf_counter()
                    steps_per_s = (k - k_window) / max(now - t_window, 1e-9)
                    rates, rate_text = _progress_rates(steps_per_s, throughput, peak)
                    writers.write(k, dict(avg, **rates), kind="train")
                    eta = (cfg.steps - k) / max(steps_per_s, 1e-9)
                    say(f"[{cfg.name}] step {k}/{cfg.steps} | {_short(avg)} | {rate_text}, ETA {eta:.0f}s")
                    window, t_window, k_window = [], now, k
                if eval_now:
                    state = evaluate(state, k)
                if save_now or stop_now:
                    ckpt.save(k, state, meta=meta, force=stop_now, wait=stop_now)
                if stop_now:
                    writers.write(k, {"stopped": stop.reason}, kind="stopped")
                    raise Preempted(k, stop.reason, str(run_dir.file("checkpoints")))
                if done_fn is not None and (log_now or eval_now) and done_fn(state):
                    say(f"[{cfg.name}] every replica has stopped at step {k}")
                    break
            settle(state)
            profile.stop(state)
            if eval_step != k:
                state = evaluate(state, k, write=not logged_eval_at_start)
            if ckpt.latest_step() != k:
                ckpt.save(k, state, meta=meta, force=True)
        except BaseException:
            _close_quietly(profile.stop, *([writers.close] if writers else []), ckpt.close)  # the first error tells
            raise
        profile.stop()
        writers.close()
        ckpt.close()
    return LoopResult(state, k, resumed_from, to_jsonable(last_eval), time.perf_counter() - t0)
