"""reproduce.write_report: a partial invocation (--only) keeps the other experiments' sections and
summary entries from the earlier report at the same scale, in the registry's order; run_wall does
not report a resumed run's process time as its cost."""
import json
import os

from ssmgate import reproduce
from ssmgate.train.run_dir import RunDir


def _write(where, fresh, scale="cpu", failed=()):
    summary = {name: {"value": name} for name in fresh}
    return reproduce.write_report(where, "# header\n", fresh, summary, list(failed), scale)


def test_partial_invocation_keeps_earlier_experiments(tmp_path):
    where = RunDir(str(tmp_path))
    _write(where, {"p1_kv": "## KV\nold kv\n", "p1_fig1": "## Fig 1\nfig1 text\n"})
    text, summary = _write(where, {"p1_kv": "## KV\nnew kv\n"}, failed=["p1_kv/kv_best_last"])
    assert text.index("## Fig 1") < text.index("## KV")          # registry order, not invocation order
    assert "new kv" in text and "old kv" not in text and "fig1 text" in text
    assert reproduce.earlier_sections(text) == {"p1_fig1": "## Fig 1\nfig1 text", "p1_kv": "## KV\nnew kv"}
    written = json.loads(where.file("summary.json").read_text())
    assert written == summary
    # a kept entry is checked again by today's checks (none for this stand-in entry)
    assert written["failed_runs"] == ["p1_kv/kv_best_last"] and written["p1_fig1"] == {"value": "p1_fig1", "checks": {}}
    assert text.index("## What reproduced") < text.index("## Fig 1") and set(written["claims"]) == {
        c.key for c in reproduce.registry.claim_rows()}


def test_other_scale_or_unmarked_report_is_not_kept(tmp_path):
    where = RunDir(str(tmp_path))
    _write(where, {"p1_fig1": "## Fig 1\n"}, scale="quick")
    text, summary = _write(where, {"p1_kv": "## KV\n"}, scale="cpu")
    assert "## Fig 1" not in text and "p1_fig1" not in summary
    where.write_text("report.md", "# an old report without markers\n## Fig 1\n")
    text, _ = _write(where, {"p1_kv": "## KV\n"}, scale="cpu")
    assert "## Fig 1" not in text


def test_runs_share_one_compilation_cache_unless_the_user_set_one(monkeypatch):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    env = reproduce.compile_cache_env("/tmp/shared")
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/tmp/shared" and env["PATH"] == os.environ["PATH"]
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/mine")
    assert reproduce.compile_cache_env("/tmp/shared")["JAX_COMPILATION_CACHE_DIR"] == "/mine"


def _summary(run_dir, **kw):
    run_dir.mkdir(exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(kw))
    return run_dir


def test_wall_time_of_a_resumed_run_is_not_its_cost(tmp_path, capsys):
    fresh = _summary(tmp_path / "fresh", steps=100, resumed_from=None)
    assert reproduce.run_wall(fresh, 42.0, earlier=900.0) == 42.0
    untracked = _summary(tmp_path / "untracked", steps=100)   # a program that does not record resumes
    assert reproduce.run_wall(untracked, 42.0, earlier=900.0) == 42.0
    done = _summary(tmp_path / "done", steps=100, resumed_from=100)   # complete already: nothing trained now
    assert reproduce.run_wall(done, 5.0, earlier=900.0) == 900.0
    assert reproduce.run_wall(done, 5.0, earlier=None) is None
    partway = _summary(tmp_path / "partway", steps=100, resumed_from=40)
    assert reproduce.run_wall(partway, 300.0, earlier=900.0) is None
    out = capsys.readouterr().out
    assert "done resumed from step 100 of 100: wall time 900s kept" in out
    assert "partway resumed from step 40 of 100: wall time unknown" in out
