"""The P1 Horn-clause program (Fig 3, Table 1) at toy sizes: both regimes end to end (curves, probes,
early/final values, length generalisation, gate statistics), the pooled evaluation against oracle and
broken models, resume, bad flags, every flag file, and the report from made-up summaries."""
import csv
import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from absl import flags

from ssmgate.models.config import ModelCfg
from ssmgate.programs.p1_horn import program as p1_horn
from ssmgate.programs.p1_horn import report
from ssmgate.config_error import ConfigError
from ssmgate.train.sweep_results import t_interval
from ssmgate.tasks import horn
from ssmgate.tasks import horn_ranking as hr
from ssmgate.train import loop, mesh, optim, sweep
from ssmgate.train.run_spec import Grid, RunSpec
from ssmgate.reproduce import read_flags
from tests.main_runs import dry_run_flag_files

REPO = Path(__file__).resolve().parents[2]
KEYS = {"program", "regime", "horn", "replicas", "replica_offset", "replica_seed", "offsets", "seeds", "steps",
        "escape_step", "stopped_step", "diverged", "probe_k", "eval_sets", "curves", "early_step", "final_step",
        "early", "final", "early_per_seed", "final_per_seed", "final_eval", "lengen_ks", "median_tau",
        "median_alpha_change", "median_tau_token", "median_alpha_change_token", "table1", "table1_token", "wall_s"}
SETS = {"retrieval": {"first_turn", "no_oracle", "random_oracle_name"}, "lengen": {"first_turn"}}


def tiny_cfg(regime="retrieval", steps=20, **kw):
    """A toy graph (8 propositions per set, K = 8, pools k <= 4) and a 1-layer Mamba-2."""
    task = horn.HornCfg(regime=regime, props_per_set=8, K=8, k_max=4, batch=8, n_buckets=1)
    model = ModelCfg(block="mamba2", vocab_size=48, d_model=16, n_layers=1, d_state=8, expand=1, headdim=8,
                     algorithm="sequential")
    spec = RunSpec(model=model, optim=optim.OptimCfg(name="muon", lr=1e-2, total_steps=steps),
                   loop=loop.LoopCfg(steps=steps, log_every=10, eval_every=10, tensorboard=False), mesh=mesh.MeshCfg(),
                   grid=Grid(offsets=(-4.0, 2.0), seeds=kw.pop("seeds", 1)), stop=sweep.StopRule(p1_horn.METRIC),
                   eval_n=kw.pop("eval_n", 16))
    args = dict(gate_prompts=8, lengen_ks=(2, 8) if regime == "lengen" else ())
    args.update(kw)
    return p1_horn.HornRunCfg(horn=task, spec=spec, **args).validate()


@pytest.fixture(scope="module")
def retrieval_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("p1_horn_retrieval")
    cfg = tiny_cfg("retrieval")
    return cfg, root, p1_horn.run(cfg, root)


@pytest.fixture(scope="module")
def lengen_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("p1_horn_lengen")
    cfg = tiny_cfg("lengen", weak_betas=(0.0, 1.0))
    return cfg, root, p1_horn.run(cfg, root)


def _check_common(cfg, root, out, regime):
    assert json.loads((root / "summary.json").read_text()) == out
    assert KEYS <= set(out)
    assert out["regime"] == regime and out["offsets"] == [-4.0, 2.0] and out["seeds"] == [0]
    assert out["steps"] == 20 and (root / "checkpoints" / "20").is_dir()
    assert out["escape_step"] == [None, None] and out["stopped_step"] == [None, None]  # no stop rule given
    assert set(out["eval_sets"]) == SETS[regime] and out["horn"]["k_max"] == 4 and out["horn"]["beta"] == "inf"
    assert out["early_step"] == 10 and out["final_step"] == 20  # first eval at or after 0.1 x 20 steps
    for r, curve in enumerate(out["curves"]):
        assert curve["offset"] == out["offsets"][r] and curve["step"] == [10, 20]
        assert SETS[regime] <= set(curve) and not (SETS["retrieval"] - SETS[regime]) & set(curve)
        for name in SETS[regime]:
            assert all(0.0 <= a <= 1.0 for a in curve[name])
            o = p1_horn.offset_key(curve["offset"])
            assert out["early"][name][o] == curve[name][0] and out["final"][name][o] == curve[name][1]
            assert out["final_per_seed"][name][o] == [curve[name][1]]
        assert curve["first_turn"][1] == out["final_eval"]["accuracy"][r]
    assert set(out["early"]) == set(out["final"]) == SETS[regime]
    # A_log += delta: at init the delta = +2 heads forget e^6 times faster than the delta = -4 ones, whether
    # the step is softplus(dt_bias) or the token average of dt_t (same seed, same weights and prompts otherwise).
    for key in ("median_tau", "median_tau_token"):
        tau = out[key]
        assert tau["-4"]["init"][0] / tau["2"]["init"][0] == pytest.approx(math.exp(6), rel=1e-3), key
    assert out["median_tau_token"]["2"]["init"][0] != pytest.approx(out["median_tau"]["2"]["init"][0], rel=1e-3)
    for o in ("-4", "2"):
        assert out["table1"][o] == {"median_tau_before": out["median_tau"][o]["init"][0],
                                    "median_tau_after": out["median_tau"][o]["final"][0],
                                    "median_abs_dalpha": out["median_alpha_change"][o][0]}
    assert out["median_alpha_change"]["2"][0] > 0.0
    drift = list(csv.DictReader(open(root / "gate_drift.csv")))
    assert [d["init"] for d in drift] == ["-4", "2"]
    assert float(drift[1]["median_tau_after_token"]) == pytest.approx(out["median_tau_token"]["2"]["final"][0])
    return list(csv.DictReader(open(root / "horn_curve.csv")))


def test_retrieval_run_probes_curves_and_gates(retrieval_run):
    cfg, root, out = retrieval_run
    rows = _check_common(cfg, root, out, "retrieval")
    assert out["probe_k"] == 4 and out["eval_sets"]["no_oracle"] == {"kind": "no_oracle", "k": [4, 4], "examples": 16,
                                                                    "seed": p1_horn.SET_SEEDS["no_oracle"]}
    assert out["eval_sets"]["first_turn"]["k"] == [1, 4] and "lengen_accuracy" not in out
    assert len(rows) == 2 * 2 and {r["init"] for r in rows} == {"-4", "2"}
    first = next(r for r in rows if r["init"] == "2" and r["step"] == "20")
    assert float(first["acc_rand_name"]) == out["curves"][1]["random_oracle_name"][1]
    assert float(first["acc_no_oracle"]) == out["curves"][1]["no_oracle"][1]
    assert p1_horn.METRIC in out["final_eval"]  # the escape / early-stop metric is an eval metric


def test_lengen_run_weak_retriever(lengen_run):
    """P1 Fig 5 (top): the same models with PL pools at beta 0 and 1, no oracle injected."""
    cfg, root, out = lengen_run
    assert out["weak_betas"] == ["0", "1"] and set(out["weak_accuracy"]) == set(out["weak_recall"]) == {"0", "1"}
    for beta in ("0", "1"):
        assert set(out["weak_accuracy"][beta]) == {"-4", "2"}
        assert all(0.0 <= c["mean"] <= 1.0 for by_k in out["weak_accuracy"][beta].values() for c in by_k.values())
        assert out["weak_recall"][beta]["8"] == 1.0  # k = K: every clause of the layer is in the pool
    assert 0.0 < out["weak_recall"]["0"]["2"] < 1.0  # random pools of 2 of the 8 clauses often miss the oracle
    assert out["weak_recall"]["1"]["2"] >= out["weak_recall"]["0"]["2"]  # a better retriever recalls more
    assert p1_horn.HornRunCfg.fingerprint(cfg) == tiny_cfg("lengen").fingerprint()  # evaluation only: resumable


def test_lengen_run_length_generalisation(lengen_run):
    cfg, root, out = lengen_run
    rows = _check_common(cfg, root, out, "lengen")
    assert out["probe_k"] is None and {r["acc_no_oracle"] for r in rows} == {""}
    assert set(out["lengen_accuracy"]) == {"-4", "2"} and out["lengen_examples"] == {"2": 16, "8": 16}
    for o, by_k in out["lengen_accuracy"].items():
        assert set(by_k) == {"2", "8"}
        for k, c in by_k.items():
            (acc,) = c["per_seed"]
            assert c["mean"] == c["ci95_lo"] == c["ci95_hi"] == acc and 0.0 <= acc <= 1.0  # one seed
            r = out["offsets"].index(float(o))
            assert out["lengen_detail"][k][r]["accuracy"] == acc
    assert len(list(csv.DictReader(open(root / "horn_len.csv")))) == 2 * 2


def test_resume_of_a_finished_run_reproduces_it(retrieval_run):
    cfg, root, out = retrieval_run
    again = p1_horn.run(cfg, root)
    assert again["resumed_from"] == 20
    for key in ("curves", "early", "final", "final_eval", "table1", "table1_token", "median_tau", "steps"):
        assert again[key] == out[key], key


class _Copier:
    """A fake model whose logit at t is the token at t + 1 (a perfect copier of the target sequence)."""

    def __init__(self, shift=1):
        self.shift = shift

    def apply(self, variables, inputs):
        del variables
        nxt = jnp.concatenate([inputs[:, self.shift:], jnp.zeros_like(inputs[:, :self.shift])], axis=1)
        return jax.nn.one_hot(nxt, 48), None


def test_pooled_evaluation_scores_an_oracle_one_and_a_broken_model_zero():
    cfg = tiny_cfg("retrieval", eval_n=20)
    graph = horn.build_graph(cfg.horn)
    perfect = p1_horn.make_evaluate(_Copier(), jnp.float32, graph)
    broken = p1_horn.make_evaluate(_Copier(shift=2), jnp.float32, graph)  # emits the name shifted by one digit
    for name, (kind, lo, hi, n) in cfg.eval_sets.items():
        data = p1_horn.fixed_set(cfg, graph, p1_horn.SET_SEEDS[name], kind, lo, hi, n)
        assert data.inputs.shape[:2] == (3, 7)  # 20 examples in balanced chunks of <= 8 at k_max = 4
        rule = "class1" if name == "first_turn" else hr.RULES[p1_horn.KIND[name]]
        m = perfect({}, data, rule)
        assert float(m["accuracy"]) == 1.0 and int(m["n"]) == 21, name
        assert float(broken({}, data, rule)["accuracy"]) == 0.0, name


def test_early_index_and_by_offset():
    assert p1_horn.early_index([10, 20, 30], 100, 0.1) == 0
    assert p1_horn.early_index([10, 20, 30], 100, 0.25) == 2
    assert p1_horn.early_index([10, 20, 30], 100, 0.5) == 2  # none at or after step 50: the last one
    assert p1_horn.early_index([], 100, 0.1) is None
    reps = tiny_cfg(seeds=2).spec.replicas  # offsets outermost: (-4, 0), (-4, 1), (2, 0), (2, 1)
    mean, per = p1_horn.by_offset([0.1, 0.3, 0.5, float("nan")], reps, (-4.0, 2.0))
    assert mean == {"-4": pytest.approx(0.2), "2": 0.5} and per["-4"] == [0.1, 0.3]


# --- flags -------------------------------------------------------------------------------------------------

BASE = ["--program=p1_horn", "--steps=10", "--batch=4", "--lr=1e-3", "--horn_props_per_set=8", "--horn_K=8",
        "--horn_k_max=4", "--vocab_size=48", "--d_model=16", "--n_layers=1", "--d_state=8", "--expand=1", "--headdim=8"]


@pytest.fixture
def parse():
    from ssmgate import main  # defines every flag
    from ssmgate.programs.p1_horn import flags as p1_horn_flags
    assert main.PROGRAMS["p1_horn"].flags is p1_horn_flags

    def parse(*args):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["test", *BASE, *args])
        return p1_horn_flags.config_from_flags()
    yield parse
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize("args, message", [
    (["--preset=p1_horn_llama", "--n_heads=4", "--gate_offset=0,1"], "--gate_offset=0,1: gate offsets act on Mamba-2's A_log; "
                                                                 "--block=llama has none"),
    (["--gate_offset=1,1"], "--gate_offset=1,1: expected distinct offsets"),
    (["--gate_offset=a"], "--gate_offset: cannot read 'a'"),
    (["--horn_k_max=64"], "--horn_k_max=64: expected k_min = 1 <= k_max <= K = 8"),
    (["--horn_K=100"], "--horn_K=100: expected 1 .. 64"),
    (["--horn_beta=-1"], "--horn_beta=-1.0: expected a float >= 0"),
    (["--horn_buckets=0"], "--horn_buckets=0: expected >= 1"),
    (["--horn_q_fresh=0"], "--horn_q_fresh=0.0: expected a float in (0, 1]"),
    (["--vocab_size=40"], "--vocab_size=40: expected >= 45"),
    (["--horn_lengen_ks=4"], "--horn_lengen_ks=4: length generalisation is evaluated for --horn_regime=lengen only"),
    (["--horn_regime=lengen", "--horn_lengen_ks=4,x"], "--horn_lengen_ks=4,x: cannot read 'x'"),
    (["--horn_regime=lengen", "--horn_lengen_ks=64"], "--horn_lengen_ks: 64: expected pool sizes in 1..--horn_K=8"),
    (["--horn_regime=lengen", "--horn_lengen_ks=2,2"], "--horn_lengen_ks=2,2: expected distinct pool sizes"),
    (["--horn_weak_betas=0,1"], "--horn_weak_betas=0,1: the weak retriever evaluates the length-generalisation"),
    (["--horn_regime=lengen", "--horn_weak_betas=0,inf"], "--horn_weak_betas=0,inf: expected distinct finite PL betas"),
    (["--horn_regime=lengen", "--horn_weak_betas=-1"], "--horn_weak_betas=-1: expected distinct finite PL betas"),
    (["--horn_regime=lengen", "--horn_weak_betas=x"], "--horn_weak_betas: cannot read 'x'"),
    (["--horn_regime=lengen", "--horn_probe_k=4"], "--horn_probe_k=4: the no-oracle / random-oracle-name probes "
                                                   "belong to --horn_regime=retrieval"),
    (["--horn_probe_k=8"], "--horn_probe_k=8: expected 1..6 (the no-oracle probe draws its pool"),
    (["--horn_probe_n=0"], "--horn_probe_n=0: expected >= 1"),
    (["--horn_early_frac=0"], "--horn_early_frac=0.0: expected a fraction of training in (0, 1]"),
    (["--escape_thr=0.9", "--stop_thr=0.5"], "--stop_thr=0.5: expected a value in [--escape_thr=0.9, 1]"),
    (["--eval_n=0"], "--eval_n=0: expected >= 1"),
    (["--lr=1e-3,1e-2"], "--lr=1e-3,1e-2: expected one learning rate"),
])
def test_bad_flags_name_themselves(parse, args, message):
    with pytest.raises(ConfigError) as e:
        parse(*args)
    assert message in str(e.value)


def test_a_bad_regime_names_itself(parse):
    with pytest.raises(flags.IllegalFlagValueError, match="horn_regime"):
        parse("--horn_regime=icl")
    with pytest.raises(ConfigError, match=r"--horn_regime='icl': expected one of \('retrieval', 'lengen'\)"):
        dataclasses.replace(tiny_cfg(), horn=horn.HornCfg(regime="icl")).validate()


def test_flags_build_the_sweep(parse):
    cfg = parse("--gate_offset=-2,0,1", "--seeds=2", "--seed=3")
    assert [(r.offset, r.seed) for r in cfg.spec.replicas] == [(-2, 3), (-2, 4), (0, 3), (0, 4), (1, 3), (1, 4)]
    assert cfg.spec.stop.escape_thr is None and cfg.spec.stop.stop_thr is None and cfg.lengen_ks == () and cfg.probe_pool == 4
    assert cfg.horn.batch == 4 and cfg.horn.k_upper == 4 and cfg.eval_sets["no_oracle"] == ("no_oracle", 4, 4, 1024)
    lengen = parse("--horn_regime=lengen", "--horn_K=8")
    assert lengen.lengen_ks == (1, 2, 4, 8) and lengen.probe_pool is None  # protocol §4.5's sizes up to K
    assert parse("--preset=p1_horn_llama", "--n_heads=4", "--gate_offset=0").spec.model.block == "llama"
    assert parse("--opt_name=muon", "--opt_muon_adam_lr=2e-3").spec.optim.muon_adam_lr == 2e-3
    assert parse("--escape_thr=0.5", "--stop_thr=0.9").spec.stop == sweep.StopRule("accuracy", 0.5, 0.9)


def test_every_flag_file_dry_runs():
    files = sorted(p for p in (REPO / "experiments" / "p1").rglob("horn_*.flags") if "shared" not in p.parts)
    assert len(files) == 9  # (retrieval, lengen, transformer) x (paper, cpu, quick)
    for f in files:
        text, resolved = f.read_text(), read_flags(f)  # with the files it includes
        assert text.startswith("# P1 Figure 3") and "ESTIMATE" not in text and resolved["program"] == "p1_horn", f
        assert (resolved["opt_name"], resolved["lr"], resolved["opt_final_lr_frac"]) == ("muon", "1e-3", "0.0"), f
    parts = {}
    for path, res in dry_run_flag_files(files).items():
        assert res.returncode == 0, (path, res.stderr[-3000:])
        parts[path] = res.stdout
    paper = parts[str(REPO / "experiments/p1/horn_retrieval.flags")]
    assert "replicas (21, one vmapped sweep): offsets -7.3, -3, -0.2, 1.6, 2.3, 2.9, 4.3 x seeds 0..2" in paper
    assert "K = 128 clauses per layer" in paper and "total_steps=300000" in paper and "warmup_steps=30000" in paper
    assert "eval no_oracle (no_oracle pools, k = 32)" in paper and "total          105,205,952" in paper
    lengen = parts[str(REPO / "experiments/p1/horn_lengen.flags")]
    assert "length generalisation k = 128: 2579 tokens" in lengen and "total_steps=200000" in lengen
    assert "weak retriever (Fig 5 top): PL pools at beta 0, 1" in lengen
    assert "total           50,652,160" in parts[str(REPO / "experiments/p1/horn_transformer.flags")]
    cpu = parts[str(REPO / "experiments/p1/cpu/horn_retrieval.flags")]
    assert "offsets -7.3, 1.6" in cpu and "props_per_set=16, K=16" in cpu and "k_max=8" in cpu and "d_model=64" in cpu
    assert "total_steps=3000" in cpu and "name='muon', lr=0.001" in cpu and "n_layers=4" in cpu
    assert "'early' = first eval at or after step 1500" in cpu and "x seeds 0..0" in cpu
    cpu_lengen = parts[str(REPO / "experiments/p1/cpu/horn_lengen.flags")]
    assert "length generalisation k = 64: 1299 tokens" in cpu_lengen
    assert "offsets -7.3, -3, -0.2, 1.6, 2.3, 2.9, 4.3 x seeds 0..0" in cpu_lengen  # the paper's Table 1 offsets
    assert "n_layers=4" in cpu_lengen and "n_layers=4" in parts[str(REPO / "experiments/p1/cpu/horn_transformer.flags")]
    for run in ("retrieval", "lengen", "transformer"):  # the paper's 4 buckets; each batch split over two devices
        text = parts[str(REPO / f"experiments/p1/cpu/horn_{run}.flags")]
        assert "n_buckets=4" in text and "mesh {'replica': 1, 'data': 2, 'model': 1}" in text, run
    assert "offsets 0 x seeds" in parts[str(REPO / "experiments/p1/quick/horn_transformer.flags")]


# --- report ------------------------------------------------------------------------------------------------

def _curve(offset, seed, no, rn):
    steps = [100 * (i + 1) for i in range(10)]
    return {"label": f"seed={seed} offset={offset:g}", "offset": offset, "seed": seed, "step": steps,
            "first_turn": [min(1.0, 0.1 * i) for i in range(10)], "no_oracle": [no] * 10, "random_oracle_name": [rn] * 10}


def retrieval_summary(no=None, rn=None, no_final=None, rn_final=None):
    no = no or {"-6": 0.2, "3": 0.7}
    rn = rn or {"-6": 0.5, "3": 0.1}
    no_final, rn_final = no_final or no, rn_final or rn
    curves = [_curve(float(o), s, no[o], rn[o]) for o in no for s in (0, 1)]
    first = {o: 0.5 for o in no}
    return {"horn": {"k_max": 8}, "probe_k": 8, "curves": curves, "early_step": 200, "final_step": 1000,
            "early": {"first_turn": first, "no_oracle": no, "random_oracle_name": rn},
            "final": {"first_turn": first, "no_oracle": no_final, "random_oracle_name": rn_final}}


def _lengen_acc(at_16: dict, seeds=2) -> dict:
    return {o: {str(k): t_interval([v - 0.02, v + 0.02][:seeds] if k == 16 else [1.0] * seeds)
                for k in (1, 2, 4, 8, 16)} for o, v in at_16.items()}


def lengen_summary(at_16=None, after=None):
    at_16 = at_16 or {"-6": 0.3, "3": 0.97}
    after = after or {"-6": 1.3e4, "3": 0.7}  # within x1.5 of the paper's Table 1 columns (-7.3 and 2.9)
    acc = _lengen_acc(at_16)
    before = {"-6": 2.0e4, "3": 0.8}
    t1 = {o: {"median_tau_before": before[o], "median_tau_after": after[o], "median_abs_dalpha": 1e-3} for o in at_16}
    return {"horn": {"k_max": 8}, "lengen_accuracy": acc, "table1": t1, "table1_token": t1}


def runs(transformer=0.2, **kw):
    return {"horn_retrieval": retrieval_summary(**{k: v for k, v in kw.items() if k in ("no", "rn", "no_final",
                                                                                        "rn_final")}),
            "horn_lengen": lengen_summary(**{k: v for k, v in kw.items() if k in ("at_16", "after")}),
            "horn_transformer": {"lengen_accuracy": _lengen_acc({"0": transformer})}}


ALL_CHECKS = ["rand_name_gap_early_ge_0.1", "no_oracle_strong_gt_weak_early", "rand_name_gap_final_ge_0.1",
              "no_oracle_strong_gt_weak_final", "lengen_strongest_gate_ge_0.95_at_largest_k",
              "lengen_strongest_gate_ranks_first_at_largest_k", "lengen_weakest_gate_decays_beyond_training_limit",
              "lengen_strongest_beats_transformer_at_largest_k", "strong_gate_copies_fresh_names_ge_0.9",
              "table1_tau_order_preserved", "table1_median_tau_within_x1.5_of_paper"]


def test_report_entry_checks_and_figures(tmp_path):
    entry, text = report.build(runs(), "cpu", {"horn_retrieval": ["horn_K: 128 -> 16"]}, {"horn_retrieval": 12.0},
                               tmp_path / "figures", tmp_path)
    assert entry["no_oracle"] == {"-6": {"early": 0.2, "final": 0.2}, "3": {"early": 0.7, "final": 0.7}}
    assert entry["random_oracle_name"]["-6"] == {"early": 0.5, "final": 0.5} and entry["early_step"] == 200
    assert list(entry["lengen_accuracy"]) == ["-6", "3"] and entry["lengen_accuracy"]["3"]["16"] == pytest.approx(0.97)
    assert entry["transformer_lengen_accuracy"]["16"] == pytest.approx(0.2)
    assert entry["table1"]["-6"] == {"median_tau_before": 2.0e4, "median_tau_after": 1.3e4, "median_abs_dalpha": 1e-3}
    assert entry["checks"] == {c: True for c in ALL_CHECKS}
    for name in ("p1_horn_fig3b.png", "p1_horn_fig3c.png", "p1_horn_fig3d.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 10_000
        assert f"figures/{name}" in text
    # Table 1 beside the paper: delta -6 sits in the -7.3 column (2.1e4 -> 1.2e4), +3 in the 2.9 one (0.8 -> 0.7).
    assert "| -6 | -7.3 | 2.1e+04 | 2e+04 | 1.2e+04 | 1.3e+04 |" in text and "| 3 | 2.9 | 0.8 | 0.8 | 0.7 | 0.7 |" in text
    assert "| Transformer |" in text and "horn_K: 128 -> 16" in text


@pytest.mark.parametrize("kw, failing", [
    (dict(rn={"-6": 0.15, "3": 0.1}, rn_final={"-6": 0.5, "3": 0.1}), ["rand_name_gap_early_ge_0.1"]),
    (dict(no={"-6": 0.9, "3": 0.8}, no_final={"-6": 0.2, "3": 0.7}), ["no_oracle_strong_gt_weak_early"]),
    (dict(no={"-6": 0.8, "3": 0.8}, no_final={"-6": 0.2, "3": 0.7}), ["no_oracle_strong_gt_weak_early"]),  # a tie
    (dict(rn_final={"-6": 0.3, "3": 0.3}), ["rand_name_gap_final_ge_0.1"]),
    (dict(no_final={"-6": 0.5, "3": 0.4}), ["no_oracle_strong_gt_weak_final"]),
    (dict(at_16={"-6": 0.5, "3": 0.4}), ["lengen_strongest_gate_ge_0.95_at_largest_k",
                                          "lengen_strongest_gate_ranks_first_at_largest_k"]),
    (dict(at_16={"-6": 0.96, "3": 0.95}), ["lengen_strongest_gate_ranks_first_at_largest_k"]),
    (dict(at_16={"-6": 0.97, "3": 0.97}), []),  # near-perfect gates tie at the top, as in the paper
    (dict(at_16={"-6": 0.6, "3": 0.6}), ["lengen_strongest_gate_ge_0.95_at_largest_k",
                                         "lengen_strongest_gate_ranks_first_at_largest_k"]),  # a tie below: fails
    (dict(at_16={"-6": 1.0, "3": 1.0}), ["lengen_weakest_gate_decays_beyond_training_limit"]),
    (dict(transformer=0.99), ["lengen_strongest_beats_transformer_at_largest_k"]),
    (dict(transformer=0.97), ["lengen_strongest_beats_transformer_at_largest_k"]),  # a tie fails
    (dict(no={"-6": 0.2, "4": 0.7}, rn={"-6": 0.5, "4": 0.1}),
     ["strong_gate_copies_fresh_names_ge_0.9"]),  # the retrieval run's strong gate +4 has no lengen run
    (dict(after={"-6": 0.2, "3": 0.3}), ["table1_tau_order_preserved", "table1_median_tau_within_x1.5_of_paper"]),
    (dict(after={"-6": 1.3e4, "3": 0.3}), ["table1_median_tau_within_x1.5_of_paper"]),
])
def test_each_check_can_fail(kw, failing):
    entry = report.collect(runs(**kw))
    assert [k for k, v in report.checks(entry).items() if not v] == failing


def test_registered_in_make_reproduce():
    from ssmgate import reproduce
    assert reproduce.EXPERIMENTS["p1_horn"] == ("p1", report.RUNS, report)
    for scale in ("quick", "cpu"):
        for run in report.RUNS:
            changes = reproduce.changes_from_paper("p1", run, scale)
            k = 64 if scale == "cpu" and run != "horn_retrieval" else 16  # cpu lengen pools reach 64
            assert f"horn_K: 128 -> {k}" in changes and "batch: 128 -> 32" in changes, (scale, run)
    assert "steps: 300000 -> 3000" in reproduce.changes_from_paper("p1", "horn_retrieval", "cpu")


def test_report_with_only_the_retrieval_run(tmp_path):
    entry, text = report.build({"horn_retrieval": retrieval_summary()}, "quick", {}, {}, tmp_path / "figures", tmp_path)
    assert "lengen_accuracy" not in entry and "table1" not in entry
    assert set(entry["checks"]) == set(ALL_CHECKS[:4])
    assert "horn_lengen, horn_transformer" in text and not (tmp_path / "figures" / "p1_horn_fig3d.png").exists()


def _fig5_runs(acc_by_beta: dict, transformer: dict | None = None) -> dict:
    """The lengen (and Transformer) summaries with weak-retriever results: {beta: {offset: {k: acc}}}."""
    wrap = lambda by_o: {o: {k: t_interval([v]) for k, v in by_k.items()} for o, by_k in by_o.items()}
    lg = lengen_summary()
    lg["weak_accuracy"] = {b: wrap(by_o) for b, by_o in acc_by_beta.items()}
    lg["weak_recall"] = {b: {k: 0.5 for k in next(iter(by_o.values()))} for b, by_o in acc_by_beta.items()}
    out = {"horn_lengen": lg}
    if transformer:
        out["horn_transformer"] = {"lengen_accuracy": _lengen_acc({"0": 0.2}),
                                   "weak_accuracy": {b: wrap({"0": by_k}) for b, by_k in transformer.items()}}
    return out


MODERATE = {"-6": {"8": 0.6, "64": 0.2}, "0": {"8": 0.7, "64": 0.5}, "3": {"8": 0.5, "64": 0.3}}


@pytest.mark.parametrize("acc, transformer, failing", [
    (MODERATE, {"8": 0.5, "64": 0.0}, []),
    (dict(MODERATE, **{"3": {"8": 0.5, "64": 0.6}}), None, ["fig5_horn_moderate_gate_best_at_largest_k_beta_0"]),
    (dict(MODERATE, **{"0": {"8": 0.7, "64": 0.3}}), None, ["fig5_horn_moderate_gate_best_at_largest_k_beta_0"]),  # tie
    (dict(MODERATE, **{"-6": {"8": 0.2, "64": 0.2}}), None, ["fig5_horn_weakest_gate_falls_as_pools_grow_beta_0"]),
    (MODERATE, {"8": 0.1, "64": 0.1}, ["fig5_horn_transformer_falls_as_pools_grow_beta_0"]),
])
def test_fig5_horn_checks_can_fail(tmp_path, acc, transformer, failing):
    runs = _fig5_runs({"0": acc}, None if transformer is None else {"0": transformer})
    entry, text = report.build(runs, "cpu", {}, {}, tmp_path / "figures", tmp_path)
    fig5 = {k: v for k, v in entry["checks"].items() if k.startswith("fig5_horn_")}
    assert len(fig5) == 2 + (transformer is not None)
    assert [k for k, v in fig5.items() if not v] == failing
    assert (tmp_path / "figures" / "p1_horn_fig5.png").stat().st_size > 10_000 and "recall@k" in text
    assert report.recheck(entry) == entry["checks"]
