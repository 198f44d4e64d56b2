"""The accelerator check of issue #39 (ssmgate/bench/device_check.py) on CPU at toy sizes (--dry: the
kernels interpret): the table, the JSON written as it goes, the budget cut-off, SIGTERM, the upstream
rows skipped with a note where torch or the upstream folder is missing, the auto classes and the
training step. The real run is launch/device_check.sh on the accelerator machine."""
import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest

from ssmgate.bench import device_check as dc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dry(**changes):
    return dataclasses.replace(dc._dry_settings(), **changes)


def _files(out):
    result = json.loads((out / "device_check.json").read_text())
    table = (out / "device_check.md").read_text()
    return result, table


def test_speed_and_auto_rows_with_upstream_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(dc, "CORES", ("rotation",))
    settings = _dry(auto_classes=((None, None, 20, (1, 2, 16, 16)),))
    result = dc.run_check(settings, ["speed", "auto"], 600.0, tmp_path, tmp_path / "no_upstream", "cmd",
                          log=lambda s: None)
    rows = {(r["part"], r["item"]): r for r in result["rows"]}
    for name in ("chunked/16", "pallas/16"):
        for mode in ("fwd", "fwd+bwd"):
            r = rows[("speed", f"{name} {mode}")]
            assert r["seconds"] > 0 and r["tokens_per_s"] > 0 and r["roofline_pct"] > 0, r
            assert r["vs_upstream"] is None and r["vs_chunked"] == pytest.approx(
                rows[("speed", f"chunked/16 {mode}")]["seconds"] / r["seconds"])
    skipped = [r for r in result["rows"] if "mamba3_siso_combined" in r["item"]]
    assert len(skipped) == 2 and all(r["result"].startswith("skipped: upstream unavailable") for r in skipped)
    assert any("launch/fetch_upstream.sh" in n for n in result["notes"])
    entry = result["auto_table"]["rotation"][0]
    assert entry["max_t"] is None and {e["algorithm"] for e in entry["timings"]} == {"chunked", "pallas"}
    table = json.loads((tmp_path / "auto_table.dry.json").read_text())   # toy sizes: not auto_table.json
    assert table["cpu"]["rotation"] == result["auto_table"]["rotation"] and not (tmp_path / "auto_table.json").exists()
    written, md = _files(tmp_path)
    assert written["rows"] == json.loads(json.dumps(result["rows"], default=str))
    assert md.count("\n| speed | rotation |") == 6 and "| auto | rotation |" in md
    assert md.startswith("**--dry: toy sizes, not a measurement.**")
    assert "fetch_upstream.sh" in md and "interrupted" not in md


def test_budget_cuts_every_part_after_the_roofline(tmp_path):
    result = dc.run_check(_dry(), list(dc.PARTS), 0.0, tmp_path, tmp_path, "cmd", log=lambda s: None)
    parts = {r["part"] for r in result["rows"]}
    assert parts == {"roofline", "check", "speed", "train", "auto"}
    for r in result["rows"]:
        if r["part"] != "roofline" and "upstream unavailable" not in r["result"]:
            assert r["result"].startswith("skipped: budget"), r
    assert result["checks_passed"] and not result["auto_table"]
    assert not (tmp_path / "auto_table.json").exists()
    assert _files(tmp_path)[0]["rows"] == result["rows"]


def test_budget_allows_an_item_only_if_its_estimate_fits():
    now = [0.0]
    budget = dc.Budget(100.0, {"train": 60.0, "speed": 5.0}, clock=lambda: now[0])
    assert budget.allows("train") and budget.allows("speed")
    now[0] = 50.0
    assert not budget.allows("train") and budget.allows("speed")
    assert budget.why_not("train") == "skipped: budget (60 s estimated, 50 s left)"
    now[0] = 100.0
    assert not budget.allows("speed") and not budget.allows("unestimated")


def test_sigterm_leaves_the_files_of_what_was_done(tmp_path, monkeypatch):
    def killed(self):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(dc.Check, "check", killed)
    result = dc.run_check(_dry(), ["check", "speed"], 600.0, tmp_path, tmp_path, "cmd", log=lambda s: None)
    assert result["interrupted"] == f"signal {int(signal.SIGTERM)}"
    assert not any(r["part"] == "speed" for r in result["rows"])
    written, md = _files(tmp_path)
    assert written["interrupted"] and "(interrupted)" in md and "| roofline |" in md


def test_upstream_folder_present_but_torch_missing(tmp_path):
    (tmp_path / "mamba_ssm" / "ops" / "triton").mkdir(parents=True)
    (tmp_path / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py").write_text("raise RuntimeError('not imported')\n")
    up, why = dc.load_upstream(tmp_path)
    assert up is None
    try:
        import torch  # noqa: F401
    except ImportError:
        assert why.startswith("upstream rows skipped: torch and triton are needed")
    else:
        assert why.startswith("upstream rows skipped:")


def test_training_step_of_the_toy_mamba3():
    model, b, t = dc._dry_settings().train
    row = dc.train_step_row(model, b, t, peak=1e12, reps=1)
    assert row["seconds"] > 0 and row["tokens_per_s"] == pytest.approx(b * t / row["seconds"])
    assert 0 < row["roofline_pct"] < 100 and row["loss"] > 0 and "MFU" in row["result"]


def test_cli_refuses_a_cpu_backend_without_dry():
    res = subprocess.run([sys.executable, "-m", "ssmgate.bench", "device_check", "--parts=check"], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
    assert res.returncode != 0 and "pass --dry for toy sizes" in res.stderr + res.stdout
    res = subprocess.run(["bash", "launch/device_check.sh", "--parts=auto"], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "DRY": "1", "BUDGET_S": "90"})
    assert res.returncode == 0
    assert "-m ssmgate.bench device_check --budget_s=90 --check_out_dir=runs/device_check --parts=auto" in res.stdout
