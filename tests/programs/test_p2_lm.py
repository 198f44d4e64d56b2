"""The `p2_lm` program: text pretraining on the embedded corpus, the long-context evaluation with
interventions, resuming both, edited checkpoints, the report section, flags and the memory probe."""
import dataclasses
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest

from ssmgate import malloc_env
from ssmgate.interventions.edits import edit_checkpoint, edit_param
from ssmgate.models.config import ModelCfg
from ssmgate.train import lm_memory
from ssmgate.train import lm_runs
from ssmgate.programs.p2_lm import program as p2_lm
from ssmgate.programs.p2_lm import report as p2_lm_report
from ssmgate.config_error import ConfigError
from ssmgate.programs.p2_lm.long_eval import CELLS_FILE, LongEvalCfg
from ssmgate.tasks import text_corpus, text_packing
from ssmgate.train import loop, mesh as meshlib, optim
from ssmgate.train.checkpoint import CheckpointError
from ssmgate.train.run_spec import RunSpec
from tests.main_runs import dry_run_flag_files, run_many

REPO = Path(__file__).resolve().parents[2]
TINY = ModelCfg(block="mamba3", vocab_size=258, d_model=16, n_layers=2, d_state=8, headdim=8, expand=2)
FULL_EVAL = dict(interventions=("phase_removal", "decay_permutation"), bc_window=128, heatmap_window=64,
                 diag_len=256, diag_skip=16, diag_short=64, trajectory_len=256, bucket_row_len=64, bucket_width=32,
                 pseudo_books=3, curve_windows=(64, 128))


def make_cfg(model=TINY, steps=4, variant="rotation", **long_eval):
    text = p2_lm.TextCfg(seq_len=32, batch=4, eval_batch=64, max_train_tokens=20_000, max_valid_tokens=3_000,
                         max_eval_books=3)
    spec = RunSpec(model=model, optim=optim.OptimCfg(name="adamw", lr=3e-3, total_steps=steps),
                   loop=loop.LoopCfg(steps, log_every=2, eval_every=2, tensorboard=False), mesh=meshlib.MeshCfg())
    return p2_lm.P2LMCfg(text=text, spec=spec, variant=variant,
                         long_eval=LongEvalCfg(windows=(64, 128), score_last=16, piece_len=64, batch=4,
                                               **long_eval)).validate()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("p2_lm") / "rope05"
    cfg = make_cfg(**FULL_EVAL)
    return cfg, run_dir, p2_lm.run(cfg, str(run_dir))


def test_a_run_trains_on_text_and_measures_every_part(trained):
    cfg, run_dir, s = trained
    assert s["steps"] == 4 and s["variant"] == "rotation" and s["data"]["tokenizer"] == "byte"
    assert s["data"]["train_tokens"] == 20_000 and s["data"]["valid_tokens"] == 3_000
    assert [step for step, _ in s["val_curve"]] == [2, 4] and s["val_curve"][-1][1] == pytest.approx(s["ppl"])
    assert 1.0 < s["ppl"] < 258.0  # finite, and below the uniform distribution's 258
    le = s["long_eval"]
    assert set(le["window_ppl"]) == {"64", "128"} and all(v > 1.0 for v in le["window_ppl"].values())
    assert all(0.0 <= v <= 1.0 for v in le["window_accuracy"].values())
    assert set(le["intervention_ratio"]) == {"phase_removal", "decay_permutation"}
    for kind, row in le["intervention_ppl"].items():
        for c, ppl in row.items():
            assert le["intervention_ratio"][kind][c] == pytest.approx(ppl / le["window_ppl"][c])
    assert set(le["bc_removal_ratio"]) == {"remove_B", "remove_C", "remove_both"}
    assert le["bc_removal_ppl"]["native"] == le["window_ppl"]["128"]
    cells = le["layer_heatmap"]["cells"]
    assert sorted((c["start"], c["width"]) for c in cells) == [(0, 1), (0, 2), (1, 1)]
    # Removing phases in all layers is the whole-model phase removal measured at the same C.
    whole = next(c for c in cells if c["width"] == 2)
    assert whole["ppl_ratio"] == pytest.approx(le["intervention_ratio"]["phase_removal"]["64"])
    stats = le["state_stats"]
    assert stats["spans"] == {"short": [16, 64], "long": [16, 256]}
    for label in ("native", "removed"):
        for span in ("short", "long"):
            assert -1.0 <= stats[label][span]["cosine"] <= 1.0 and stats[label][span]["rms"] > 0.0
    assert (run_dir / "phase_trajectories.png").exists() or "skipped" in le["phase_trajectories"]
    assert (run_dir / "curves.png").exists() and (run_dir / CELLS_FILE).exists()
    buckets = le["bucket_ppl"]
    assert set(buckets) == {"rows", "0-32", "32-64"} and buckets["rows"] > 10 and buckets["0-32"] > 1.0
    # pseudo-books of the largest window (128) + 10 x 16 tokens: 11 windows each, the same at every C
    assert le["windows"] == {"layout": "pseudo_books", "pseudo_books": 3, "pseudo_book_tokens": 288, "anchor": 128}
    assert le["n_windows"] == {"64": 33, "128": 33}
    for c, (lo, hi) in le["window_ppl_ci"].items():
        assert lo <= le["window_ppl"][c] <= hi
    for kind, row in le["intervention_ratio_ci"].items():
        assert all(lo <= le["intervention_ratio"][kind][c] <= hi for c, (lo, hi) in row.items())
    assert all(lo <= le["bc_removal_ratio"][k] <= hi for k, (lo, hi) in le["bc_removal_ratio_ci"].items())
    # the windowed PPL along training (every evaluation); its last step is the final model on the same windows
    assert s["window_ppl_along_training"].keys() == {"2", "4"}
    assert s["window_ppl_along_training"]["4"] == pytest.approx(le["window_ppl"], rel=1e-5)
    traj = le["phase_trajectories"]
    assert "skipped" in traj or (traj["classes"].keys() == {"slow", "medium", "fast"}
                                 and traj["travel_ratio"]["fast_over_slow"] >= 1.0)


def test_the_validation_ppl_pools_every_validation_token(trained):
    cfg, run_dir, s = trained
    data = p2_lm.load_text(cfg.text, cfg.spec.model.vocab_size)
    from ssmgate.models.lm import build_model
    from ssmgate.train.checkpoint import Checkpointer
    with Checkpointer(run_dir / "checkpoints") as c:
        _, state, _ = c.restore_raw()
    model = build_model(cfg.spec.model)
    rows = text_packing.eval_rows(data.valid, cfg.text.seq_len)
    logits, _ = model.apply({"params": state["params"]}, np.asarray(rows.inputs))
    logp = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
    nll = -np.take_along_axis(logp, np.asarray(rows.targets)[..., None], -1).mean()
    assert s["ppl"] == pytest.approx(math.exp(nll), rel=1e-4)


def test_rerunning_a_finished_run_resumes_and_measures_nothing_again(trained):
    cfg, run_dir, first = trained
    lines = (run_dir / CELLS_FILE).read_text().count("\n")
    again = p2_lm.run(cfg, str(run_dir))
    assert again["resumed_from"] == 4 and again["params_digest"] == first["params_digest"]
    assert again["long_eval"] == first["long_eval"]
    assert (run_dir / CELLS_FILE).read_text().count("\n") == lines


def test_an_edited_checkpoint_is_resumed_with_the_edited_weights(trained, tmp_path):
    cfg, run_dir, first = trained
    edit = lambda p: edit_param(p, "layers_0/mixer/dt_bias", lambda x: x + 1.0)
    step = edit_checkpoint(run_dir, tmp_path / "edited", edit, "dt_bias + 1")
    assert step == 4
    plain = dataclasses.replace(cfg, long_eval=LongEvalCfg(windows=(64,), score_last=16, piece_len=64, batch=4))
    edited = p2_lm.run(plain, str(tmp_path / "edited"))
    assert edited["resumed_from"] == 4 and edited["params_digest"] != first["params_digest"]
    assert edited["long_eval"]["window_ppl"]["64"] != first["long_eval"]["window_ppl"]["64"]
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        edit_checkpoint(run_dir, tmp_path / "edited", edit, "again")
    with pytest.raises(ValueError, match="same shape and dtype"):
        edit_checkpoint(run_dir, tmp_path / "bad", lambda p: edit_param(p, "layers_0/mixer/D", lambda x: x[:1]), "")


def test_the_report_section_and_summary_entry(trained, tmp_path):
    cfg, run_dir, s = trained
    worse = json.loads(json.dumps(s))
    worse["ppl"] *= 1.5
    worse["long_eval"] = {k: worse["long_eval"][k] for k in ("window_ppl", "window_accuracy")}
    worse["long_eval"]["window_ppl"] = {c: v * 1.5 for c, v in s["long_eval"]["window_ppl"].items()}
    worse["window_ppl_along_training"] = {st: {c: v * 1.5 for c, v in row.items()}
                                          for st, row in s["window_ppl_along_training"].items()}
    seed1, worse1 = json.loads(json.dumps(s)), json.loads(json.dumps(worse))
    seed1["ppl"] *= 1.01
    worse1["ppl"] *= 1.01
    runs = {"lm_rope05": s, "lm_rope0": worse, "lm_rope05_seed1": seed1, "lm_rope0_seed1": worse1}
    entry, md = p2_lm_report.build(runs, "quick", {"lm_rope05": [], "lm_rope0": []}, {}, tmp_path / "fig",
                                   run_dir.parent)
    assert entry["ppl"] == {"rotation": s["ppl"], "no_rotation": worse["ppl"]}
    assert set(entry["window_ppl"]["no_rotation"]) == {"64", "128"}
    assert entry["intervention_ratio"] == s["long_eval"]["intervention_ratio"]
    assert set(entry["bc_removal_ratio"]) == {"remove_B", "remove_C", "remove_both"}
    assert set(entry["state_stats"]) == {"native", "removed"} and "cosine" in entry["state_stats"]["native"]
    assert entry["ppl_seeds"] == {"rotation": [s["ppl"], seed1["ppl"]], "no_rotation": [worse["ppl"], worse1["ppl"]]}
    assert entry["checks"]["rotation_heldout_ppl_below_no_rotation_beyond_seed_spread"] is True
    assert entry["checks"]["rotation_window_ppl_below_no_rotation_every_C_beyond_seed_spread"] is True
    assert "every_phase_intervention_ratio_gt_1.15" in entry["checks"] and "held-out ppl per seed" in md.lower()
    assert (tmp_path / "fig" / "p2_lm_ppl.png").exists() and (tmp_path / "fig" / "p2_lm_layer_heatmap.png").exists()
    assert entry["window_ppl_along_training"]["no_rotation"]["4"]["128"] == worse["window_ppl_along_training"]["4"]["128"]
    assert entry["checks"]["fig8_9_rotation_window_ppl_below_no_rotation_at_the_last_step_every_C_beyond_seed_spread"]
    assert entry["checks"]["fig8_9_rotation_gap_widens_from_smallest_to_largest_C_beyond_seed_spread"] is False
    assert (tmp_path / "fig" / "p2_lm_window_ppl_training.png").exists() and "| step | rotation C=64 |" in md
    assert entry["windows"]["layout"] == "pseudo_books" and "3 pseudo-books of 288 tokens" in md
    assert "| model | params | held-out PPL | C=64 | C=128 |" in md and "paper SISO" in md
    assert entry["bucket_ppl"]["rotation"] == s["long_eval"]["bucket_ppl"] and "| model | rows | [0, 32) |" in md
    entry, md = p2_lm_report.build({"lm_rope05": s}, "quick", {}, {}, tmp_path / "fig", run_dir.parent)
    assert "Runs without a summary (failed or not run): lm_rope0, lm_rope05_seed1, lm_rope0_seed1, lm_mimo" in md
    assert "rotation_heldout_ppl_below_no_rotation_beyond_seed_spread" not in entry["checks"]


def test_a_mimo_model_runs_the_interventions_and_the_report_contrasts_it_with_siso(trained, tmp_path):
    cfg, run_dir, s = trained
    mimo_cfg = make_cfg(model=dataclasses.replace(TINY, mimo_rank=2, chunk_size=16), steps=2, variant="rotation_mimo",
                        interventions=("phase_removal", "decay_permutation"), bc_window=128, diag_len=256,
                        diag_skip=16, diag_short=64, pseudo_books=3)
    m = p2_lm.run(mimo_cfg, str(tmp_path / "mimo"))
    assert set(m["long_eval"]["intervention_ratio"]) == {"phase_removal", "decay_permutation"}
    assert set(m["long_eval"]["bc_removal_ratio"]) == {"remove_B", "remove_C", "remove_both"}
    assert "native" in m["long_eval"]["state_stats"] and m["params"] > s["params"]
    entry, md = p2_lm_report.build({"lm_rope05": s, "lm_mimo": m}, "quick", {}, {}, tmp_path / "fig", run_dir.parent)
    assert entry["mimo"]["intervention_ratio"] == m["long_eval"]["intervention_ratio"]
    assert entry["intervention_ratio"] == s["long_eval"]["intervention_ratio"]  # the SISO keys stay the SISO model's
    assert {n for n in entry["checks"] if n.startswith("mimo_")} >= {
        "mimo_every_phase_intervention_ratio_gt_1.15", "mimo_table7_remove_C_gt_remove_B",
        "mimo_cosine_rises_after_phase_removal", "mimo_cosine_shift_larger_than_siso",
        "mimo_ratio_growth_with_C_below_siso_every_intervention_beyond_ci"}
    assert "MIMO rank 4 (run `lm_mimo`" in md and "| intervention | C=64 | C=128 | ours SISO | paper MIMO |" in md


def _mimo_entry(siso_growth: float, mimo_growth: float, mimo_removal: float) -> dict:
    """A summary entry whose SISO ratios grow by siso_growth from C=64 to C=128 and whose MIMO ones by mimo_growth,
    with intervals of +-1% (MIMO's phase removal at C=128 is mimo_removal)."""
    ci = lambda rows: {k: {c: [0.99 * v, 1.01 * v] for c, v in row.items()} for k, row in rows.items()}  # noqa: E731
    siso = {k: {"64": v, "128": v * siso_growth} for k, v in
            (("phase_removal", 3.0), ("phase_reversal", 7.0), ("decay_permutation", 5.0))}
    mimo = {k: {"64": v, "128": v * mimo_growth} for k, v in
            (("phase_removal", 9.0), ("phase_reversal", 3.5), ("decay_permutation", 1.22))}
    mimo["phase_removal"]["128"] = mimo_removal
    return {"ppl": {}, "intervention_ratio": siso, "intervention_ratio_ci": ci(siso),
            "mimo": {"intervention_ratio": mimo, "intervention_ratio_ci": ci(mimo)}}


@pytest.mark.parametrize("siso_growth, mimo_growth, mimo_removal, growth_ok, order_ok", [
    (3.0, 1.0, 9.0, True, True),     # the paper's picture: SISO grows, MIMO flat, removal largest
    (1.0, 1.0, 9.0, False, True),    # SISO flat too: no contrast
    (3.0, 1.0, 3.0, True, False),    # removal below reversal at the largest C
    (3.0, 1.0, 3.5, True, False),    # removal tied with reversal: a tie is not an ordering
])
def test_the_mimo_checks_state_table_5s_contrast(siso_growth, mimo_growth, mimo_removal, growth_ok, order_ok):
    checks = p2_lm_report.checks(_mimo_entry(siso_growth, mimo_growth, mimo_removal))
    assert checks["mimo_ratio_growth_with_C_below_siso_every_intervention_beyond_ci"] is growth_ok
    assert checks["mimo_phase_removal_largest_decay_permutation_smallest_at_largest_C_beyond_ci"] is order_ok
    assert checks["mimo_every_phase_intervention_ratio_gt_1.15"] is True


def test_a_model_without_rotation_gets_only_the_native_numbers(tmp_path):
    cfg = make_cfg(model=dataclasses.replace(TINY, transition="none", rope_fraction=0.0), steps=2,
                   variant="no_rotation", interventions=("phase_removal",))
    s = p2_lm.run(cfg, str(tmp_path / "rope0"))
    assert "no phases to intervene on" in s["long_eval"]["interventions_skipped"]
    assert "intervention_ratio" not in s["long_eval"] and set(s["long_eval"]["window_ppl"]) == {"64", "128"}


def test_host_batches_are_the_packers_batches_on_the_mesh():
    stream = np.arange(5000, dtype=np.int32) % 258
    mesh = meshlib.make_mesh(meshlib.MeshCfg())
    batch_fn = lm_runs.on_mesh(lambda k: text_packing.batch_at(stream, 16, 4, 7, k), meshlib.batch_sharding(mesh))
    for k in (0, 3):
        got, want = batch_fn(k), text_packing.batch_at(stream, 16, 4, 7, k)
        np.testing.assert_array_equal(np.asarray(got.inputs), want.inputs)
        assert got.inputs.sharding.spec[0] == "data"


@pytest.mark.parametrize("change, message", [
    (dict(text=dict(corpus="wiki")), "corpus='wiki': expected 'embedded'"),
    (dict(text=dict(eval_split="dev")), "eval_split='dev'"),
    (dict(text=dict(seq_len=0)), "seq_len=0"),
    (dict(long_eval=dict(windows=(16,), score_last=16)), "windows=(16,): expected sizes > score_last=16"),
    (dict(long_eval=dict(interventions=("phase_removel",))), "'phase_removel' is not one of"),
    (dict(long_eval=dict(diag_len=100, diag_skip=50, diag_short=20)), "expected 0 <= diag_skip < diag_short"),
    (dict(long_eval=dict(bucket_row_len=100, bucket_width=32)), "bucket_row_len=100: expected a multiple"),
    (dict(model=dict(vocab_size=200)), "the tokenizer 'byte' has 258 tokens"),
    (dict(loop=None), "expected exactly one of them"),
    (dict(long_eval=dict(curve_windows=(64,), curve_every=3)), "--lm_curve_every=3: the curve is measured at "
                                                               "evaluations; expected a multiple of --eval_every=2"),
    (dict(long_eval=dict(pseudo_books=-2)), "pseudo_books=-2: expected >= 0"),
])
def test_bad_configurations_name_what_is_wrong(change, message):
    cfg = make_cfg()
    parts, spec_parts = {}, {}
    for field, value in change.items():
        into, owner = (spec_parts, cfg.spec) if field in ("model", "loop") else (parts, cfg)
        old = getattr(owner, field)
        into[field] = value if value is None else dataclasses.replace(old, **value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(cfg, spec=dataclasses.replace(cfg.spec, **spec_parts), **parts).validate()


def test_corpus_specs():
    assert next(text_corpus.open_corpus("embedded", "test")) == text_corpus.embedded_corpus("test")[0]
    for bad in ("tfds:", "tfds:#text", "embedded:x", "pg19", "wiki:x"):
        with pytest.raises(ValueError, match="expected 'embedded', 'pg19:<folder>'"):
            text_corpus.open_corpus(bad, "train")
    with pytest.raises(FileNotFoundError, match="PG-19 folder not found"):
        text_corpus.open_corpus("pg19:/nonexistent/pg19", "test")


@pytest.mark.slow  # three fresh processes (~20 s); the cpu-scale report measures the same at 65K tokens
def test_a_long_window_does_not_need_more_memory_than_a_short_one():
    mem = lm_memory.measure(TINY, (512, 65_536), 512)
    assert [r["window"] for r in mem["runs"]] == [512, 65_536] and mem["unchunked"]["piece_len"] == 65_535
    assert all(math.isfinite(r["mean_nll"]) and r["peak_rss_mb"] > 0 for r in mem["runs"])
    assert mem["unchunked"]["mean_nll"] == pytest.approx(mem["runs"][1]["mean_nll"], rel=1e-5)
    assert mem["full_logits_mb"] == pytest.approx(65_536 * 258 * 4 / 2 ** 20)
    # the probe sees what one piece of 65K tokens costs; pieces of 512 do not grow with the window
    assert mem["unchunked_extra_mb"] > mem["full_logits_mb"], mem
    assert mem["growth_mb"] < 0.25 * mem["unchunked_extra_mb"], mem
    assert mem["repeats"] == 3 and all(len(r["peaks_mb"]) == 3 for r in [*mem["runs"], mem["unchunked"]])


def test_memory_rows_keep_the_median_of_their_processes_and_report_the_spread(monkeypatch):
    peaks = {(512, 512): iter([500.0, 440.0, 505.0]), (4096, 512): iter([560.0, 510.0, 515.0]),
             (4096, 4095): iter([900.0, 905.0, 880.0])}
    monkeypatch.setattr(lm_memory, "_run_once", lambda cfg_json, length, piece: {
        "window": length, "piece_len": piece, "peak_rss_mb": next(peaks[length, piece]), "method": "m",
        "mean_nll": 1.0})
    mem = lm_memory.measure(TINY, (512, 4096), 512)
    assert [r["peak_rss_mb"] for r in mem["runs"]] == [500.0, 515.0] and mem["unchunked"]["peak_rss_mb"] == 900.0
    assert mem["runs"][0]["peaks_mb"] == [500.0, 440.0, 505.0]
    # one process per row would have read 60 MB of growth from the first samples (500 -> 560)
    assert mem["growth_mb"] == 15.0 and mem["spread_mb"] == 65.0 and mem["unchunked_extra_mb"] == 385.0
    with pytest.raises(ValueError, match="repeats=0; expected >= 1"):
        lm_memory.measure(TINY, (512,), 512, repeats=0)


def test_memory_children_compile_at_O0_unless_the_user_set_a_level_and_without_a_cache(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/tmp/shared-cache")
    env = lm_memory.child_env()
    assert env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false --xla_backend_optimization_level=0"
    assert "JAX_COMPILATION_CACHE_DIR" not in env and env["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=3")
    assert lm_memory.child_env()["XLA_FLAGS"] == "--xla_backend_optimization_level=3"
    # glibc's default malloc (a heap that keeps freed pages would hide the peaks), a user's own tunable kept
    monkeypatch.setenv("GLIBC_TUNABLES", malloc_env.with_tunables("glibc.malloc.arena_max=2"))
    assert lm_memory.child_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"


def test_flag_files_dry_run():
    # (rope05, rope0) x (paper, cpu, quick); the paper ones include experiments/models/p2_lm_187m_*.flags,
    # which test_train_lm dry-runs with the paper's sizes.
    # and the second seed of each, which includes its seed-0 file; lm_mimo at each scale (paper: the official MIMO)
    assert len([p for p in (REPO / "experiments" / "p2").rglob("lm_*.flags") if "shared" not in p.parts]) == 15
    paths = ("experiments/p2/cpu/lm_rope05.flags", "experiments/p2/quick/lm_rope0.flags",
             "experiments/p2/cpu/lm_rope05_seed1.flags", "experiments/p2/cpu/lm_mimo.flags",
             "experiments/p2/lm_mimo.flags")
    results = dry_run_flag_files(paths)  # the cpu files split each batch over two CPU devices
    for path, res in results.items():
        assert res.returncode == 0, (path, res.stderr[-2000:])
        assert "long_eval: LongEvalCfg(" in res.stdout and "mesh {" in res.stdout
    for path in paths[:4]:
        assert ("'data': 2" in results[path].stdout) == ("/cpu/" in path), (path, results[path].stdout[-500:])
    seed1, mimo, official = (results[paths[i]].stdout for i in (2, 3, 4))
    bad, = run_many([["--flagfile=experiments/p2/quick/lm_rope05.flags", "--lm_init_official=x.safetensors",
                      "--dry_run"]])
    assert "mimo_rank=4" in mimo and "chunk_size=16" in mimo and "official checkpoint" not in mimo
    assert "official checkpoint: checkpoints/mamba3_1p5b_mimo" in official and "published 21.12" in official
    assert "interventions=(), bc_window=None, heatmap_window=None, diag_len=0" in seed1 and "shuffle_seed=1" in seed1
    assert bad.returncode != 0 and "drop --steps" in bad.stderr and "Traceback" not in bad.stderr
