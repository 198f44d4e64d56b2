"""docs/extending.md's worked examples run: the experiment's flags.py and program.py, copied out of the
page into a package under ssmgate.programs, registered by the page's registry line and run through
ssmgate.main from the page's flag file; the core, copied out likewise, registered by the page's
registry entry and benchmarked."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"

# The package lives outside the repository, found under ssmgate.programs as if it were in it; the
# registry gets the page's own line.
DRIVER = """
import sys
import ssmgate.programs
ssmgate.programs.__path__.append(sys.argv[1])
from ssmgate.programs import registry
line = open(sys.argv[1] + "/registry_line.txt").read().strip().rstrip(",")
program = eval(line, vars(registry))
registry.PROGRAMS[program.name] = program
import ssmgate.main
from absl import app
app.run(ssmgate.main.main, argv=["ssmgate.main", *sys.argv[2:]], flags_parser=ssmgate.main.parse_flags)
"""


def blocks(lang: str) -> list[str]:
    """The page's fenced code blocks whose info string is `lang` ('' = none), in order."""
    out, current, info = [], None, None
    for line in PAGE.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, info = [], line[3:].strip()
            else:
                if info == lang:
                    out.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return out


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    root = tmp_path_factory.mktemp("extending")
    pkg = root / "copy_demo"
    pkg.mkdir()
    flags_py, program_py = blocks("python")
    assert "GROUPS_READ" in flags_py and "run_experiment" in program_py
    (pkg / "__init__.py").write_text('"""docs/extending.md\'s example."""\n')
    (pkg / "flags.py").write_text(flags_py)
    (pkg / "program.py").write_text(program_py)
    [flag_file] = [b for b in blocks("") if b.startswith("--program=copy_demo")]
    (root / "copy_demo.flags").write_text(flag_file)
    [line] = [b for b in blocks("") if b.startswith('Program("copy_demo", "ssmgate.programs.copy_demo")')]
    (root / "registry_line.txt").write_text(line)
    return root


def main(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER, str(root), *args], cwd=REPO, capture_output=True, text=True)


def test_the_worked_example_trains_its_sweep(example, tmp_path):
    res = main(example, f"--flagfile={example / 'copy_demo.flags'}", f"--run_dir={tmp_path / 'run'}")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["offsets"] == [-2.0, 0.0, 2.0] and summary["steps"] == 4
    assert len(summary["eval_loss"]) == 3 and all(math.isfinite(v) and v > 0 for v in summary["eval_loss"])
    assert (tmp_path / "run" / "flags.txt").read_text().count("--gate_offset=-2,0,2") == 1


def test_the_worked_example_has_its_own_help_and_refuses_other_flags(example):
    res = main(example, "--program=copy_demo", "--help")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "copy_demo's own flags:" in res.stdout and "--demo_eval_batches" in res.stdout
    assert "--gate_offset" in res.stdout and "--kv_query" not in res.stdout
    bad = main(example, f"--flagfile={example / 'copy_demo.flags'}", "--kv_m=3", "--dry_run")
    assert bad.returncode != 0 and "--kv_m is not a flag of --program=copy_demo (it is one of p1_kv)" in bad.stderr


def test_the_worked_core_is_registered_and_benchmarked(tmp_path, monkeypatch):
    core_py, entry = blocks("python core")
    (tmp_path / "no_decay_core.py").write_text(core_py)
    monkeypatch.syspath_prepend(str(tmp_path))
    import no_decay_core
    from ssmgate.bench import cores as bench
    from ssmgate.cores import registry
    core = eval(entry.strip().rstrip(","), {**vars(registry), "no_decay": no_decay_core.no_decay})
    monkeypatch.setitem(registry.CORES, core.name, core)
    assert "no_decay" in registry.benchmarked()
    shape = (2, 17, 4, 3, 5, 2, 1)   # b, t, h, p, n, g, r: an odd length, two groups
    rows = bench.bench_core("no_decay", shape, peak=1e9, chunk_sizes={"no_decay": [8]}, reps=1, max_seconds=1.0,
                            log=lambda s: None)
    assert [(r["algorithm"], r["mode"]) for r in rows] == [
        ("sequential", "fwd"), ("sequential", "fwd+bwd"), ("associative", "fwd"), ("associative", "fwd+bwd")]
    for row in rows:   # each algorithm against the float64 sequential run
        assert row["rel_err"] < 1e-5 and row["flops"] > 0, row
    inputs = bench.make_inputs("no_decay", *shape)
    assert sorted(inputs) == ["B", "C", "D", "dt", "x"] and inputs["B"].shape == (2, 17, 2, 5)
    y, final = bench.core_fn("no_decay", "sequential")(inputs)
    assert y.shape == (2, 17, 4, 3) and final.shape == (2, 4, 3, 5)
