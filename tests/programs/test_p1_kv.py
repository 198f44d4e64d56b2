"""The P1 KV-retrieval program (Fig 2) at toy sizes: a gate-offset sweep end to end (escape steps,
early stopping, curves, length generalisation, gate statistics), resume, bad flags, every flag file,
and the report from made-up summaries."""
import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from absl import flags

from ssmgate.train import sweep_results
from ssmgate.models.config import ModelCfg
from ssmgate.programs.p1_kv import program as p1_kv
from ssmgate.programs.p1_kv import report
from ssmgate.config_error import ConfigError
from ssmgate.tasks import kv_retrieval as kv
from ssmgate.train import loop, mesh, optim, sweep
from ssmgate.train.run_spec import Grid, RunSpec
from tests.main_runs import dry_run_flag_files, run_many

REPO = Path(__file__).resolve().parents[2]
KEYS = {"replicas", "offsets", "seeds", "escape_step", "escape_step_by_offset", "plateau_accuracy", "escape_fit",
        "curves", "lengen_accuracy", "wall_s", "final", "stopped_step", "memoriser_accuracy", "median_tau"}


def tiny_cfg(query="best_last", steps=30, escape_thr=0.12, stop_thr=0.3, lengen_ns=(4, 8), eval_every=5):
    """An easy toy task (keys/values of 2 tokens out of 8, n <= 4) and a 1-layer Mamba-2."""
    task = kv.KVCfg(n_content=8, m=2, dict_size=16, n_max=4, eps=0.1, q=0.5, query=query, batch=8)
    model = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, expand=1, headdim=8,
                     algorithm="sequential")
    spec = RunSpec(model=model, optim=optim.OptimCfg(lr=1e-2, total_steps=steps),
                   loop=loop.LoopCfg(steps=steps, log_every=10, eval_every=eval_every, tensorboard=False),
                   mesh=mesh.MeshCfg(), grid=Grid(offsets=(-4.0, 2.0)),
                   stop=sweep.StopRule(p1_kv.METRIC, escape_thr, stop_thr), eval_n=16)
    return p1_kv.KVRunCfg(kv=task, spec=spec, n_buckets=1,
                          lengen_ns=lengen_ns if query == "best_last" else ()).validate()


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("p1_kv")
    cfg = tiny_cfg()
    return cfg, root, p1_kv.run(cfg, root)


def test_sweep_summary_escape_steps_and_curves(sweep_run):
    cfg, root, out = sweep_run
    assert json.loads((root / "summary.json").read_text()) == out
    assert KEYS <= set(out)
    assert out["offsets"] == [-4.0, 2.0] and out["seeds"] == [0] and len(out["replicas"]) == 2
    assert out["steps"] == 30 and (root / "checkpoints" / "30").is_dir()
    assert set(out["escape_step_by_offset"]) == {"-4", "2"}
    assert [out["escape_step_by_offset"][o][0] for o in ("-4", "2")] == out["escape_step"]
    assert any(e is not None for e in out["escape_step"])  # the easy task passes 0.12 within 30 steps
    escaped = 0
    for r, curve in enumerate(out["curves"]):
        assert curve["offset"] == out["offsets"][r] and curve["step"] == [5, 10, 15, 20, 25, 30]
        acc = curve["seq_accuracy"]
        assert all(0.0 <= a <= 1.0 for a in acc) and acc[-1] == out["final"]["seq_accuracy"][r]
        above = [s for s, a in zip(curve["step"], acc) if a > cfg.spec.stop.escape_thr]
        assert out["escape_step"][r] == (above[0] if above else None)
        stop = [s for s, a in zip(curve["step"], acc) if a >= cfg.spec.stop.stop_thr]
        assert out["stopped_step"][r] == (stop[0] if stop else None)
        if stop:  # a stopped replica is frozen: every later evaluation gives the same number
            assert len({a for s, a in zip(curve["step"], acc) if s >= stop[0]}) == 1
        escaped += above != []
    fit = out["escape_fit"]
    assert fit["n"] == escaped and fit["r2"] is None  # fewer than 3 points
    # plateau: the delta >= 0 replica's evaluations before its escape (all of them if none)
    plus = out["curves"][1]
    esc = out["escape_step"][1]
    before = [a for s, a in zip(plus["step"], plus["seq_accuracy"]) if esc is None or s < esc]
    assert out["plateau_accuracy"] == (float(np.median(before)) if before else None)
    assert out["memoriser_accuracy"] == pytest.approx(0.81)
    rows = list(csv.DictReader(open(root / "kv_curve.csv")))
    assert len(rows) == 2 * 6 and {r["offset"] for r in rows} == {"-4.0", "2.0"}


def test_length_generalisation_and_gate_statistics(sweep_run):
    _, root, out = sweep_run
    assert set(out["lengen_accuracy"]) == {"-4", "2"} and out["lengen_examples"] == {"4": 16, "8": 16}
    for o, by_n in out["lengen_accuracy"].items():
        assert set(by_n) == {"4", "8"}
        for n, c in by_n.items():
            (acc,) = c["per_seed"]
            assert c["mean"] == c["ci95_lo"] == c["ci95_hi"] == acc and 0.0 <= acc <= 1.0  # one seed
    assert len(list(csv.DictReader(open(root / "kv_len.csv")))) == 2 * 2
    # A_log += delta: the delta = +2 heads forget e^6 times faster than the delta = -4 ones at init.
    tau = out["median_tau"]
    assert tau["-4"]["init"][0] / tau["2"]["init"][0] == pytest.approx(math.exp(6), rel=0.05)
    assert out["median_alpha_change"]["2"][0] > 0.0


def test_resume_of_a_finished_run_reproduces_it(sweep_run):
    cfg, root, out = sweep_run
    again = p1_kv.run(cfg, root)
    assert again["resumed_from"] == 30
    for key in ("escape_step", "stopped_step", "curves", "final", "lengen_accuracy", "plateau_accuracy", "steps",
                "median_tau"):
        assert again[key] == out[key], key


def test_an_early_stopped_sweep_ends_early_and_resumes_without_training(tmp_path):
    cfg = tiny_cfg("best_first", steps=40, escape_thr=0.01, stop_thr=0.01, eval_every=10)
    out = p1_kv.run(cfg, tmp_path)
    assert out["stopped_step"] == [10, 10] and out["escape_step"] == [10, 10] and out["steps"] == 10
    assert "lengen_accuracy" not in out and out["plateau_accuracy"] is None  # escaped at the first evaluation
    again = p1_kv.run(cfg, tmp_path)
    assert again["steps"] == 10 and again["curves"] == out["curves"] and again["final"] == out["final"]


def test_escape_fit_and_t_interval():
    fit = sweep_results.linear_fit([1.0, 2.0, 3.0, 4.0], [10.0, 21.0, 29.0, 40.0])
    assert fit["slope"] == pytest.approx(9.8) and fit["n"] == 4 and 0.98 < fit["r2"] < 1.0
    assert sweep_results.linear_fit([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])["slope"] is None
    assert sweep_results.linear_fit([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])["r2"] is None
    ci = sweep_results.t_interval([0.2, 0.4, 0.3, 0.5, 0.1])
    assert ci["mean"] == pytest.approx(0.3)
    assert ci["ci95_hi"] - ci["mean"] == pytest.approx(2.776 * np.std([0.2, 0.4, 0.3, 0.5, 0.1], ddof=1) / 5 ** 0.5,
                                                       rel=1e-3)
    wide = sweep_results.t_interval([0.6, 1.0])  # 2 seeds: t = 12.7, the raw interval leaves [0, 1]
    assert (wide["ci95_lo"], wide["ci95_hi"]) == (0.0, 1.0) and wide["mean"] == pytest.approx(0.8)


# --- flags -------------------------------------------------------------------------------------------------

BASE = ["--program=p1_kv", "--steps=10", "--batch=4", "--lr=1e-3", "--kv_vocab=8", "--kv_m=2", "--kv_dict_size=32",
        "--kv_n_max=4", "--kv_buckets=2", "--vocab_size=16", "--d_model=16", "--n_layers=1", "--d_state=8",
        "--expand=1", "--headdim=8"]


@pytest.fixture
def parse():
    from ssmgate import main  # defines every flag
    from ssmgate.programs.p1_kv import flags as p1_kv_flags
    assert main.PROGRAMS["p1_kv"].flags is p1_kv_flags

    def parse(*args):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["test", *BASE, *args])
        return p1_kv_flags.config_from_flags()
    yield parse
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize("args, message", [
    (["--preset=p1_kv_gpt_neox", "--n_heads=4", "--gate_offset=0,1"], "--gate_offset=0,1: gate offsets act on Mamba-2's A_log; "
                                                    "--block=gpt_neox has none"),
    (["--gate_offset=1,1"], "--gate_offset=1,1: expected distinct offsets"),
    (["--gate_offset=a"], "--gate_offset: cannot read 'a'"),
    (["--kv_n_max=0"], "--kv_n_max=0: expected >= 1"),
    (["--kv_dict_size=2"], "--kv_dict_size=2: expected >= n_max = 4"),
    (["--kv_q=0"], "--kv_q=0.0: expected a query ratio in (0, 1]"),
    (["--vocab_size=8"], "--vocab_size=8: expected >= 13"),
    (["--kv_buckets=5"], "--kv_buckets=5: expected an integer in 1..--kv_n_max=4"),
    (["--kv_lengen_ns=8"], "--kv_lengen_ns=8: length generalisation is evaluated for --kv_query=best_last only"),
    (["--kv_query=best_last", "--kv_lengen_ns=8,x"], "--kv_lengen_ns=8,x: cannot read 'x'"),
    (["--kv_query=best_last", "--kv_lengen_ns=64"], "--kv_lengen_ns: 64: expected pair counts in 1..--kv_dict_size=32"),
    (["--escape_thr=1.5"], "--escape_thr=1.5: expected a value of seq_accuracy in (0, 1)"),
    (["--stop_thr=0.5"], "--stop_thr=0.5: expected a value in [--escape_thr=0.95, 1]"),
    (["--eval_n=0"], "--eval_n=0: expected >= 1"),
    (["--lr=1e-3,1e-2"], "--lr=1e-3,1e-2: expected one learning rate"),
])
def test_bad_flags_name_themselves(parse, args, message):
    with pytest.raises(ConfigError) as e:
        parse(*args)
    assert message in str(e.value)


def test_flags_build_the_sweep(parse):
    cfg = parse("--gate_offset=-2,0,1", "--seeds=2", "--seed=3", "--kv_query=best_last", "--kv_lengen_ns=4,8")
    assert [(r.offset, r.seed) for r in cfg.spec.replicas] == [(-2, 3), (-2, 4), (0, 3), (0, 4), (1, 3), (1, 4)]
    assert cfg.spec.stop.escape_thr == 0.95 and cfg.spec.stop.stop_thr == 0.99
    assert cfg.lengen_ns == (4, 8) and cfg.kv.batch == 4
    assert parse("--preset=p1_kv_gpt_neox", "--n_heads=4", "--gate_offset=0").spec.model.block == "gpt_neox"


def test_every_flag_file_dry_runs():
    files = sorted(p for p in (REPO / "experiments" / "p1").rglob("kv_*.flags") if "shared" not in p.parts)
    assert len(files) == 9  # (best_first, best_last, transformer) x (paper, cpu, quick)
    parts = {}
    for path, res in dry_run_flag_files(files).items():
        assert res.returncode == 0, (path, res.stderr[-3000:])
        parts[path] = res.stdout
    paper = parts[str(REPO / "experiments/p1/kv_best_first.flags")]
    assert "replicas (50, one vmapped sweep): offsets -10, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1" in paper
    assert "10154 tokens" in paper and "total           90,423,744" in paper
    last = parts[str(REPO / "experiments/p1/kv_best_last.flags")]
    assert "length generalisation n = 2048: 40556 tokens" in last
    assert "total           85,111,296" in parts[str(REPO / "experiments/p1/kv_transformer.flags")]
    first = parts[str(REPO / "experiments/p1/cpu/kv_best_first.flags")]
    assert "offsets -6, -4, -3, -2, -1, 0 x seeds 0..2" in first and "n_max=6, eps=0.3" in first and "total_steps=16000" in first
    assert "memoriser accuracy (1 - eps)^m = 0.2401" in first
    assert "mesh {'replica': 2, 'data': 1, 'model': 1}" in first  # --cpu_devices=2 gave the process two devices
    cpu = parts[str(REPO / "experiments/p1/cpu/kv_best_last.flags")]
    assert "offsets -6, -2, 0, 2" in cpu and "n_max=6, eps=0.3" in cpu and "length generalisation n = 24" in cpu
    assert "d_state=16" in cpu and "memoriser accuracy (1 - eps)^m = 0.2401" in cpu


def test_main_rejects_offsets_on_a_transformer(tmp_path):
    [res] = run_many([["--flagfile=experiments/p1/quick/kv_transformer.flags", "--gate_offset=0,2",
                       f"--run_dir={tmp_path / 'run'}"]])
    assert res.returncode != 0 and "--gate_offset=0,2: gate offsets act on Mamba-2's A_log" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "run").exists()


# --- report ------------------------------------------------------------------------------------------------

def _curve(offset, seed, values):
    return {"label": f"seed={seed} offset={offset:g}", "offset": offset, "seed": seed,
            "step": [100 * (i + 1) for i in range(len(values))], "seq_accuracy": values}


def first_summary(escape=None, plateau=0.65):
    # every gate escapes, the median linear in e^delta (400 + 160 e^delta): every check passes
    escape = escape or {"-6": [390, 400, 410], "-2": [411, 421, 431], "0": [550, 560, 570], "2": [1572, 1582, 1592]}
    curves = []
    for o, steps in escape.items():
        for seed, e in enumerate(steps):
            curves.append(_curve(float(o), seed, [0.3, plateau, plateau, plateau] if e is None else [0.3, plateau, 0.97, 0.99]))
    xs = [math.exp(float(o)) for o, s in escape.items() for e in s if e is not None]
    ys = [e for s in escape.values() for e in s if e is not None]
    return {"kv": {"n_max": 32, "m": 4, "eps": 0.1}, "escape_step_by_offset": escape, "plateau_accuracy": plateau,
            "memoriser_accuracy": 0.9 ** 4, "escape_fit": sweep_results.linear_fit(xs, ys), "escape_thr": 0.95,
            "curves": curves, "steps": 3000,
            "median_tau": {o: {"init": [14.0 / math.exp(float(o))] * 3} for o in escape}}


def lengen(means_at_128: dict, seeds=2, at_32=None):
    acc = {}
    for o, top in means_at_128.items():
        acc[o] = {}
        for n, frac in (("32", 1.0), ("64", 0.8), ("128", None)):
            m = top if frac is None else min(1.0, 0.9 * frac + 0.1 * top)
            m = at_32 if n == "32" and at_32 is not None else m
            acc[o][n] = sweep_results.t_interval([m - 0.02, m + 0.02][:seeds])
    return {"kv": {"n_max": 32, "m": 4, "eps": 0.1}, "lengen_accuracy": acc, "memoriser_accuracy": 0.9 ** 4}


def runs(**kw):
    return {"kv_best_first": first_summary(**{k: v for k, v in kw.items() if k in ("escape", "plateau")}),
            "kv_best_last": lengen(kw.get("lengen", {"-6": 0.1, "-2": 0.2, "0": 0.3, "2": 0.8}), at_32=kw.get("at_32")),
            "kv_transformer": lengen({"0": kw.get("transformer", 0.02)})}


def test_report_entry_checks_and_figures(tmp_path):
    entry, text = report.build(runs(), "cpu", {"kv_best_first": ["kv_n_max: 512 -> 32"]}, {"kv_best_first": 12.0},
                               tmp_path / "figures", tmp_path)
    assert entry["escape_step"] == runs()["kv_best_first"]["escape_step_by_offset"]
    assert entry["plateau_accuracy"] == 0.65 and entry["escape_fit_r2"] is not None
    assert entry["lengen_accuracy"]["2"]["128"] == pytest.approx(0.8)
    assert list(entry["lengen_accuracy"]) == ["-6", "-2", "0", "2"]
    assert entry["transformer_lengen_accuracy"]["128"] == pytest.approx(0.02)
    assert entry["checks"] == {"plateau_within_0.06_of_memoriser": True, "escape_later_as_offset_grows": True,
                               "smallest_offset_escapes": True, "escape_fit_r2_ge_0.7": True,
                               "strongest_gate_strictly_best_at_4N": True, "strongest_gate_retrieves_at_N": True,
                               "strongest_gate_beats_transformer_at_4N": True}
    for name in ("p1_kv_fig2a.png", "p1_kv_fig2b.png", "p1_kv_fig2c.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 10_000
        assert f"figures/{name}" in text
    assert "0.816" in text and "0.35" in text and "| Transformer |" in text and "kv_n_max: 512 -> 32" in text


def test_report_writes_step_counts_in_whole_steps(tmp_path):
    # A median of two escape steps (5600, 14400 -> 10000) and a fit intercept are step counts:
    # '10000', never the 3-significant-digit '1e+04' of a generic float cell.
    escape = {"-6": [5600, 14400], "-2": [8000, None], "0": [None, None], "2": [None, None]}
    _, text = report.build(runs(escape=escape), "cpu", {}, {}, tmp_path / "figures", tmp_path)
    assert "| 5600, 14400 | 10000 |" in text and "| 8000, never | never |" in text
    intercept = sweep_results.linear_fit([math.exp(-6), math.exp(-6), math.exp(-2)], [5600, 14400, 8000])["intercept"]
    assert f"intercept {intercept:.0f}, R²" in text


@pytest.mark.parametrize("kw, failing", [
    (dict(plateau=0.45), ["plateau_within_0.06_of_memoriser"]),
    (dict(escape={"-6": [300, 400, 500], "-2": [100, 200, 250], "0": [590, 600, 610], "2": [1572, 1582, 1592]}),
     ["escape_later_as_offset_grows"]),
    (dict(escape={"-6": [390, 400, 410], "-2": [411, 421, 431], "0": [None] * 3, "2": [None] * 3}),
     ["escape_fit_r2_ge_0.7"]),  # never-escapers tie, as the paper's delta >= 0; two escaping offsets fit nothing
    (dict(escape={"-6": [390, 400, 410], "-2": [None] * 3, "0": [411, 421, 431], "2": [None] * 3}),
     ["escape_later_as_offset_grows", "escape_fit_r2_ge_0.7"]),  # an escape after a never-escaper
    (dict(escape={"-6": [390, 400, 410], "-2": [400, 400, 400], "0": [None] * 3, "2": [None] * 3}),
     ["escape_later_as_offset_grows", "escape_fit_r2_ge_0.7"]),  # two escaping gates tie: strict
    (dict(escape={"-6": [None, None, 500], "-2": [None] * 3, "0": [None] * 3, "2": [None] * 3}),
     ["smallest_offset_escapes", "escape_fit_r2_ge_0.7"]),
    (dict(escape={"-6": [100, 400, 2000], "-2": [410, 421, 431], "0": [300, 560, 1900], "2": [1000, 1582, 1600]}),
     ["escape_fit_r2_ge_0.7"]),
    (dict(lengen={"-6": 0.5, "-2": 0.2, "0": 0.3, "2": 0.4}), ["strongest_gate_strictly_best_at_4N"]),
    (dict(lengen={"-6": 0.5, "-2": 0.2, "0": 0.3, "2": 0.5}), ["strongest_gate_strictly_best_at_4N"]),  # a tie
    # below the memoriser (0.9^4 = 0.656) at the training length: a memoriser's lead at 4N
    (dict(lengen={"-6": 0.1, "-2": 0.2, "0": 0.3, "2": 0.6}, at_32=0.6), ["strongest_gate_retrieves_at_N"]),
    (dict(transformer=0.8), ["strongest_gate_beats_transformer_at_4N"]),
    (dict(transformer=0.8 + 1e-12), ["strongest_gate_beats_transformer_at_4N"]),
])
def test_each_check_can_fail(tmp_path, kw, failing):
    entry, _ = report.build(runs(**kw), "quick", {}, {}, tmp_path / "figures", tmp_path)
    assert [k for k, v in entry["checks"].items() if not v] == failing


def test_report_with_only_the_best_first_run(tmp_path):
    entry, text = report.build({"kv_best_first": first_summary()}, "quick", {}, {}, tmp_path / "figures", tmp_path)
    assert "lengen_accuracy" not in entry and "strongest_gate_strictly_best_at_4N" not in entry["checks"]
    assert "kv_best_last, kv_transformer" in text and not (tmp_path / "figures" / "p1_kv_fig2c.png").exists()
