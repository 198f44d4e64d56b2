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
"""
from __future__ import annotations

import signal
import threading

import jax

EXIT_PREEMPTED = 75


class Preempted(Exception):
    """The run saved a checkpoint at `step` and stopped because it was asked to (a signal)."""

    def __init__(self, step: int, reason: str, checkpoint_dir: str):
        self.step, self.reason = step, reason
        super().__init__(f"{reason}: stopped after step {step} with a checkpoint in {checkpoint_dir}; "
                         f"run the same command again to resume")


class StopRequests:
    """A context manager around the loop: `requested(step)` says whether to save and stop after
    `step`; `reason` says why."""

    def __init__(self):
        self._signal: int | None = None
        self._previous: dict[int, object] = {}
        self._distributed = False

    def __enter__(self) -> "StopRequests":
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
