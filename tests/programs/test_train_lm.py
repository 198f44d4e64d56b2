"""The `train` program end to end, in subprocesses: bad flags, dry runs of the paper model files,
a SIGKILL mid-run, and (slow) 8 simulated devices and two processes joined by jax.distributed."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.main_runs import dry_run_flag_files, run_many
from tests.subprocess_env import with_cpu_devices

REPO = Path(__file__).resolve().parents[2]
TINY = ["--program=train", "--block=mamba2", "--vocab_size=16", "--d_model=32", "--n_layers=2", "--d_state=8",
        "--headdim=16", "--batch=8", "--lr=3e-3", "--seq_len=15", "--task=copy", "--tensorboard=false"]


def run_main(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ssmgate.main", *args], cwd=REPO, capture_output=True, text=True,
                          env=env)


def summary(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def train_losses(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]


BAD_FLAGS = [
    (["--d_model=-3"], "--d_model=-3: expected an integer >= 1"),
    (["--opt_name=rmsprop"], "--opt_name='rmsprop': expected one of"),
    (["--block=rnn"], "--block='rnn'"),
    (["--mesh_data=3"], "--mesh_data=3"),
    (["--seq_len=2"], "--seq_len=2: expected >= 5"),
    (["--d_modle=3"], "Unknown command line flag 'd_modle'"),
    (["--steps=abc"], "flag --steps=abc"),
    (["--lr=1e-3,-1"], "--lr=1e-3,-1: expected positive, finite"),
    (["--steps=0"], "--steps=0: expected an integer >= 1"),
    (["--lr=0"], "--lr=0: expected positive, finite"),
    (["--lr=nan"], "--lr=nan: expected positive, finite"),
    (["--lr=inf"], "--lr=inf: expected positive, finite"),
    (["--batch=9", "--mesh_data=2"], "--batch=9 does not split over the data axis of 2 devices"),
    (["--block=llama", "--n_heads=2", "--mlp=swiglu", "--gate_offset=0,1"],
     "--gate_offset=0,1: gate offsets act on Mamba-2's A_log; --block=llama has none"),
]


@pytest.fixture(scope="module")
def bad_flag_runs(tmp_path_factory):
    """Every BAD_FLAGS case through the entry point, in one child process: [(run dir, Result)]."""
    run_dirs = [tmp_path_factory.mktemp("bad_flag") / "run" for _ in BAD_FLAGS]
    results = run_many([[*TINY, "--steps=3", *args, f"--run_dir={d}"] for (args, _), d in zip(BAD_FLAGS, run_dirs)])
    return list(zip(run_dirs, results))


@pytest.mark.parametrize("case", range(len(BAD_FLAGS)), ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_a_bad_flag_fails_with_its_name(bad_flag_runs, case):
    message = BAD_FLAGS[case][1]
    run_dir, res = bad_flag_runs[case]
    assert res.returncode != 0
    assert message in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert not (run_dir / "summary.json").exists()


def test_dry_run_checks_the_batch_against_all_devices(tmp_path):
    """--mesh_data=-1 (all devices) is resolved against the devices here, as the run does, and an
    odd batch on two devices is refused by --dry_run (train and p2_lm) with the flag named."""
    res = run_many([[*TINY, "--steps=3", "--batch=9", "--mesh_data=-1", "--dry_run"],
                    ["--flagfile=experiments/p2/quick/lm_rope0.flags", "--batch=9", "--mesh_data=-1", "--dry_run"],
                    [*TINY, "--steps=3", "--batch=8", "--mesh_data=-1", "--dry_run"]], env=with_cpu_devices(2))
    for r in res[:2]:
        assert r.returncode != 0 and "--batch=9 does not split over the data axis of 2 devices" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert res[2].returncode == 0 and "mesh {'replica': 1, 'data': 2" in res[2].stdout, res[2].stderr[-2000:]


def test_every_paper_model_file_dry_runs_with_the_papers_size():
    files = sorted((REPO / "experiments" / "models").glob("*.flags"))
    assert len(files) == 10
    for name, res in dry_run_flag_files(files).items():
        path = Path(name)
        assert res.returncode == 0, (path, res.stderr[-2000:])
        out = res.stdout
        assert "parameters of p" in out and "total" in out and "mesh {" in out and "embed/embedding" in out
        line = next(line for line in out.splitlines() if line.strip().startswith("total"))
        count = int(line.split()[1].replace(",", ""))
        stated = [line for line in out.splitlines() if "the paper states" in line]
        if stated:  # the sizes the papers state: within 5%
            assert abs(float(re.search(r"this model is ([-+0-9.]+)%", stated[0]).group(1))) <= 5.0
        assert "Check: --dry_run prints" in path.read_text()
        claimed = path.read_text().split("Check: --dry_run prints ")[1].split(" parameters")[0]
        value, unit = claimed.split()
        assert abs(count - float(value) * {"M": 1e6, "B": 1e9}[unit]) / count < 0.005, (path.name, count, claimed)


def test_sigkill_mid_run_then_restart_ends_bit_identical(tmp_path):
    args = [*TINY, "--steps=120", "--log_every=1", "--ckpt_every=10", "--keep_ckpts=2"]
    ref = run_main(*args, f"--run_dir={tmp_path / 'ref'}")
    assert ref.returncode == 0, ref.stderr[-2000:]
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "ssmgate.main", *args, f"--run_dir={run_dir}"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        ckpts = run_dir / "checkpoints"
        steps = [int(p.name) for p in ckpts.iterdir() if p.name.isdigit()] if ckpts.exists() else []
        if steps and max(steps) >= 30:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "summary.json").exists(), "the run finished before it could be killed"
    res = run_main(*args, f"--run_dir={run_dir}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed from the checkpoint of step" in res.stdout
    assert summary(run_dir)["params_digest"] == summary(tmp_path / "ref")["params_digest"]
    assert train_losses(run_dir) == train_losses(tmp_path / "ref")  # each step logged once, same values


def test_divergence_saves_the_last_good_state_and_says_so_in_one_line(tmp_path):
    (res,) = run_many([[*TINY, "--steps=40", "--lr=1e6", "--ckpt_every=3", "--log_every=1", f"--run_dir={tmp_path}"]])
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    found = re.search(r"training diverged: step (\d+): (the loss|a gradient) is not finite; the last good state "
                      r"\(step (\d+)\) is saved", res.stderr)
    assert found and int(found[3]) == int(found[1]) - 1, res.stderr
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert found[3] in saved and not [n for n in saved if "tmp" in n], saved
    errors = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "error"]
    assert [r["step"] for r in errors] == [int(found[1])]


EIGHT = with_cpu_devices(8)


@pytest.mark.slow  # the default suite checks sharded == one device at the step level (tests/train/test_mesh.py)
def test_sharded_training_on_8_devices_matches_one_device(tmp_path):
    args = [*TINY, "--steps=20", "--log_every=1", "--block=mamba2"]
    single = run_main(*args, f"--run_dir={tmp_path / 'one'}")
    assert single.returncode == 0, single.stderr[-2000:]
    reference = train_losses(tmp_path / "one")
    assert len(reference) == 20
    # FSDP over `data` and heads over `model` at once; tests/train/test_mesh.py checks tp and fsdp apart.
    res = run_main(*args, "--mesh_data=4", "--mesh_model=2", "--mesh_params=fsdp_tp", f"--run_dir={tmp_path / 'sharded'}",
                   env=EIGHT)
    assert res.returncode == 0, res.stderr[-2000:]
    losses = train_losses(tmp_path / "sharded")
    assert len(losses) == 20
    for a, b in zip(losses, reference):
        assert abs(a - b) <= 1e-5 * abs(b), (a, b)


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_joined_by_jax_distributed_agree_with_one(tmp_path):
    args = [*TINY, "--steps=6", "--log_every=1", "--mesh_data=2"]
    one = run_main(*args, f"--run_dir={tmp_path / 'one'}", env=with_cpu_devices(2))
    assert one.returncode == 0, one.stderr[-2000:]
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "ssmgate.main", *args, "--distributed",
                               f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}",
                               f"--run_dir={tmp_path / 'two'}"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert "process 1/2" in outs[1][0]
    for a, b in zip(train_losses(tmp_path / "two"), train_losses(tmp_path / "one")):
        assert abs(a - b) <= 1e-5 * abs(b)
    assert summary(tmp_path / "two")["params_digest"] == summary(tmp_path / "one")["params_digest"]


def test_gate_offset_sweep_through_the_program(tmp_path, capsys):
    """A Mamba-2 sweep (2 offsets x 2 learning rates) in process: escape and stop rules, summary keys."""
    from ssmgate.models.config import ModelCfg
    from ssmgate.programs.train_lm import program as train_lm
    from ssmgate.tasks.synthetic_lm import SyntheticCfg
    from ssmgate.train import loop, mesh, optim, sweep
    from ssmgate.train.run_spec import Grid, RunSpec
    spec = RunSpec(model=ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8),
                   optim=optim.OptimCfg(name="adamw", lr=1e-2, total_steps=6),
                   loop=loop.LoopCfg(steps=6, log_every=2, eval_every=2, tensorboard=False), mesh=mesh.MeshCfg(),
                   grid=Grid(offsets=(-2.0, 1.0), more_lrs=(3e-2,)),
                   stop=sweep.StopRule("loss", escape_thr=0.0, stop_thr=0.0))
    cfg = train_lm.TrainLMCfg(task=SyntheticCfg("copy", batch=4, seq_len=9, vocab_size=16), spec=spec,
                              eval_batches=1).validate()
    out = train_lm.run(cfg, tmp_path)
    # loss >= 0 always: every replica "escapes" and stops at the first evaluation (step 2).
    assert out["escape_step"] == [2, 2, 2, 2] and out["stopped_step"] == [2, 2, 2, 2]
    assert out["steps"] == 2 and "every replica has stopped at step 2" in capsys.readouterr().out
    assert len(out["final"]["loss"]) == 4 and out["diverged"] == [False] * 4
    assert (tmp_path / "curves.png").exists() and json.loads((tmp_path / "summary.json").read_text()) == out


CHECK_TRAIN_FILES = """
import sys
from absl import flags
import ssmgate.main  # defines every flag
from ssmgate.programs.train_lm import flags as train_lm_flags
for path in sys.argv[1:]:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["check", "--flagfile=" + path])
    cfg = train_lm_flags.config_from_flags()
    print(path.rsplit("/", 1)[-1], cfg.spec.model.d_model, cfg.task.task, len(cfg.spec.replicas), cfg.spec.stop.escape_thr)
"""


def test_train_flag_files_validate_and_compose():
    files = sorted(str(p) for p in (REPO / "experiments" / "train").rglob("*.flags"))
    res = subprocess.run([sys.executable, "-c", CHECK_TRAIN_FILES, *files], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines())
    assert lines["mamba2_copy.flags"] == "64 copy 1 None"
    # the sweep file includes the copy file (--flagfile) and adds 4 offsets x 2 seeds
    assert lines["mamba2_offset_sweep.flags"] == "64 copy 8 0.9"


CHECK_LR_FLAGS = """
from absl import flags
import ssmgate.main  # defines every flag
from ssmgate.programs.train_lm import flags as train_lm_flags
from ssmgate.config_error import ConfigError
for args in (["--lr=1e-3,2e-3"], []):
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["check", "--program=train", "--steps=3", "--batch=4", *args])
    try:
        cfg = train_lm_flags.config_from_flags()
        print([r.lr for r in cfg.spec.replicas], cfg.spec.optim.lr)
    except ConfigError as e:
        print("error:", e)
"""


def test_a_learning_rate_grid_is_a_sweep_and_no_lr_is_an_error():
    res = subprocess.run([sys.executable, "-c", CHECK_LR_FLAGS], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == ["[0.001, 0.002] 0.001", "error: --lr is required for --program=train"]
