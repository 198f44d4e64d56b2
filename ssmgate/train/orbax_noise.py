"""Keeps orbax's echoes of a failed checkpoint write off the terminal: the Checkpointer reports
every failed save itself, in one `CheckpointWriteError` line that names the step, the cause and
the checkpoints that are intact.

A failed write (a full disk) made orbax log the exception with its traceback from each thread that
saw it, and made tensorstore print `RuntimeError: Event loop is closed` tracebacks for writes
that finished after orbax had closed the event loop of the failed save: hundreds of lines before
the one that says what happened. `quiet()` drops exactly those: orbax's log records that carry a
traceback, and that RuntimeError where tensorstore hands it to sys.excepthook/sys.unraisablehook.
"""
from __future__ import annotations

import logging
import sys

_CLOSED_LOOP = "Event loop is closed"


class _OrbaxTracebacks(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and "/orbax/" in record.pathname.replace("\\", "/"))


def _closed_loop(value) -> bool:
    """asyncio's RuntimeError for a callback scheduled on a closed event loop (raised by asyncio itself)."""
    if not (isinstance(value, RuntimeError) and str(value) == _CLOSED_LOOP and value.__traceback__):
        return False
    tb = value.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return "asyncio" in tb.tb_frame.f_code.co_filename


def quiet() -> None:
    """Installs the filters once per process (absl's logger, sys.excepthook, sys.unraisablehook)."""
    if getattr(quiet, "done", False):
        return
    quiet.done = True
    logging.getLogger("absl").addFilter(_OrbaxTracebacks())
    excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

    def on_exception(kind, value, tb):
        if not _closed_loop(value):
            excepthook(kind, value, tb)

    def on_unraisable(info):
        if not _closed_loop(info.exc_value):
            unraisablehook(info)

    sys.excepthook, sys.unraisablehook = on_exception, on_unraisable
