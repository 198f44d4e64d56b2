"""SIGTERM outside the training loop (a preemption notice while Python imports JAX, or while the
run starts) exits with status 75 and one line, as inside it: a scheduler requeues on 75, and the
first seconds of a run used to end with 143 (killed by the signal), which it does not requeue."""
import signal
import subprocess
import sys
import time
from pathlib import Path

from ssmgate.train.preemption import EXIT_PREEMPTED
from tests.main_runs import run_many

REPO = Path(__file__).resolve().parents[2]
TINY = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=16", "--n_layers=1", "--d_state=8",
        "--headdim=8", "--batch=4", "--seq_len=9", "--task=copy", "--tensorboard=false", "--lr=5e-3", "--steps=4"]


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signal.SIGTERM - 1) & 1)


def test_sigterm_while_the_entry_point_imports_exits_75(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ssmgate.main", *TINY, f"--run_dir={tmp_path / 'run'}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None and not catches_sigterm(proc.pid):
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)  # the handler is in place from before the heavy imports on
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, (proc.returncode, err[-2000:])
    assert err.strip().splitlines() == ["[ssmgate] SIGTERM received outside the training loop: stopped with nothing "
                                        "new to save (the checkpoints are as they were); run the same command again "
                                        "to resume"], err[-2000:]
    assert "[ssmgate] program" not in out and not (tmp_path / "run").exists()


def test_sigterm_while_the_run_starts_exits_75_and_leaves_the_record(tmp_path):
    run = tmp_path / "run"
    at_start = """
import os, signal
from ssmgate.train import lm_runs
real = lm_runs.build_run
def build_run(*args, **kwargs):  # a preemption notice while the model is built
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
mp.setattr(lm_runs, "build_run", build_run)
"""
    first, stopped, again = run_many([[*TINY, f"--run_dir={run}"], [*TINY, "--steps=6", f"--run_dir={run}"],
                                      [*TINY, "--steps=6", f"--run_dir={run}"]], patches=[None, at_start, None])
    assert first.returncode == 0, first.stderr[-2000:]
    assert stopped.returncode == EXIT_PREEMPTED and stopped.stderr.strip().startswith(
        "[ssmgate] SIGTERM received outside the training loop"), stopped.stderr[-2000:]
    assert len(stopped.stderr.strip().splitlines()) == 1
    # the record was left as it was: the next start still reads the run as set to 4 steps
    assert again.returncode == 0 and "extending the run from --steps=4 to 6" in again.stdout, again.stderr[-2000:]
    assert not (run / "flags.txt.staged").exists()
