"""One writer per run directory, and a refused resume that keeps the run's record."""
import json
import os
import subprocess
import sys
import time

import pytest

from ssmgate.train.run_dir import RunDir
from ssmgate.train.run_lock import RunDirBusy, RunLock
from tests.main_runs import run_many

HOLD = """
import sys, time
from ssmgate.train.run_dir import RunDir
from ssmgate.train.run_lock import RunLock
with RunLock(RunDir(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_a_second_holder_is_refused_with_the_first_ones_pid_and_a_killed_holder_leaves_no_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy, match=rf"is in use by pid {holder.pid} on .* wait for that run"):
            with RunLock(RunDir(tmp_path)):
                pass
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the kernel drops the lock
        holder.wait()
    with RunLock(RunDir(tmp_path)):  # not stale: taken at once
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


TINY = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=16", "--n_layers=1", "--d_state=8",
        "--headdim=8", "--batch=4", "--seq_len=9", "--task=copy", "--tensorboard=false", "--log_every=2"]


def test_a_refused_resume_keeps_flags_txt_and_names_the_changed_flags_and_a_busy_dir_is_refused(tmp_path):
    run = tmp_path / "run"
    first, refused = run_many([[*TINY, "--steps=4", "--lr=5e-3", f"--run_dir={run}"],
                               [*TINY, "--steps=4", "--lr=1e-2", f"--run_dir={run}"]])
    assert first.returncode == 0, first.stderr[-2000:]
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "cannot resume" in refused.stderr and "--lr: 5e-3 -> 1e-2" in refused.stderr
    assert "--lr=5e-3" in (run / "flags.txt").read_text() and not (run / "flags.txt.staged").exists()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        (busy,) = run_many([[*TINY, "--steps=4", "--lr=5e-3", f"--run_dir={run}"]])
    finally:
        holder.kill()
        holder.wait()
    assert busy.returncode == 2 and f"in use by pid {holder.pid}" in busy.stderr, busy.stderr[-2000:]
    metrics = (run / "metrics.jsonl").read_text()
    assert metrics.count('"kind": "train"') == 2  # the refused and the busy run wrote nothing
    (cadence,) = run_many([[*TINY, "--steps=4", "--lr=5e-3", "--log_every=4", f"--run_dir={run}"]])
    assert cadence.returncode == 0, cadence.stderr[-2000:]  # same configuration: accepted and recorded
    assert "--log_every=4" in (run / "flags.txt").read_text()


def test_a_run_dir_that_cannot_be_created_is_one_clear_line(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (res,) = run_many([[*TINY, "--steps=2", "--lr=5e-3", f"--run_dir={tmp_path / 'a_file' / 'run'}"]])
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "cannot create the run directory" in res.stderr and "expected a writable directory" in res.stderr


def test_more_steps_extend_a_run_on_the_schedule_it_trained_with(tmp_path):
    """--steps 4 -> 6 on a finished run: accepted and recorded; the result is bit-identical to a fresh
    6-step run on a 4-step schedule. A schedule that ends at lr 0 cannot be extended (one line)."""
    run, ref, flat = tmp_path / "run", tmp_path / "ref", tmp_path / "flat"
    common = [*TINY, "--lr=5e-3", "--opt_final_lr_frac=0.1", "--ckpt_every=2"]
    first, extended, fresh, zero, zero_extended = run_many([
        [*common, "--steps=4", f"--run_dir={run}"],
        [*common, "--steps=6", f"--run_dir={run}"],
        [*common, "--steps=6", "--schedule_steps=4", f"--run_dir={ref}"],
        [*TINY, "--lr=5e-3", "--opt_final_lr_frac=0", "--steps=4", f"--run_dir={flat}"],
        [*TINY, "--lr=5e-3", "--opt_final_lr_frac=0", "--steps=6", f"--run_dir={flat}"]])
    for res in (first, extended, fresh, zero):
        assert res.returncode == 0, res.stderr[-2000:]
    assert "extending the run from --steps=4 to 6 on the schedule it trained with (--schedule_steps=4)" \
        in extended.stdout
    flags_txt = (run / "flags.txt").read_text()
    assert "--steps=6" in flags_txt and "--schedule_steps=4" in flags_txt
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "train"]
    assert steps == [2, 4, 6]
    digest = lambda d: json.loads((d / "summary.json").read_text())["params_digest"]  # noqa: E731
    assert digest(run) == digest(ref)
    assert zero_extended.returncode != 0 and "Traceback" not in zero_extended.stderr
    assert "schedule ends at lr 0 (--opt_final_lr_frac=0)" in zero_extended.stderr, zero_extended.stderr[-2000:]
    assert "--steps=4" in (flat / "flags.txt").read_text()
