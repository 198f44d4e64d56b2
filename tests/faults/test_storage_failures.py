"""A full disk (ENOSPC), a read-only filesystem (EROFS) or no permission (EACCES), simulated by
making the write that meets it raise, on every file a run writes: the run lock, flags.txt,
metrics.jsonl, TensorBoard events and checkpoints (sync and async). Each ends in one StorageError
line naming the path, the cause and what is intact, and each leaves what was written as it was."""
import errno
import json
import logging
import os
import sys

import jax
import jax.numpy as jnp
import pytest
from etils import epath

from ssmgate.storage_error import StorageError, cause
from ssmgate.train import orbax_noise
from ssmgate.train.checkpoint import Checkpointer, CheckpointWriteError
from ssmgate.train.run_dir import RunDir
from ssmgate.train.run_lock import RunLock

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text, text
    return text


def test_the_cause_is_the_os_reason_also_where_tensorstore_only_writes_its_code():
    assert cause(ENOSPC) == "No space left on device (ENOSPC)"
    wrapped = ValueError('RESOURCE_EXHAUSTED: Error writing "x": Failed to write 172353 bytes to file 8: No space '
                         "left on device [os_error_code='28']")
    assert cause(wrapped) == "No space left on device (ENOSPC)"
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as inner:
            raise RuntimeError("save failed") from inner
    except RuntimeError as outer:
        assert cause(outer) == "Read-only file system (EROFS)"


def lock_file(target) -> bool:
    return str(target).endswith("/.lock") or (isinstance(target, int) and os.readlink(f"/proc/self/fd/{target}")
                                              .endswith("/.lock"))


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_run_lock_that_cannot_be_written_is_one_line_and_changes_nothing(tmp_path, monkeypatch, code):
    (tmp_path / "flags.txt").write_text("--steps=3\n")
    rd = RunDir(tmp_path)
    real_open, real_write = os.open, os.write

    def failing(real):
        def call(target, *args, **kwargs):
            if lock_file(target):
                raise OSError(code, os.strerror(code))
            return real(target, *args, **kwargs)
        return call
    if code == errno.ENOSPC:  # the lock file exists; writing the holder fails
        monkeypatch.setattr(os, "write", failing(real_write))
    else:
        monkeypatch.setattr(os, "open", failing(real_open))
    with pytest.raises(StorageError) as e, RunLock(rd):
        pass
    monkeypatch.undo()
    assert f"cannot write the run lock {tmp_path}/.lock: {os.strerror(code)}" in one_line(e.value)
    assert "nothing in the run directory was changed" in str(e.value)
    assert (tmp_path / "flags.txt").read_text() == "--steps=3\n"
    with RunLock(rd):  # and once the disk is back, the lock is taken
        pass


def test_a_staged_flags_file_that_cannot_be_written_leaves_flags_txt_and_no_temporary(tmp_path, monkeypatch):
    rd = RunDir(tmp_path)
    rd.write_text("flags.txt", "--steps=3\n")
    real = type(epath.Path(tmp_path)).write_text

    def half_then_full(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2])
        raise ENOSPC
    monkeypatch.setattr(type(epath.Path(tmp_path)), "write_text", half_then_full)
    with pytest.raises(StorageError) as e:
        rd.stage("flags.txt", "--steps=6\n--lr=1\n")
    assert one_line(e.value) == (f"cannot write {tmp_path}/flags.txt.staged (No space left on device (ENOSPC)); it "
                                 "is as it was (written whole or not at all)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flags.txt"]
    assert (tmp_path / "flags.txt").read_text() == "--steps=3\n"


def test_a_metrics_line_that_cannot_be_written_is_cut_back_so_the_next_one_is_whole(tmp_path, monkeypatch):
    rd = RunDir(tmp_path)
    rd.log_metrics({"step": 2, "kind": "train", "loss": 1.0})
    before = (tmp_path / "metrics.jsonl").read_text()
    monkeypatch.setattr("os.fsync", lambda fd: (_ for _ in ()).throw(ENOSPC))
    with pytest.raises(StorageError) as e:
        rd.log_metrics({"step": 4, "kind": "train", "loss": 0.5})
    assert one_line(e.value) == (f"cannot append to {tmp_path}/metrics.jsonl (No space left on device (ENOSPC)); "
                                 "its lines before step 4 are intact")
    assert (tmp_path / "metrics.jsonl").read_text() == before
    monkeypatch.undo()
    rd.log_metrics({"step": 4, "kind": "train", "loss": 0.5})
    assert [r["step"] for r in rd.read_metrics()] == [2, 4]


def test_tensorboard_events_that_cannot_be_written_are_one_line_and_closing_raises_nothing(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    from tensorboardX.record_writer import RecordWriter

    from ssmgate.train.writers import MetricWriters
    writers = MetricWriters(RunDir(tmp_path), tensorboard=True)
    writers.write(2, {"loss": 1.0}, kind="train")
    monkeypatch.setattr(RecordWriter, "flush", lambda self: (_ for _ in ()).throw(ENOSPC))
    with pytest.raises(StorageError) as e:
        writers.write(4, {"loss": 0.5}, kind="train")
    assert one_line(e.value).startswith(f"cannot write TensorBoard events to {tmp_path}/tensorboard/events.out.tfevents.")
    assert str(e.value).endswith(": No space left on device (ENOSPC); metrics.jsonl holds every metric")
    writers.close()  # nothing more is written to the failed file, and nothing raises again
    assert [r["step"] for r in RunDir(tmp_path).read_metrics()] == [2, 4]


def state_at(step: int):
    return {"w": jnp.full((64,), float(step)), "count": jnp.int32(step)}


def test_a_failed_background_save_is_named_by_its_own_step_with_the_os_cause(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints"
    ckpt = Checkpointer(path, async_save=True)
    ckpt.save(1, state_at(1), meta={}, force=True, wait=True)
    manager = type(ckpt._manager)
    real_wait = manager.wait_until_finished

    def background_failure(self):  # what orbax raises when tensorstore met a full disk
        raise ValueError('RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database: Failed writing: "d/1f": Failed '
                         "to write 1024 bytes to file 8: No space left on device [os_error_code='28']")
    calls = []

    def wait(self):  # the wait inside orbax's save of step 2 passes; the next one meets the failure
        calls.append(1)
        return real_wait(self) if len(calls) == 1 else background_failure(self)
    monkeypatch.setattr(manager, "wait_until_finished", wait)
    ckpt.save(2, state_at(2), meta={}, force=True)  # returns: the write goes on in the background
    with pytest.raises(CheckpointWriteError) as e:
        ckpt.save(3, state_at(3), meta={}, force=True)
    assert one_line(e.value) == (f"cannot write checkpoint step 2 to {path}: No space left on device (ENOSPC); the "
                                 f"checkpoints already there ([1]) are intact")
    ckpt.close()  # the failure is reported once; orbax raising it again at close is not
    monkeypatch.setattr(manager, "wait_until_finished", real_wait)
    with Checkpointer(path) as again:
        step, state, _ = again.restore(jax.eval_shape(lambda: state_at(0)))
    assert step in (1, 2) and float(state["w"][0]) == step  # step 2 was written after all here: either is whole


def test_orbax_echoes_of_a_failed_save_are_dropped_and_nothing_else(tmp_path, capsys):
    orbax_noise.quiet()
    absl = logging.getLogger("absl")

    def record(pathname, exc):
        return logging.LogRecord("absl", logging.ERROR, pathname, 1, "save failed", None, exc)
    exc_info = (OSError, ENOSPC, None)
    assert not all(f.filter(record("/x/site-packages/orbax/checkpoint/future.py", exc_info)) for f in absl.filters)
    assert all(f.filter(record("/x/site-packages/orbax/checkpoint/future.py", None)) for f in absl.filters)
    assert all(f.filter(record("/x/ssmgate/train/loop.py", exc_info)) for f in absl.filters)
    import asyncio
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as closed:
        sys.excepthook(type(closed), closed, closed.__traceback__)
    sys.excepthook(RuntimeError, RuntimeError("Event loop is closed"), None)  # not asyncio's: shown
    err = capsys.readouterr().err
    assert err.count("Event loop is closed") == 1 and "call_soon_threadsafe" not in err


def test_a_full_disk_mid_run_is_one_line_and_the_same_command_resumes(tmp_path):
    """Through the entry point: metrics.jsonl, TensorBoard events, flags.txt and the run lock each
    fail once (a read-only run directory for the lock); each is one line on stderr, exit status 1,
    naming the file and the checkpoints that are intact; the run then resumes and finishes."""
    from tests.main_runs import run_many
    run = tmp_path / "run"
    args = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=16", "--n_layers=1", "--d_state=8",
            "--headdim=8", "--batch=4", "--seq_len=9", "--task=copy", "--log_every=2", "--lr=5e-3", "--steps=6",
            "--ckpt_every=2", f"--run_dir={run}"]
    full = "(_ for _ in ()).throw(OSError(28, 'No space left on device'))"
    metrics_at_4 = """
import builtins
from ssmgate.train import run_dir

class HalfLine:  # the disk fills up in the middle of the train line of step 4
    def __init__(self, f):
        self.f = f
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, line):
        if '"kind": "train"' in line and '"step": 4,' in line:
            self.f.write(line[:10])
            self.f.flush()
            raise OSError(28, "No space left on device")
        return self.f.write(line)
    def __getattr__(self, name):
        return getattr(self.f, name)
mp.setattr(run_dir, "open", lambda *a, **k: HalfLine(builtins.open(*a, **k)), raising=False)
"""
    events_at_6 = f"""
from tensorboardX.record_writer import RecordWriter
calls = []
def flush(self):
    calls.append(1)
    if len(calls) == 4:  # the file's header, then steps 2, 4 and 6
        {full}
mp.setattr(RecordWriter, "flush", flush)
"""
    staged = f"""
from etils import epath
from pathlib import Path
real = type(epath.Path("/")).write_text
mp.setattr(type(epath.Path("/")), "write_text",
           lambda self, text, *a, **k: {full} if self.name == "flags.txt.staged.tmp" else real(self, text, *a, **k))
"""
    read_only = """
import os
real = os.open
mp.setattr(os, "open", lambda p, *a, **k: (_ for _ in ()).throw(OSError(30, "Read-only file system"))
           if str(p).endswith(".lock") else real(p, *a, **k))
"""
    pytest.importorskip("tensorboardX")
    runs = [(metrics_at_4, f"cannot append to {run}/metrics.jsonl (No space left on device (ENOSPC)); its lines "
                           f"before step 4 are intact; the checkpoints in {run}/checkpoints (steps [2]) are intact"),
            (events_at_6, f"cannot write TensorBoard events to {run}/tensorboard/events.out.tfevents."),
            (staged, f"cannot write {run}/flags.txt.staged (No space left on device (ENOSPC))"),
            (read_only, f"cannot write the run lock {run}/.lock: Read-only file system (EROFS); nothing in the run "
                        f"directory was changed")]
    results = run_many([args] * (len(runs) + 1), patches=[p for p, _ in runs] + [None])
    for (_, expected), res in zip(runs, results):
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1 and expected in lines[0], res.stderr[-3000:]
        assert "fix the cause and run the same command again to resume from step" in lines[0]
    assert "(steps [2, 4]) are intact" in results[1].stderr  # a full disk at step 6 keeps 4
    assert results[-1].returncode == 0 and "resumed from the checkpoint of step 4" in results[-1].stdout
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "train"]
    assert steps == [2, 4, 6]
