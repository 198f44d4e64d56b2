"""The official-checkpoint interventions of `p2_lm` (--lm_init_official): the flag files dry-run, the model
comes from the checkpoint's config.json (model flags checked against it), and the native-PPL gate
stops a run whose converted model is not the published one before any intervention is measured."""
import json

from ssmgate.programs.p2_lm import long_eval as p2_lm_eval
from tests.interventions import upstream_mamba3 as up
from tests.main_runs import dry_run_flag_files, run_many

FILES = ("experiments/p2/interventions_official_siso.flags", "experiments/p2/interventions_official_mimo.flags")


def test_flag_files_dry_run():
    for path, res in dry_run_flag_files(FILES).items():
        assert res.returncode == 0, (path, res.stderr[-2000:])
        assert "native-PPL gate: none yet: a run needs --lm_official_ppl" in res.stdout
        assert "interventions=('phase_removal', 'phase_reversal', 'phase_shuffle', 'decay_permutation')" in res.stdout


def _checkpoint(folder):
    # byte tokenizer: 258 ids, padded to 264 as upstream pads the vocabulary
    config = up.make_config(dict(d_state=16, headdim=8), d_model=32, n_layer=1, vocab_size=258)
    return up.write_checkpoint(folder, config, up.random_state_dict(config))


def _args(ckpt, *extra):
    # the official flag files' program path at a size that runs in seconds on the embedded corpus
    return ["--program=p2_lm", f"--lm_init_official={ckpt}", "--block=mamba3", "--a_activation=heavy",
            "--tokenizer=byte", "--lm_corpus=embedded", "--lm_eval_split=test", "--lm_max_train_tokens=4096",
            "--lm_max_valid_tokens=2048", "--seq_len=256", "--batch=1", "--lm_windows=512", "--lm_score_last=100",
            "--lm_piece_len=512", "--lm_interventions=phase_removal", "--lm_official_ppl_window=512", *extra]


def test_model_from_config_json_and_flags_checked(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    ok, clash, ungated = run_many([_args(ckpt, "--lm_official_ppl=3.0", "--dry_run"),
                                   _args(ckpt, "--lm_official_ppl=3.0", "--d_state=32", "--dry_run"),
                                   _args(ckpt, "--run_dir=" + str(tmp_path / "run"))])
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "(model from its config.json)" in ok.stdout and "vocab_size=264" in ok.stdout
    assert "published 3.0 at window 512, ±2%" in ok.stdout
    assert clash.returncode != 0 and "d_state=32 (config.json gives 16)" in clash.stderr
    assert ungated.returncode != 0 and "--lm_init_official needs --lm_official_ppl" in ungated.stderr


def test_native_ppl_gate_stops_a_wrong_model_and_passes_the_published_one(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt")
    wrong_run, right_run = tmp_path / "wrong", tmp_path / "right"
    # the checkpoint is heavy-tail; declared softplus its PPL is not the one measured with heavy
    (heavy,) = run_many([_args(ckpt, "--lm_official_ppl=2.0", f"--run_dir={tmp_path / 'probe'}")])
    assert heavy.returncode != 0 and "native-PPL gate failed" in heavy.stderr, heavy.stderr[-2000:]
    measured = json.loads((tmp_path / "probe" / "native_ppl_gate.json").read_text())["measured_ppl"]
    wrong, right = run_many([
        _args(ckpt, f"--lm_official_ppl={measured}", "--a_activation=softplus", f"--run_dir={wrong_run}"),
        _args(ckpt, f"--lm_official_ppl={measured * 1.01}", f"--run_dir={right_run}")])
    assert wrong.returncode != 0 and "native-PPL gate failed" in wrong.stderr and "softplus" in wrong.stderr
    cells = [json.loads(line)["key"] for line in (wrong_run / p2_lm_eval.CELLS_FILE).read_text().splitlines()]
    assert cells == ["native|None|None|512"]          # nothing after the gate was measured
    assert not (wrong_run / "summary.json").exists()
    assert right.returncode == 0, right.stderr[-3000:]
    gate = json.loads((right_run / "native_ppl_gate.json").read_text())
    assert gate["passed"] and abs(gate["relative_difference"] + 0.01 / 1.01) < 1e-6
    summary = json.loads((right_run / "summary.json").read_text())
    assert summary["long_eval"]["window_ppl"]["512"] == measured
    assert "phase_removal" in summary["long_eval"]["intervention_ratio"]
    keys = [json.loads(line)["key"] for line in (right_run / p2_lm_eval.CELLS_FILE).read_text().splitlines()]
    assert keys.count("native|None|None|512") == 1    # the evaluation reused the gate's cell
