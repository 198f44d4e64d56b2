"""Flags of the P2 language-model program (`--program=p2_lm`) and their translation to P2LMCfg.

Model, optimizer, mesh and loop flags are the shared ones (ssmgate.cli.training_flags), as are
`--seq_len` (here the training row length) and `--tokenizer`.
"""
from __future__ import annotations

from absl import flags

from ssmgate.cli import dataclass_flags
from ssmgate.cli import training_flags as tf
from ssmgate.config_error import ConfigError
from ssmgate.data import pieces
from ssmgate.interventions import convert_mamba3 as cv
from ssmgate.models.config import ModelCfg
from ssmgate.programs.p2_lm import program as p2_lm
from ssmgate.programs.p2_lm.long_eval import PHASE_KINDS, LongEvalCfg
from ssmgate.programs.p2_lm.official_gate import NativePPLGate
from ssmgate.tasks import text_corpus
from ssmgate.train.run_spec import Grid, RunSpec

_T, _E = p2_lm.TextCfg(), LongEvalCfg()
flags.DEFINE_string("corpus", _T.corpus, f"Training and validation text: {text_corpus.CORPUS_FORMS}.")
flags.DEFINE_string("eval_corpus", "", "The long-context evaluation's books (same forms); empty = --corpus.")
flags.DEFINE_enum("eval_split", _T.eval_split, text_corpus.SPLITS, "Split of the long-context books.")
flags.DEFINE_string("tfds_data_dir", None, "data_dir of prepared TFDS datasets (default: TFDS's).")
flags.DEFINE_string("text_key", _T.text_key, "Text feature of TFDS corpora that do not name one (tfds:<name>#<feature>).")
flags.DEFINE_integer("eval_batch", _T.eval_batch, "Validation rows per forward pass.")
flags.DEFINE_integer("max_train_tokens", None, "Cut the training token stream here (default or 0: all of it).")
flags.DEFINE_integer("max_valid_tokens", None, "Cut the validation token stream here (protocol §7.1: a 50M-token slice; default or 0: all).")
flags.DEFINE_integer("max_eval_books", None, "Use only the first N long-context books (default or 0: all).")
flags.DEFINE_string("token_cache_dir", None, "Keep the training split's token shards and the validation stream here "
                    "(default or empty: tokenize every run).")
flags.DEFINE_list("lm_windows", [str(c) for c in _E.windows], "Window sizes C of the protocol §7.2 evaluation.")
flags.DEFINE_integer("score_last", _E.score_last, "Tokens scored at the end of each window (protocol §7.2: 100).")
flags.DEFINE_integer("piece_len", _E.piece_len, "Tokens per forward piece of a window (the state carries over).")
flags.DEFINE_integer("window_batch", _E.batch, "Windows per forward pass.")
flags.DEFINE_integer("pseudo_books", _E.pseudo_books, "0: the windows of protocol §7.2 on the eval books. N > 0: the "
                     "books joined with EOS and cut into at most N pseudo-books of the largest --lm_windows + 10 x "
                     "--score_last tokens, the windows of every size ending where the largest's do (every C scores "
                     "the same tokens; for corpora of short books). Every other window size must be <= the largest.")
flags.DEFINE_list("window_curve_windows", [], "Window sizes whose native windowed PPL is measured along training "
                  "(P2 Figs 8-9); empty = none.")
flags.DEFINE_integer("window_curve_every", _E.curve_every, "Steps between the --window_curve_windows measurements "
                     "(a multiple of --eval_every; 0 = at every evaluation); the last step is always measured.")
flags.DEFINE_list("lm_interventions", [], f"Phase interventions at every window size: some of {', '.join(PHASE_KINDS)}.")
flags.DEFINE_integer("bc_window", None, "Window size of the B/C rotation-removal table (protocol §8.4); unset or 0 = skip.")
flags.DEFINE_integer("heatmap_window", None, "Window size of the layer-window heat map (protocol §8.1); unset or 0 = skip.")
flags.DEFINE_integer("diag_len", 0, "State diagnostics (protocol §8.3) over the first N tokens of books this long; 0 = skip.")
flags.DEFINE_integer("diag_skip", 0, "Leading positions excluded from the diagnostics (protocol §8.3: 2000).")
flags.DEFINE_integer("diag_short", 0, "End of the diagnostics' shorter span (protocol §8.3: 16000).")
flags.DEFINE_integer("diag_books", _E.diag_books, "At most this many books for the diagnostics.")
flags.DEFINE_integer("trajectory_len", 0, "Phase-trajectory figure over this many tokens; 0 = skip.")
flags.DEFINE_list("memory_windows", [], "Window lengths whose peak memory is measured in fresh processes.")
flags.DEFINE_integer("bucket_row_len", 0, "protocol §7.3: eval books joined with EOS in rows this long, PPL per "
                     "position bucket; 0 = skip.")
flags.DEFINE_integer("bucket_width", _E.bucket_width, "Positions per bucket of --bucket_row_len rows.")
flags.DEFINE_string("variant", "", "The report's name of this model (e.g. rotation, no_rotation).")
flags.DEFINE_string("init_official", None, "Evaluate an official Mamba-3 checkpoint: its safetensors file or folder "
                    "with upstream's config.json beside it, which gives the model (model flags given must agree; "
                    "--a_activation is the decay's: heavy, or softplus for weights before mamba_ssm c69aaab). "
                    "No training. Empty: none.")
flags.DEFINE_float("official_ppl", None, "--init_official: the published native PPL at --official_ppl_window; the run "
                   "stops before any intervention unless the converted checkpoint measures it within the tolerance.")
flags.DEFINE_integer("official_ppl_window", None, "--init_official: the window size of --official_ppl "
                     "(default: the first of --lm_windows).")
flags.DEFINE_float("official_ppl_tolerance", 0.02, "--init_official: allowed |measured / published - 1|.")

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "lr", "model", "optim", "mesh", "loop", "seq_len", "tokenizer")


def _ints(name: str) -> tuple:
    try:
        return tuple(int(v) for v in FLAGS[name].value)
    except ValueError:
        raise ConfigError(f"--{name}={','.join(FLAGS[name].value)}: expected comma-separated integers") from None


def config_from_flags() -> p2_lm.P2LMCfg:
    official = FLAGS.init_official or None  # empty: none (how a scale's file clears its paper file's)
    steps = None if official else tf.require("steps", "p2_lm")
    batch = tf.require("batch", "p2_lm")
    lr = tf.one_lr("p2_lm", default=1e-3 if official else None)
    if official and FLAGS.steps is not None:
        raise ConfigError("--init_official evaluates a converted checkpoint without training; drop --steps")
    text = p2_lm.TextCfg(corpus=FLAGS.corpus, eval_corpus=FLAGS.eval_corpus, eval_split=FLAGS.eval_split,
                         tokenizer=FLAGS.tokenizer, tfds_data_dir=FLAGS.tfds_data_dir, text_key=FLAGS.text_key,
                         seq_len=FLAGS.seq_len, batch=batch, eval_batch=FLAGS.eval_batch,
                         max_train_tokens=FLAGS.max_train_tokens or None, max_valid_tokens=FLAGS.max_valid_tokens or None,
                         max_eval_books=FLAGS.max_eval_books or None, cache_dir=FLAGS.token_cache_dir or None)
    long_eval = LongEvalCfg(windows=_ints("lm_windows"), score_last=FLAGS.score_last, piece_len=FLAGS.piece_len,
                            batch=FLAGS.window_batch, interventions=tuple(FLAGS.lm_interventions),
                            bc_window=FLAGS.bc_window or None, heatmap_window=FLAGS.heatmap_window or None,
                            diag_len=FLAGS.diag_len, diag_skip=FLAGS.diag_skip, diag_short=FLAGS.diag_short,
                            diag_books=FLAGS.diag_books, trajectory_len=FLAGS.trajectory_len,
                            memory_windows=_ints("memory_windows"), bucket_row_len=FLAGS.bucket_row_len,
                            bucket_width=FLAGS.bucket_width, shuffle_seed=FLAGS.seed,
                            pseudo_books=FLAGS.pseudo_books, curve_windows=_ints("window_curve_windows"),
                            curve_every=FLAGS.window_curve_every)
    model, gate = (_official(official, long_eval) if official else (tf.model_cfg(), None))
    spec = RunSpec(model=model, optim=tf.optim_cfg(lr, steps or 1), mesh=tf.mesh_cfg(), grid=Grid(seed=FLAGS.seed),
                   loop=None if official else tf.loop_cfg(steps, name="p2_lm"), preset=tf.preset())
    cfg = p2_lm.P2LMCfg(text=text, long_eval=long_eval, spec=spec, variant=FLAGS.variant, init_official=official,
                        official_gate=gate)
    cfg = cfg.validate()
    if not official and not _dry_run():  # a dry run describes flag files whose corpus is not here
        _check_train_split(cfg.text)
    return cfg


def _check_train_split(text: p2_lm.TextCfg) -> None:
    """The training split is there and holds text: listed (names and sizes, nothing read) before
    the run directory is made, rather than found missing or empty by the prepare inside the run."""
    try:
        parts = pieces.listing(text.corpus, "train", data_dir=text.tfds_data_dir, text_key=text.text_key)
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise ConfigError(f"--corpus={text.corpus}: {e}") from None
    if not any(size for _, size in parts):
        raise ConfigError(f"--corpus={text.corpus}: the train split is empty ({len(parts)} parts, 0 bytes of text); "
                          "expected a corpus with text to train on")


def _dry_run() -> bool:
    return "dry_run" in FLAGS and bool(FLAGS.dry_run)


def _official(path: str, long_eval: LongEvalCfg):
    """The model of --init_official (its config.json, the model flags given checked against it) and
    the native-PPL gate. A dry run without the checkpoint shows the model flags instead."""
    if tf.preset() is not None:
        raise ConfigError(f"--preset={FLAGS.preset} with --init_official: the checkpoint's config.json gives the "
                          "model; expected no --preset")
    window = FLAGS.official_ppl_window or long_eval.validate().windows[0]
    gate = None
    if FLAGS.official_ppl is not None:
        gate = NativePPLGate(FLAGS.official_ppl, window, FLAGS.official_ppl_tolerance).validate(long_eval)
    elif not _dry_run():
        raise ConfigError("--init_official needs --official_ppl: the published native PPL at window "
                          f"{window} (--official_ppl_window), which the converted checkpoint must reproduce "
                          "before any intervention is measured")
    given = dataclass_flags.overrides(ModelCfg)
    if cv.read_config(path) is None:
        if _dry_run():
            return tf.model_cfg(), gate
        raise ConfigError(f"--init_official={path}: no {cv.config_path(path)}; expected an upstream mamba_ssm "
                          "checkpoint with its config.json beside the weights")
    try:
        return cv.official_config(path, a_activation=given.pop("a_activation", None), **given), gate
    except ValueError as e:
        raise ConfigError(f"--init_official={path}: {e}") from None


def describe(cfg) -> str:
    text = p2_lm.describe(cfg)
    if cfg.init_official is None:
        return text
    found = cv.read_config(cfg.init_official) is not None
    return "\n".join([
        f"official checkpoint: {cfg.init_official} (" + ("model from its config.json" if found else
                                                        "not here: the model below is the model flags'; a run "
                                                        "reads it from the checkpoint's config.json") + ")",
        f"decay activation: {cfg.spec.model.a_activation}",
        "native-PPL gate: " + ("none yet: a run needs --official_ppl" if cfg.official_gate is None else
                               f"published {cfg.official_gate.published} at window {cfg.official_gate.window}, "
                               f"±{100 * cfg.official_gate.tolerance:g}%, before any intervention"),
        text])


def run(cfg, run_dir) -> dict:
    return p2_lm.run(cfg, run_dir)
