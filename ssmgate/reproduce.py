"""The main job: run every experiment's flag files at one scale and write the report.

    python -m ssmgate.reproduce --scale=quick|cpu|paper [--only=p1_fig1] [--out_dir=runs/reproduce] [--docs_dir=DIR]

Each run is `python -m ssmgate.main --flagfile=... --run_dir=OUT/<experiment>/<run>` in a subprocess
(its progress lines stream through); the runs share one JAX compilation cache, a temporary folder
per invocation. Afterwards OUT/summary.json gathers every run's summary.json
under its experiment's name, with the experiment's acceptance checks, and OUT/report.md shows each
figure beside a "paper / theory / ours" table and lists what the scale changed from the paper's flag
files. `--docs_dir DIR` also writes the report and its figures to DIR (docs/reproduction/).
A run folder that already holds checkpoints resumes from them; its wall time is then the earlier
invocation's if the run was complete, and unknown if it resumed partway (`run_wall`).

Experiments not selected by `--only` keep what an earlier invocation wrote: their summary entry
and their report section (between `<!-- experiment:NAME -->` markers) are carried over from the
existing OUT (and DIR) report, so regenerating one experiment does not drop the others.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from ssmgate.programs import registry
from ssmgate.report import claims
from ssmgate.report.format import replace_checks_table
from ssmgate.train.run_dir import RunDir

REPO = Path(__file__).resolve().parent.parent
SCALES = ("quick", "cpu", "paper")

# experiment -> (its folder experiments/<paper>/, its flag files there at [<scale>/]<run>.flags, its report module)
EXPERIMENTS = {name: (p.paper, p.runs, p.report) for name, p in registry.EXPERIMENTS.items()}

flags.DEFINE_enum("scale", "quick", SCALES, "quick (minutes), cpu (the issues' CPU runs) or paper (pods).")
flags.DEFINE_list("only", [], f"Experiments to run (default all): {', '.join(EXPERIMENTS)}.")
flags.DEFINE_string("out_dir", "runs/reproduce", "Output directory (report.md, summary.json, one folder per run).")
flags.DEFINE_string("docs_dir", None, "Also write report.md and its figures here (e.g. docs/reproduction).")
flags.DEFINE_boolean("report_only", False, "Rebuild the report from the existing run directories; run nothing.")
FLAGS = flags.FLAGS


def flag_file(paper: str, run: str, scale: str) -> Path:
    base = REPO / "experiments" / paper
    return base / f"{run}.flags" if scale == "paper" else base / scale / f"{run}.flags"


def read_flags(path: Path) -> dict[str, str]:
    """--name=value lines of a flag file (comments and blank lines skipped), with the lines of the
    files it includes by `--flagfile=` (relative to the repository, as `make reproduce` runs) in place."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("--"):
            name, _, value = line[2:].partition("=")
            if name == "flagfile":
                out.update(read_flags(REPO / value))
            else:
                out[name] = value
    return out


# Steps per compiled segment (and its name before the fig1_ prefix): when progress is shown, not a result.
PACING_FLAGS = ("fig1_segment", "segment")


def changes_from_paper(paper: str, run: str, scale: str) -> list[str]:
    """What this scale's flag file sets differently from the paper-scale one."""
    if scale == "paper":
        return []
    mine, ref = read_flags(flag_file(paper, run, scale)), read_flags(flag_file(paper, run, "paper"))

    def shown(flags: dict, k: str) -> str:  # an empty value resets what a scale must not inherit (--preset=)
        return "(unset)" if k not in flags else (flags[k] or "(none)")
    return [f"{k}: {shown(ref, k)} -> {shown(mine, k)}"
            for k in sorted(set(mine) | set(ref)) if mine.get(k) != ref.get(k) and k not in PACING_FLAGS]


def run_one(paper: str, run: str, scale: str, run_dir: Path, env: dict | None = None) -> tuple[bool, float]:
    cmd = [sys.executable, "-m", "ssmgate.main", f"--flagfile={flag_file(paper, run, scale)}", f"--run_dir={run_dir}"]
    print(f"[reproduce] {run}: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=REPO, env=env)
    return result.returncode == 0, time.perf_counter() - start


def run_wall(run_dir: Path, wall: float, earlier: float | None) -> float | None:
    """The wall time to report for a run whose process took `wall` seconds now. A run that continued
    from a checkpoint (its summary's "resumed_from") did not pay for the steps before it: resumed at
    its last step, nothing trained and the earlier invocation's time (`earlier`) stands; resumed
    partway, its cost is unknown (None), so the reports' time budgets do not judge it."""
    summary = json.loads((run_dir / "summary.json").read_text())
    start = summary.get("resumed_from")
    if start is None:
        return wall
    kept = earlier if start == summary.get("steps") else None
    print(f"[reproduce] {run_dir.name} resumed from step {start} of {summary.get('steps')}: wall time "
          + ("unknown (remove the run folder for a full rerun)" if kept is None else f"{kept:.0f}s kept from the run "
             "that trained it"), flush=True)
    return kept


def compile_cache_env(cache_dir: str) -> dict:
    """The runs' environment with one JAX compilation cache shared by this invocation's runs: rows
    that compile the same programs (P2's parity and mod 3 rows share every shape) compile them
    once. A user's own JAX_COMPILATION_CACHE_DIR is kept."""
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", cache_dir)
    return env


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    unknown = [e for e in FLAGS.only if e not in EXPERIMENTS]
    if unknown:
        raise app.UsageError(f"--only: unknown experiment(s) {unknown}; expected some of {', '.join(EXPERIMENTS)}")
    names = FLAGS.only or list(EXPERIMENTS)
    out = RunDir(FLAGS.out_dir)
    summary, sections, failed = {}, [], []
    previous = json.loads(out.file("summary.json").read_text()) if out.file("summary.json").exists() else {}
    t0 = time.perf_counter()
    # Fresh for every invocation (removed at the end), so that each one costs what a first run costs.
    cache = tempfile.TemporaryDirectory(prefix="ssmgate-jax-cache-")
    env = compile_cache_env(cache.name)
    for name in names:
        paper, runs, report = EXPERIMENTS[name]
        walls, ok_runs = {}, {}
        for i, run in enumerate(runs):
            run_dir = out.path / name / run
            if FLAGS.report_only:  # keep the wall times measured when the runs ran
                ok = (run_dir / "summary.json").exists()
                wall = previous.get(name, {}).get("wall_s", {}).get(run)
            else:
                print(f"[reproduce] {name} {i + 1}/{len(runs)} ({FLAGS.scale} scale), "
                      f"{time.perf_counter() - t0:.0f}s elapsed", flush=True)
                ok, wall = run_one(paper, run, FLAGS.scale, run_dir, env)
                if ok:
                    wall = run_wall(run_dir, wall, previous.get(name, {}).get("wall_s", {}).get(run))
            walls[run], ok_runs[run] = wall, ok
            if not ok:
                failed.append(f"{name}/{run}")
        if FLAGS.report_only and not any(ok_runs.values()):
            failed = [f for f in failed if not f.startswith(f"{name}/")]
            print(f"[reproduce] {name}: no run folders in {out.path}; its earlier section is kept and "
                  "checked again", flush=True)
            continue  # write_report keeps the earlier section and entry, with today's checks
        runs_ok = {r: json.loads((out.path / name / r / "summary.json").read_text())
                   for r in runs if ok_runs[r]}
        changes = {r: changes_from_paper(paper, r, FLAGS.scale) for r in runs}
        exp_summary, section = report.build(runs_ok, FLAGS.scale, changes, walls, figure_dir=out.path / "figures",
                                            run_root=out.path / name)
        summary[name] = exp_summary
        sections.append(section)
    cache.cleanup()
    header = (f"# ssmgate reproduction report ({FLAGS.scale} scale)\n\n"
              f"Generated by `python -m ssmgate.reproduce --scale={FLAGS.scale}`; every number below comes "
              f"from the runs under `{FLAGS.out_dir}/` and the theory in `ssmgate/theory/`.\n")
    if failed:
        header += f"\n**Failed runs:** {', '.join(failed)} (see their output above).\n"
    fresh = dict(zip([n for n in names if n in summary], sections))
    text, summary = write_report(out, header, fresh, summary, failed, FLAGS.scale)
    print(f"[reproduce] wrote {out.file('report.md')} and {out.file('summary.json')} "
          f"in {time.perf_counter() - t0:.0f}s", flush=True)
    if FLAGS.docs_dir:
        docs = RunDir(FLAGS.docs_dir)
        write_report(docs, header.replace(f"`{FLAGS.out_dir}/`", f"`{FLAGS.out_dir}/` (not committed)"), fresh,
                     summary, failed, FLAGS.scale)
        if (out.path / "figures").exists():
            shutil.copytree(out.path / "figures", docs.path / "figures", dirs_exist_ok=True)
        print(f"[reproduce] copied the report to {docs.path}", flush=True)
    if failed:
        raise SystemExit(1)


def _marked(name: str, section: str) -> str:
    return f"<!-- experiment:{name} -->\n{section.rstrip()}\n<!-- /experiment:{name} -->\n"


def earlier_sections(report: str) -> dict[str, str]:
    """{experiment: its marked section} of a report written by this program."""
    pattern = r"<!-- experiment:(\w+) -->\n(.*?)\n<!-- /experiment:\1 -->"
    return {m.group(1): m.group(2) for m in re.finditer(pattern, report, flags=re.S)}


QUICK_NOTE = (
    "**What the quick scale can show.** It runs every program end to end in minutes: the code paths, the "
    "report and its checks. Its models are tiny and train for a few hundred steps, so most of the papers' "
    "effects cannot appear: a check that fails here says nothing about the claim. The papers' claims are "
    "judged at the cpu scale (`make reproduce-docs`, the committed docs/reproduction/report.md); the claim "
    "table below sets each quick result beside that committed status.\n\n")


def scale_note(scale: str) -> str:
    return QUICK_NOTE if scale == "quick" else ""


def committed_cpu_summary() -> dict | None:
    """docs/reproduction/summary.json, the committed cpu-scale results, when it is there."""
    path = REPO / "docs" / "reproduction" / "summary.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("scale") != "cpu":
        return None
    for name, (_, _, report) in EXPERIMENTS.items():  # statuses by today's checks
        if name in data:
            data[name]["checks"] = report.recheck(data[name])
    return data


def write_report(where: RunDir, header: str, fresh: dict, summary: dict, failed: list,
                 scale: str) -> tuple[str, dict]:
    """Writes report.md and summary.json to `where`: the experiments of this invocation (`fresh`
    sections, `summary` entries) and, for the others, the section and entry an earlier invocation
    left there at the same scale. Returns (text, the summary written)."""
    old_text = where.file("report.md").read_text() if where.file("report.md").exists() else ""
    old_summary = json.loads(where.file("summary.json").read_text()) if where.file("summary.json").exists() else {}
    kept = {}
    if old_summary.get("scale") == scale:
        kept = {n: s for n, s in earlier_sections(old_text).items() if n in EXPERIMENTS and n not in fresh}
        if kept:
            print(f"[reproduce] {where.path}: kept {', '.join(kept)} from an earlier invocation", flush=True)
    merged = {**{n: old_summary[n] for n in kept if n in old_summary}, **summary}
    for n in kept:  # today's checks on the numbers an earlier invocation measured
        if n in merged:
            merged[n]["checks"] = EXPERIMENTS[n][2].recheck(merged[n])
            kept[n] = replace_checks_table(kept[n], merged[n]["checks"])
    merged["scale"] = scale
    merged["failed_runs"] = failed
    rows = registry.claim_rows()
    merged["claims"] = claims.rows(merged, rows)
    sections = {**kept, **fresh}
    reference = committed_cpu_summary() if scale != "cpu" else None
    text = (header + "\n" + scale_note(scale) + claims.markdown(merged, scale, rows, reference) + "\n"
            + "\n".join(_marked(n, sections[n]) for n in EXPERIMENTS if n in sections))
    where.write_json("summary.json", merged)
    where.write_text("report.md", text)
    return text, merged

if __name__ == "__main__":
    app.run(main)
