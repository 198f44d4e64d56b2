"""Fault injection through the entry point: a run killed with SIGKILL at a random moment (mid-save
included), or stopped with SIGTERM or SIGINT, then started again with the same command, ends with
the parameters of an uninterrupted run. One SIGTERM and one SIGINT trial in the default suite
(tests/programs/test_train_lm.py has its SIGKILL trial); ten of each signal with `-m slow`, and ten
of each on an extended run (40 steps, then the same command with --steps=150, interrupted and run
again: what a SLURM requeue does), which must end as a fresh run on the 40-step schedule."""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ssmgate.train.preemption import EXIT_PREEMPTED

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=32", "--n_layers=2", "--d_state=8",
        "--headdim=16", "--batch=8", "--lr=3e-3", "--seq_len=15", "--task=copy", "--tensorboard=false",
        "--steps=150", "--log_every=5", "--ckpt_every=10", "--keep_ckpts=2"]


def main_cmd(run_dir):
    return [sys.executable, "-m", "ssmgate.main", *ARGS, f"--run_dir={run_dir}"]


def digest(run_dir) -> str:
    return json.loads((Path(run_dir) / "summary.json").read_text())["params_digest"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("faults") / "ref"
    res = subprocess.run(main_cmd(run_dir), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    return run_dir


def first_checkpoint_then(proc, run_dir, extra_s: float, after: int = 0) -> None:
    """Waits until the run has saved its first checkpoint past step `after`, then `extra_s` seconds more."""
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        ckpts = run_dir / "checkpoints"
        if ckpts.exists() and any(p.name.isdigit() and int(p.name) > after for p in ckpts.iterdir()):
            break
        time.sleep(0.02)
    time.sleep(extra_s)


def interrupt_and_resume(reference, run_dir, sig, trial, after: int = 0):
    summary = run_dir / "summary.json"
    before = summary.read_text() if summary.exists() else None  # an extended run has its first summary
    proc = subprocess.Popen(main_cmd(run_dir), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first_checkpoint_then(proc, run_dir, random.Random(trial).uniform(0.0, 1.0), after)
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be interrupted (exit {proc.returncode})")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == EXIT_PREEMPTED, err[-2000:]
        assert "run the same command again to resume" in out
        stopped = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert stopped[-1]["kind"] == "stopped" and str(stopped[-1]["step"]) in os.listdir(run_dir / "checkpoints")
    assert (summary.read_text() if summary.exists() else None) == before, "the interrupted run wrote a summary"
    res = subprocess.run(main_cmd(run_dir), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert digest(run_dir) == digest(reference)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == sorted(set(steps)), "a metrics line was written twice"


SIGNALS = [signal.SIGKILL, signal.SIGTERM, signal.SIGINT]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_one_interruption_then_resume_is_bit_identical(tmp_path, reference, sig):
    interrupt_and_resume(reference, tmp_path / "run", sig, trial=0)


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(1, 11))
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_ten_interruptions_at_random_moments(tmp_path, reference, sig, trial):
    interrupt_and_resume(reference, tmp_path / "run", sig, trial)


@pytest.fixture(scope="module")
def extension(tmp_path_factory):
    """(a run of 40 steps to extend, the reference: a fresh run of 150 steps on the 40-step schedule)."""
    root = tmp_path_factory.mktemp("extension")
    for run_dir, extra in ((root / "base", ["--steps=40"]), (root / "ref", ["--schedule_steps=40"])):
        res = subprocess.run([*main_cmd(run_dir), *extra], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
    return root / "base", root / "ref"


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(1, 11))
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_ten_interruptions_of_an_extended_run_at_random_moments(tmp_path, extension, sig, trial):
    base, reference = extension
    shutil.copytree(base, tmp_path / "run")
    interrupt_and_resume(reference, tmp_path / "run", sig, trial, after=40)
    flags_txt = (tmp_path / "run" / "flags.txt").read_text()
    assert "--steps=150" in flags_txt and "--schedule_steps=40" in flags_txt
