"""Stopping a run on request without losing a step: SIGTERM (a scheduler's preemption notice) and
SIGINT (Ctrl-C) make the loop finish its current step, save a checkpoint and raise `Preempted`;
`ssmgate.main` then exits with status `EXIT_PREEMPTED` (75, EX_TEMPFAIL: "try again"), and the
same command resumes the run from that checkpoint.

One process: Python signal handlers set a flag that the loop reads at each step boundary. A
second Ctrl-C while the first is pending interrupts at once (KeyboardInterrupt, nothing saved
beyond the last checkpoint).

Several processes (`jax.distributed`): every process must save the same step, so the processes
agree on it through JAX's preemption sync point: JAX's coordination service catches SIGTERM in
any process and tells the others, and `reached_preemption_sync_point(step)` becomes true on every
process at the same step (orbax's `reached_preemption` is the same check). The loop asks at every
step, as that protocol requires. SIGINT is not shared between processes, so it keeps Python's
default (KeyboardInterrupt, no save) in a multi-process run.

Outside the loop (importing, compiling, restoring, evaluating after it) there is no step to save:
`catch_stop_signals()`, which `python -m ssmgate.main` calls before its heavy imports, makes
SIGTERM and SIGINT raise `Interrupted` there (once `armed()`; a signal before that is kept and
raised on arming), so the process still exits with EXIT_PREEMPTED and a requeue starts it again.
Without it a SIGTERM in the first seconds killed the process with status 143, which a scheduler
does not requeue. Every finished step is already in a checkpoint, so nothing is lost.

JAX is imported where it is used: this module is imported before JAX is.
"""
from __future__ import annotations

import contextlib
import signal
import threading

EXIT_PREEMPTED = 75


class Preempted(Exception):
    """The run saved a checkpoint at `step` and stopped because it was asked to (a signal)."""

    def __init__(self, step: int, reason: str, checkpoint_dir: str):
        self.step, self.reason = step, reason
        super().__init__(f"{reason}: stopped after step {step} with a checkpoint in {checkpoint_dir}; "
                         f"run the same command again to resume")


class Interrupted(Exception):
    """SIGTERM or SIGINT outside the training loop: the run stopped at once, nothing to save."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name} received outside the training loop: stopped with nothing "
                         f"new to save (the checkpoints are as they were); run the same command again to resume")


_outside = {"armed": False, "pending": None, "installed": False}


def _outside_the_loop(signum, frame) -> None:
    if _outside["armed"]:
        raise Interrupted(signum)
    _outside["pending"] = _outside["pending"] or signum


def catch_stop_signals() -> None:
    """Catches SIGTERM and SIGINT from now on (main thread only): kept until `armed()`, raised as
    `Interrupted` inside it. StopRequests takes them over for the training loop."""
    if not _outside["installed"] and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _outside_the_loop)
        _outside["installed"] = True


@contextlib.contextmanager
def armed():
    """While inside, a stop signal outside the loop raises `Interrupted` (at once if one came before)."""
    catch_stop_signals()
    pending, _outside["pending"] = _outside["pending"], None
    if pending is not None:
        raise Interrupted(pending)
    _outside["armed"] = True
    try:
        yield
    finally:
        _outside["armed"] = False


class StopRequests:
    """A context manager around the loop: `requested(step)` says whether to save and stop after
    `step`; `reason` says why."""

    def __init__(self):
        self._signal: int | None = None
        self._previous: dict[int, object] = {}
        self._distributed = False

    def __enter__(self) -> "StopRequests":
        import jax
        self._distributed = jax.process_count() > 1
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread (e.g. tests run the loop elsewhere)
        signals = () if self._distributed else (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self._signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self._signal = signum
        import jax
        if jax.process_index() == 0:
            print(f"[ssmgate] {signal.Signals(signum).name} received: saving after the current step "
                  f"(Ctrl-C again to stop without saving)", flush=True)

    def requested(self, step: int) -> bool:
        if self._distributed:
            from jax.experimental import multihost_utils
            try:
                reached = multihost_utils.reached_preemption_sync_point(int(step))
            except RuntimeError:  # the preemption service is off (jax_enable_preemption_service=False)
                return False
            if reached:
                self._signal = self._signal or signal.SIGTERM
            return reached
        return self._signal is not None

    @property
    def reason(self) -> str:
        name = signal.Signals(self._signal).name if self._signal is not None else "a stop request"
        return f"{name} (preemption notice shared by every process)" if self._distributed else name
