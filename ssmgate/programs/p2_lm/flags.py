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


def _count(flag: str, text: str) -> int | None:
    """A cut or a window size where 0 (or empty) means none."""
    try:
        return int(text) or None if text.strip() else None
    except ValueError:
        raise ValueError("expected an integer (0: none)") from None


def _path(flag: str, text: str) -> str | None:
    return text or None


# The data flags are TextCfg's fields (--tokenizer, --seq_len and --batch are shared flags), the long-context
# evaluation's LongEvalCfg's (its shuffle seed is --seed), the published-PPL gate's NativePPLGate's and the
# rest P2LMCfg's; all --lm_<field>, a few named more plainly.
PREFIX = "lm_"
TEXT_SKIP = ("tokenizer", "seq_len", "batch")
TEXT_NAMES = p2_lm.TEXT_FLAGS
TEXT_PARSERS = {"max_train_tokens": _count, "max_valid_tokens": _count, "max_eval_books": _count,
                "cache_dir": _path}
dataclass_flags.define(p2_lm.TextCfg, prefix=PREFIX, skip=TEXT_SKIP, names=TEXT_NAMES, parsers=TEXT_PARSERS,
                       choices={"eval_split": text_corpus.SPLITS}, module_name=__name__, helps={
    "corpus": f"Training and validation text: {text_corpus.CORPUS_FORMS}.",
    "eval_corpus": "The long-context evaluation's books (same forms); empty = --lm_corpus.",
    "eval_split": "Split of the long-context books.",
    "tfds_data_dir": "data_dir of prepared TFDS datasets (default: TFDS's).",
    "text_key": "Text feature of TFDS corpora that do not name one (tfds:<name>#<feature>).",
    "eval_batch": "Validation rows per forward pass.",
    "max_train_tokens": "Cut the training token stream here (default or 0: all of it).",
    "max_valid_tokens": "Cut the validation token stream here (protocol §7.1: a 50M-token slice; default or 0: all).",
    "max_eval_books": "Use only the first N long-context books (default or 0: all).",
    "cache_dir": "Keep the training split's token shards and the validation stream here (default or empty: tokenize "
                 "every run).",
})
EVAL_SKIP = ("shuffle_seed",)
EVAL_NAMES = p2_lm.EVAL_FLAGS
EVAL_PARSERS = {"bc_window": _count, "heatmap_window": _count}
dataclass_flags.define(LongEvalCfg, prefix=PREFIX, skip=EVAL_SKIP, names=EVAL_NAMES, parsers=EVAL_PARSERS,
                       module_name=__name__, helps={
    "windows": "Window sizes C of the protocol §7.2 evaluation.",
    "score_last": "Tokens scored at the end of each window (protocol §7.2: 100).",
    "piece_len": "Tokens per forward piece of a window (the state carries over).",
    "batch": "Windows per forward pass.",
    "pseudo_books": "0: the windows of protocol §7.2 on the eval books. N > 0: the books joined with EOS and cut "
                    "into at most N pseudo-books of the largest --lm_windows + 10 x --lm_score_last tokens, the windows "
                    "of every size ending where the largest's do (every C scores the same tokens; for corpora of "
                    "short books). Every other window size must be <= the largest.",
    "curve_windows": "Window sizes whose native windowed PPL is measured along training (P2 Figs 8-9); empty = none.",
    "curve_every": "Steps between the --lm_curve_windows measurements (a multiple of --eval_every; 0 = at every "
                   "evaluation); the last step is always measured.",
    "interventions": f"Phase interventions at every window size: some of {', '.join(PHASE_KINDS)}.",
    "bc_window": "Window size of the B/C rotation-removal table (protocol §8.4); unset or 0 = skip.",
    "heatmap_window": "Window size of the layer-window heat map (protocol §8.1); unset or 0 = skip.",
    "diag_len": "State diagnostics (protocol §8.3) over the first N tokens of books this long; 0 = skip.",
    "diag_skip": "Leading positions excluded from the diagnostics (protocol §8.3: 2000).",
    "diag_short": "End of the diagnostics' shorter span (protocol §8.3: 16000).",
    "diag_books": "At most this many books for the diagnostics.",
    "trajectory_len": "Phase-trajectory figure over this many tokens; 0 = skip.",
    "memory_windows": "Window lengths whose peak memory is measured in fresh processes.",
    "bucket_row_len": "protocol §7.3: eval books joined with EOS in rows this long, PPL per position bucket; 0 = skip.",
    "bucket_width": "Positions per bucket of --lm_bucket_row_len rows.",
})
RUN_SKIP = ("text", "long_eval", "spec", "official_gate")
dataclass_flags.define(p2_lm.P2LMCfg, prefix=PREFIX, skip=RUN_SKIP, parsers={"init_official": _path},
                       module_name=__name__, helps={
    "variant": "The report's name of this model (e.g. rotation, no_rotation).",
    "init_official": "Evaluate an official Mamba-3 checkpoint: its safetensors file or folder with upstream's "
                     "config.json beside it, which gives the model (model flags given must agree; --a_activation is "
                     "the decay's: heavy, or softplus for weights before mamba_ssm c69aaab). No training. Empty: none.",
})
GATE_NAMES = {"published": "lm_official_ppl", "window": "lm_official_ppl_window",
              "tolerance": "lm_official_ppl_tolerance"}
GATE_PARSERS = {"window": _count}
dataclass_flags.define(NativePPLGate, names=GATE_NAMES, parsers=GATE_PARSERS, module_name=__name__, helps={
    "published": "--lm_init_official: the published native PPL at --lm_official_ppl_window; the run stops before any "
                 "intervention unless the converted checkpoint measures it within the tolerance.",
    "window": "--lm_init_official: the window size of --lm_official_ppl (default: the first of --lm_windows).",
    "tolerance": "--lm_init_official: allowed |measured / published - 1|.",
})
# Their names before the prefix, still read.
dataclass_flags.keep_old_names({
    **{old: PREFIX + old for old in (
        "corpus", "eval_corpus", "eval_split", "tfds_data_dir", "text_key", "eval_batch", "max_train_tokens",
        "max_valid_tokens", "max_eval_books", "token_cache_dir", "score_last", "piece_len", "window_batch",
        "pseudo_books", "bc_window", "heatmap_window", "diag_len", "diag_skip", "diag_short", "diag_books",
        "trajectory_len", "memory_windows", "bucket_row_len", "bucket_width", "variant", "init_official",
        "official_ppl", "official_ppl_window", "official_ppl_tolerance")},
    "window_curve_windows": "lm_curve_windows", "window_curve_every": "lm_curve_every"}, __name__)

FLAGS = flags.FLAGS
GROUPS_READ = ("run", "lr", "model", "optim", "mesh", "loop", "seq_len", "tokenizer")


def config_from_flags() -> p2_lm.P2LMCfg:
    official = FLAGS.lm_init_official or None  # empty: none (how a scale's file clears its paper file's)
    steps = None if official else tf.require("steps", "p2_lm")
    batch = tf.require("batch", "p2_lm")
    lr = tf.one_lr("p2_lm", default=1e-3 if official else None)
    if official and FLAGS.steps is not None:
        raise ConfigError("--lm_init_official evaluates a converted checkpoint without training; drop --steps")
    seed = tf.grid().seed
    text = dataclass_flags.build(p2_lm.TextCfg, p2_lm.TextCfg(tokenizer=FLAGS.tokenizer, seq_len=FLAGS.seq_len,
                                                              batch=batch),
                                 prefix=PREFIX, skip=TEXT_SKIP, names=TEXT_NAMES, parsers=TEXT_PARSERS)
    long_eval = dataclass_flags.build(LongEvalCfg, LongEvalCfg(shuffle_seed=seed), prefix=PREFIX, skip=EVAL_SKIP,
                                      names=EVAL_NAMES, parsers=EVAL_PARSERS)
    model, gate = (_official(official, long_eval) if official else (tf.model_cfg(), None))
    spec = RunSpec(model=model, optim=tf.optim_cfg(lr, steps or 1), mesh=tf.mesh_cfg(), grid=Grid(seed=seed),
                   loop=None if official else tf.loop_cfg(steps, name="p2_lm"), preset=tf.preset())
    cfg = dataclass_flags.build(p2_lm.P2LMCfg, p2_lm.P2LMCfg(text=text, long_eval=long_eval, spec=spec,
                                                             init_official=official, official_gate=gate),
                                prefix=PREFIX, skip=RUN_SKIP + ("init_official",))
    if not official and not _dry_run():  # a dry run describes flag files whose corpus is not here
        _check_train_split(cfg.text)
    return cfg


def _check_train_split(text: p2_lm.TextCfg) -> None:
    """The training split is there and holds text: listed (names and sizes, nothing read) before
    the run directory is made, rather than found missing or empty by the prepare inside the run."""
    try:
        parts = pieces.listing(text.corpus, "train", data_dir=text.tfds_data_dir, text_key=text.text_key)
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise ConfigError(f"--lm_corpus={text.corpus}: {e}") from None
    if not any(size for _, size in parts):
        raise ConfigError(f"--lm_corpus={text.corpus}: the train split is empty ({len(parts)} parts, 0 bytes of text); "
                          "expected a corpus with text to train on")


def _dry_run() -> bool:
    return "dry_run" in FLAGS and bool(FLAGS.dry_run)


def _official(path: str, long_eval: LongEvalCfg):
    """The model of --lm_init_official (its config.json, the model flags given checked against it) and
    the native-PPL gate. A dry run without the checkpoint shows the model flags instead."""
    if tf.preset() is not None:
        raise ConfigError(f"--preset={FLAGS.preset} with --lm_init_official: the checkpoint's config.json gives the "
                          "model; expected no --preset")
    given_gate = dataclass_flags.overrides(NativePPLGate, names=GATE_NAMES, parsers=GATE_PARSERS)
    given_gate["window"] = given_gate.get("window") or long_eval.windows[0]
    gate = None
    if "published" in given_gate:
        gate = NativePPLGate(**given_gate).validate(long_eval)
    elif not _dry_run():
        raise ConfigError("--lm_init_official needs --lm_official_ppl: the published native PPL at window "
                          f"{given_gate['window']} (--lm_official_ppl_window), which the converted checkpoint must reproduce "
                          "before any intervention is measured")
    given = dataclass_flags.overrides(ModelCfg)
    if cv.read_config(path) is None:
        if _dry_run():
            return tf.model_cfg(), gate
        raise ConfigError(f"--lm_init_official={path}: no {cv.config_path(path)}; expected an upstream mamba_ssm "
                          "checkpoint with its config.json beside the weights")
    try:
        return cv.official_config(path, a_activation=given.pop("a_activation", None), **given), gate
    except ValueError as e:
        raise ConfigError(f"--lm_init_official={path}: {e}") from None


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
        "native-PPL gate: " + ("none yet: a run needs --lm_official_ppl" if cfg.official_gate is None else
                               f"published {cfg.official_gate.published} at window {cfg.official_gate.window}, "
                               f"±{100 * cfg.official_gate.tolerance:g}%, before any intervention"),
        text])


def run(cfg, run_dir) -> dict:
    return p2_lm.run(cfg, run_dir)
