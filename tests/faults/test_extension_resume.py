"""An extended run is resumed by its own command (what a SLURM requeue runs again): stopped partway
(a stop request at step 6, as SIGTERM makes one), the same command resumes it from the run's
record and ends bit-identical to an uninterrupted extension (a fresh run on the
same schedule: tests/train/test_run_lock.py shows the two equal); a finished extension run again
changes nothing; the shorter original command is refused in one line and leaves the record."""
import json

from tests.main_runs import run_many

TINY = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=16", "--n_layers=1", "--d_state=8",
        "--headdim=8", "--batch=4", "--seq_len=9", "--task=copy", "--tensorboard=false", "--log_every=2",
        "--lr=5e-3", "--opt_final_lr_frac=0.1", "--ckpt_every=2"]
STOP_AFTER_6 = """
import signal
from ssmgate.train.preemption import StopRequests
def requested(self, step):
    if step >= 6:
        self._signal = signal.SIGTERM
    return step >= 6
mp.setattr(StopRequests, "requested", requested)
"""


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def digest(run_dir):
    return json.loads((run_dir / "summary.json").read_text())["params_digest"]


def test_a_stopped_extension_resumes_with_its_own_command_bit_identically(tmp_path):
    run, ref = tmp_path / "run", tmp_path / "ref"
    short, extend = [*TINY, "--steps=4"], [*TINY, "--steps=10"]
    results = run_many([[*extend, "--schedule_steps=4", f"--run_dir={ref}"],
                        [*short, f"--run_dir={run}"], [*extend, f"--run_dir={run}"], [*extend, f"--run_dir={run}"],
                        [*extend, f"--run_dir={run}"], [*short, f"--run_dir={run}"]],
                       patches=[None, None, STOP_AFTER_6, None, None, None])
    fresh, first, stopped, resumed, again, original = results
    for res in (fresh, first, resumed, again):
        assert res.returncode == 0, res.stderr[-2000:]
    assert stopped.returncode == 75 and "stopped after step 6" in stopped.stdout, stopped.stderr[-2000:]
    assert "resuming the run extended to --steps=10 on the schedule it trained with (--schedule_steps=4" \
        in resumed.stdout and "resumed from the checkpoint of step 6" in resumed.stdout
    assert digest(run) == digest(ref)
    assert [r["step"] for r in records(run) if r["kind"] == "train"] == [2, 4, 6, 8, 10]
    evals = [r["step"] for r in records(run) if r["kind"] == "eval"]
    assert evals == [4, 10], evals  # the finished extension run again evaluates nothing twice
    flags_txt = (run / "flags.txt").read_text()
    assert original.returncode == 2 and original.stderr.count("\n") == 1, original.stderr
    assert "--steps=4 is fewer than the 10 steps this run is set to" in original.stderr
    assert "expected --steps=10 (the command that set it) or more, or a new --run_dir" in original.stderr
    assert (run / "flags.txt").read_text() == flags_txt and "--steps=10" in flags_txt \
        and "--schedule_steps=4" in flags_txt
    assert [r["step"] for r in records(run) if r["kind"] == "eval"] == [4, 10]
