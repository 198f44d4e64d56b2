"""The program registry and what main makes of it: --help per program, and an error for a flag the
chosen program does not read."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ssmgate.programs import registry
from tests.main_runs import REPO, run_many


@pytest.mark.parametrize("name", list(registry.PROGRAMS))
def test_every_program_has_the_entry_points_main_calls(name):
    flags_module = registry.PROGRAMS[name].flags
    for attr in ("config_from_flags", "describe", "run", "GROUPS_READ"):
        assert hasattr(flags_module, attr), f"{flags_module.__name__} lacks {attr}"
    names = registry.flag_names(name)
    assert names["own"] or name == "train", names  # every experiment defines flags of its own
    assert len({n for ns in names.values() for n in ns}) == sum(len(ns) for ns in names.values())  # one home each


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_every_experiment_has_flag_files_and_a_report(name):
    p = registry.EXPERIMENTS[name]
    for run in p.runs:
        for where in ("", "cpu/", "quick/"):
            assert (REPO / "experiments" / p.paper / f"{where}{run}.flags").exists(), (name, where, run)
    for attr in ("build", "recheck"):  # what ssmgate.reproduce calls
        assert hasattr(p.report, attr), f"{p.report.__name__} lacks {attr}"
    for attr in ("BARS", "CLAIMS", "UNCLAIMED_CHECKS"):  # what the registry collects for the report
        assert hasattr(p.claims, attr), f"{p.claims.__name__} lacks {attr}"


def test_help_lists_the_flags_of_the_chosen_program_only():
    res = subprocess.run([sys.executable, "-m", "ssmgate.main", "--program=p1_kv", "--help"], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    assert "p1_kv's own flags:" in out and "  --kv_query:" in out and "  --gate_offset:" in out
    assert "  --lr:" in out and "  --run_dir:" in out and "  --opt_name:" in out
    assert "--horn_K" not in out and "--fig1_panel" not in out and "--lm_corpus" not in out
    plain = subprocess.run([sys.executable, "-m", "ssmgate.main", "--help"], cwd=REPO, capture_output=True, text=True)
    assert plain.returncode == 0 and "Programs: p1_fig1, p1_kv" in plain.stdout and "--kv_query" not in plain.stdout


def test_a_flag_the_program_does_not_read_is_an_error():
    bad, other, good = run_many([
        ["--program=p1_kv", "--steps=2", "--batch=2", "--lr=1e-3", "--horn_K=4", "--dry_run"],
        ["--program=p1_fig1", "--fig1_panel=a", "--opt_name=adamw", "--dry_run"],
        ["--program=p1_kv", "--steps=2", "--batch=2", "--lr=1e-3", "--kv_n_max=4", "--kv_buckets=2",
         "--dry_run"],
    ])
    assert bad.returncode != 0
    assert "--horn_K is not a flag of --program=p1_kv (it is one of p1_horn)" in bad.stderr
    assert "--program=p1_kv --help` lists its flags" in bad.stderr
    assert other.returncode != 0 and "--opt_name is not a flag of --program=p1_fig1" in other.stderr
    assert good.returncode == 0, good.stderr[-2000:]


def test_an_old_flag_name_still_sets_the_flag_and_main_names_the_new_one(tmp_path):
    fig1 = ["--program=p1_fig1", "--lr=0.1", "--batch=4", "--steps=3", "--fig1_ell=4", "--fig1_query_distance=1",
            "--fig1_alpha0=0.5", "--dry_run"]
    new, old = run_many([fig1 + ["--fig1_panel=a", "--fig1_d=8", "--fig1_P=16"],
                         fig1 + ["--panel=a", "--d=8", "--P=16"]])
    assert new.returncode == 0 and old.returncode == 0, (new.stderr[-2000:], old.stderr[-2000:])
    assert old.stdout == new.stdout and "d=8" in new.stdout and "P=16" in new.stdout
    assert "old flag names, still read: --P (now --fig1_P), --d (now --fig1_d), --panel (now --fig1_panel)" \
        in old.stderr and "old flag names" not in new.stderr
    assert {"d": "fig1_d", "corpus": "lm_corpus"}.items() <= {**registry.old_flag_names("p1_fig1"),
                                                              **registry.old_flag_names("p2_lm")}.items()
    help_text = subprocess.run([sys.executable, "-m", "ssmgate.main", "--program=p1_fig1", "--help"], cwd=REPO,
                               capture_output=True, text=True).stdout
    assert "old names, still read:" in help_text and "  --d: now --fig1_d" in help_text
    assert "  --fig1_d:" in help_text and "  --d:" not in help_text.split("old names")[0]


def test_flags_txt_records_the_new_name_of_a_flag_given_by_its_old_one():
    from absl.testing import flagsaver

    import ssmgate.main as main
    with flagsaver.flagsaver():
        main.FLAGS["program"].parse("p1_fig1")
        main.FLAGS["d"].parse("8")
        text = main.resolved_flags()
    assert "--fig1_d=8\n" in text and "--d=" not in text
