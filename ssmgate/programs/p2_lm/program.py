"""Program `p2_lm`: pretrain a language model on text and evaluate it the way P2 does (protocol §7, 8).

    python -m ssmgate.main --flagfile=experiments/p2/cpu/lm_rope05.flags --run_dir=runs/lm_rope05

1. Data (protocol §7.1, issue #7): documents of `--lm_corpus` ('embedded', 'pg19:<folder>', 'tfds:<name>',
   'files:<glob>') tokenized (`--tokenizer`: byte, or a tokenizer.json / SentencePiece .model),
   joined with EOS and cut into rows of seq_len + 1 tokens. The training split is prepared once
   into token shards (`ssmgate.data.prepare`, under `--lm_token_cache_dir`, else a temporary folder
   of the run) and read by `ssmgate.data.loader`: each process reads only its rows of each batch,
   and the batch of step k is a function of (seed, k) only, byte-identical to
   `text_packing.batch_at` of the same stream, so a resumed run sees the batches of an
   uninterrupted one. The validation split stays one small in-memory stream.
2. Training with the framework's loop (orbax checkpoints, automatic resume, metrics.jsonl); every
   `--eval_every` steps the held-out PPL over all validation rows (state reset per row): the
   validation curve of Fig 7. With `--lm_curve_windows` the evaluation every
   `--lm_curve_every` steps (and at the end) also measures the native windowed PPL at those
   window sizes on the evaluation's windows (logged as eval_window_ppl_<C>): P2 Figs 8-9.
3. The long-context evaluation of `long_eval` on the books of `--lm_eval_split` of `--lm_eval_corpus`:
   protocol §7.2 windows at every `--lm_windows` size, and on a rotation model the interventions,
   write/read removal, layer-window heat map, state diagnostics and phase trajectories. With
   `--lm_init_official=<safetensors>` (and no --steps) it evaluates a converted official checkpoint
   without training.

summary.json: "variant", "params", "steps", "wall_s", "train_wall_s", "tokens_per_s", "ppl" (final
validation PPL), "val_curve" ([step, ppl] pairs), "window_ppl_along_training" ({step: {C: PPL}},
from metrics.jsonl; {} without --lm_curve_windows), "params_digest", "data" (token counts), and
"long_eval" (long_eval.evaluate's dict).
"""
from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.cli import dataclass_flags
from ssmgate.config_error import ConfigError
from ssmgate.data import loader as data_loader
from ssmgate.data.prepare import PrepareMismatch, prepare
from ssmgate.data.store import TokenStore
from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.models.lm import build_model
from ssmgate.programs.p2_lm import long_eval as le
from ssmgate.programs.p2_lm.long_eval import LongEvalCfg, evaluate
from ssmgate.tasks import text_corpus, text_packing
from ssmgate.tasks.synthetic_lm import LMBatch
from ssmgate.tasks.tokenizers import load_tokenizer
from ssmgate.train import lm_runs
from ssmgate.train import mesh as meshlib
from ssmgate.train.compile_forward import ForwardPlan
from ssmgate.train.compile_step import TrainPlan
from ssmgate.train.experiment import run_experiment
from ssmgate.train.lm_runs import text_loss
from ssmgate.train.run_dir import RunDir, say
from ssmgate.train.run_spec import RunSpec
from ssmgate.train.throughput import Throughput
from ssmgate.train.writers import plot_curves


@dataclasses.dataclass(frozen=True)
class TextCfg:
    corpus: str = "embedded"            # training and validation text (text_corpus.open_corpus)
    eval_corpus: str = ""               # the long-context books; "" = corpus
    eval_split: str = "test"
    tokenizer: str = "byte"             # "byte" or a tokenizer.json / .model file
    tfds_data_dir: Optional[str] = None
    text_key: str = "book_text"         # the text feature of a TFDS dataset
    seq_len: int = 256
    batch: int = 16
    eval_batch: int = 16                # validation rows per forward
    max_train_tokens: Optional[int] = None
    max_valid_tokens: Optional[int] = None
    max_eval_books: Optional[int] = None
    cache_dir: Optional[str] = None     # training shards and validation .npy; None = tokenize every run

    def validate(self) -> "TextCfg":
        for name in ("seq_len", "batch", "eval_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
        for name in ("max_train_tokens", "max_valid_tokens", "max_eval_books"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name}={v}: expected >= 1 (or unset)")
        if self.eval_split not in text_corpus.SPLITS:
            raise ValueError(f"eval_split={self.eval_split!r}: expected one of {text_corpus.SPLITS}")
        for name in ("corpus", "eval_corpus"):
            if getattr(self, name):
                text_corpus.parse_corpus(getattr(self, name), name)
        return self


@dataclasses.dataclass(frozen=True)
class P2LMCfg:
    text: TextCfg
    long_eval: LongEvalCfg
    spec: RunSpec                        # model, optimizer, loop (None: evaluate --lm_init_official's weights, no
                                         # training), mesh; its grid: the one seed
    variant: str = ""                   # the report's name for this model (e.g. "rotation")
    init_official: Optional[str] = None  # safetensors of an official Mamba-3 checkpoint: evaluated, not trained
    official_gate: Optional[object] = None  # official_gate.NativePPLGate, checked before anything is measured

    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed: model, optimizer, data and seed (keyed as the program's
        first checkpoints were)."""
        text = {k: v for k, v in dataclasses.asdict(self.text).items()
                if k not in ("eval_corpus", "eval_split", "eval_batch", "max_eval_books", "cache_dir")}
        return self.spec.fingerprint({"text": text, "seed": self.spec.grid.seed}, parts=("model", "optim"))

    def validate(self) -> "P2LMCfg":
        model = self.spec.validate().model
        for part in (self.text, self.long_eval):
            try:
                part.validate()
            except ValueError as e:
                raise ConfigError(lm_flag_message(str(e), type(part))) from None
        try:
            meshlib.check_batch(self.text.batch, self.spec.mesh.data, self.spec.mesh.microbatches)  # -1: by train()
        except ValueError as e:
            raise ConfigError(f"--{e}") from None
        # A tokenizer file is opened (and its vocabulary checked) when the run loads its data.
        tokenizer = load_tokenizer(self.text.tokenizer) if self.text.tokenizer == "byte" else None
        if tokenizer is not None and tokenizer.vocab_size > model.vocab_size:
            raise ConfigError(f"--vocab_size={model.vocab_size}: the tokenizer {tokenizer.name!r} has "
                              f"{tokenizer.vocab_size} tokens; expected --vocab_size >= {tokenizer.vocab_size}")
        if (self.init_official is None) == (self.spec.loop is None):
            raise ConfigError("--lm_init_official evaluates a converted checkpoint without training, and --steps "
                              "trains: expected exactly one of them")
        curve = self.long_eval
        if curve.curve_windows and self.spec.loop is None:
            raise ConfigError("--lm_curve_windows measures the windowed PPL along training; an --lm_init_official "
                              "run does not train: expected no --lm_curve_windows")
        if curve.curve_windows and curve.curve_every and self.spec.loop is not None:
            every = self.spec.loop.eval_every
            if not every or curve.curve_every % every:
                raise ConfigError(f"--lm_curve_every={curve.curve_every}: the curve is measured at evaluations; "
                                  f"expected a multiple of --eval_every={every} (> 0), or 0 for every evaluation")
        return self



# The data's and the long-context evaluation's fields are --lm_<field> but these (the shared --tokenizer,
# --seq_len and --batch; the plainer --lm_token_cache_dir and --lm_window_batch).
TEXT_FLAGS = {"tokenizer": "tokenizer", "seq_len": "seq_len", "batch": "batch", "cache_dir": "lm_token_cache_dir"}
EVAL_FLAGS = {"batch": "lm_window_batch"}


def lm_flag_message(message: str, cls) -> str:
    """A TextCfg / LongEvalCfg validate() message, 'field=value: ...', as '--<flag>=value: ...'."""
    return dataclass_flags.flag_message(message, cls, "lm_", TEXT_FLAGS if cls is TextCfg else EVAL_FLAGS,
                                        unmatched="keep")

@dataclasses.dataclass
class TextData:
    train: TokenStore            # prepared token shards, read per batch
    valid: np.ndarray            # token stream
    books: list                  # eval books, token arrays
    tokenizer_name: str
    eos_id: int
    scratch: Optional[tempfile.TemporaryDirectory] = None  # holds `train` when there is no cache_dir


def _cache(cfg: TextCfg, corpus: str, split: str) -> Optional[str]:
    if cfg.cache_dir is None:
        return None
    safe = "".join(ch if ch.isalnum() else "_" for ch in corpus)
    return f"{cfg.cache_dir}/{safe}_{split}_{cfg.tokenizer.replace('/', '_')}.npy"


def _train_shards(cfg: TextCfg) -> tuple[TokenStore, Optional[tempfile.TemporaryDirectory]]:
    """The training split's token shards: prepared once under cache_dir (beside the .npy
    streams, named the same way), or into a temporary folder that lives as long as the data."""
    scratch = None
    if cfg.cache_dir is None:
        scratch = tempfile.TemporaryDirectory(prefix="ssmgate-train-tokens-")
        out = f"{scratch.name}/shards"
    else:
        out = _cache(cfg, cfg.corpus, "train").removesuffix(".npy") + ".shards"
    try:
        store = prepare(cfg.corpus, "train", out, tokenizer=cfg.tokenizer, max_tokens=cfg.max_train_tokens,
                        data_dir=cfg.tfds_data_dir, text_key=cfg.text_key,
                        log=say if jax.process_index() == 0 else None)
    except PrepareMismatch as e:
        raise ConfigError(f"--lm_token_cache_dir: {e}") from None
    return store, scratch


def load_text(cfg: TextCfg, vocab_size: int) -> TextData:
    tok = load_tokenizer(cfg.tokenizer)
    if tok.vocab_size > vocab_size:
        raise ConfigError(f"--vocab_size={vocab_size}: the tokenizer {cfg.tokenizer} has {tok.vocab_size} tokens; "
                          f"expected --vocab_size >= {tok.vocab_size}")
    open_ = lambda spec, split: text_corpus.open_corpus(spec, split, data_dir=cfg.tfds_data_dir,
                                                        text_key=cfg.text_key)
    train, scratch = _train_shards(cfg)
    valid = text_packing.token_stream(open_(cfg.corpus, "validation"), tok, max_tokens=cfg.max_valid_tokens,
                                      cache_path=_cache(cfg, cfg.corpus, "validation"))
    books = []
    for doc in open_(cfg.eval_corpus or cfg.corpus, cfg.eval_split):
        if cfg.max_eval_books is not None and len(books) >= cfg.max_eval_books:
            break
        books.append(np.asarray(tok.encode(doc), np.int32))
    for name, check in (("train", lambda: data_loader.RowSource(train, cfg.seq_len)),
                        ("validation", lambda: text_packing.n_rows(valid, cfg.seq_len))):
        try:
            check()
        except ValueError as e:
            raise ConfigError(f"--lm_corpus={cfg.corpus}: the {name} split is too short for --seq_len={cfg.seq_len}"
                              f" ({e})") from None
    return TextData(train, valid, books, tok.name, int(tok.eos_id), scratch)


def describe(cfg: P2LMCfg) -> str:
    lines = [f"model: {cfg.spec.model}", f"optimizer: {cfg.spec.optim}", f"text: {cfg.text}",
             f"long_eval: {cfg.long_eval}",
             f"loop: {cfg.spec.loop}", "", presets.count_table(cfg.spec.model, cfg.spec.preset or "")]
    if cfg.spec.preset in presets.PAPER_SIZES:
        paper, total = presets.PAPER_SIZES[cfg.spec.preset], presets.param_count(cfg.spec.model)
        lines.append(f"  the paper states {paper / 1e6:,.0f} M: this model is {100 * (total / paper - 1):+.1f}%")
    return "\n".join(lines + lm_runs.describe_mesh(cfg.spec.model, cfg.spec.mesh, cfg.text.batch))


@dataclasses.dataclass(frozen=True)
class _Curve:
    """The windowed PPL along training (P2 Figs 8-9): at the evaluations of `due` steps, the native
    windowed PPL at `ecfg.curve_windows` on the evaluation's windows."""
    model: ModelCfg
    ecfg: LongEvalCfg
    windows: le.WindowBooks
    last_step: int

    def due(self, step: int) -> bool:
        every = self.ecfg.curve_every
        return not every or step % every == 0 or step == self.last_step

    def measure(self, params) -> dict:
        say("[p2_lm] windowed PPL along training at " + ", ".join(map(str, self.ecfg.curve_windows)))
        return le.window_ppl(self.model, params, self.windows, self.ecfg.curve_windows, self.ecfg)


def _curve(cfg: P2LMCfg, data: TextData) -> Optional[_Curve]:
    if not cfg.long_eval.curve_windows or cfg.spec.loop is None:
        return None
    ecfg = cfg.long_eval.validate()
    return _Curve(cfg.spec.model, ecfg, le.window_books(data.books, ecfg, data.eos_id), cfg.spec.loop.steps)


def _validation_fn(model, data: TextData, cfg: TextCfg, curve: Optional[_Curve] = None):
    """state -> {"loss", "ppl", "accuracy"} pooled over every validation row (zero state per row), and
    at the curve's steps {"window_ppl_<C>": native windowed PPL}."""
    score = jax.jit(lambda params, batch: text_loss(model.apply({"params": params}, batch.inputs)[0], batch)[1])

    def eval_fn(state):
        sums = np.zeros(3)
        for batch in text_packing.eval_batches(data.valid, cfg.seq_len, cfg.eval_batch):
            m = jax.device_get(score(state.params, batch))
            sums += [float(m["nll_sum"]), float(m["n_tokens"]), float(m["n_correct"])]
        nll = sums[0] / sums[1]
        out = {"loss": nll, "ppl": math.exp(nll), "accuracy": sums[2] / sums[1]}
        step = getattr(state, "step", None)
        if curve is not None and step is not None and curve.due(int(np.asarray(jax.device_get(step)).reshape(-1)[0])):
            out.update({f"window_ppl_{c}": v for c, v in curve.measure(state.params).items()
                        if v is not None})  # None: no book longer than C
        return out
    return eval_fn


def training_plan(cfg: P2LMCfg) -> TrainPlan:
    """The run's step (the run's and `python -m ssmgate.aot`'s): --batch rows of --seq_len tokens."""
    if cfg.spec.loop is None:
        raise ConfigError(f"--lm_init_official={cfg.init_official}: this run evaluates a converted checkpoint and has no "
                          "training step to compile")
    return TrainPlan(cfg.spec.model, cfg.spec.optim, tuple(cfg.spec.replicas), text_loss, cfg.spec.mesh,
                     batch=lambda: LMBatch.shapes(cfg.text.batch, cfg.text.seq_len))


def forward_plan(cfg: P2LMCfg) -> Optional[ForwardPlan]:
    """The forward pass of a run that evaluates a converted checkpoint (`python -m ssmgate.aot`): every
    model of the long-context evaluation on --lm_window_batch windows of --lm_piece_len tokens; None for a
    run that trains (its step is `training_plan`'s). Its shape is the checkpoint's config.json."""
    if cfg.init_official is None:
        return None
    from ssmgate.interventions import convert_mamba3 as cv
    if cv.read_config(cfg.init_official) is None:
        raise ConfigError(f"--lm_init_official={cfg.init_official}: no {cv.config_path(cfg.init_official)} here; the "
                          "forward pass has the checkpoint's shape: expected upstream's config.json beside its weights")
    ecfg = cfg.long_eval
    return ForwardPlan(cfg.spec.model, le.forward_models(cfg.spec.model, ecfg), rows=ecfg.batch, piece_len=ecfg.piece_len,
                       cache_len=max(ecfg.windows))


def train(cfg: P2LMCfg, rd: RunDir, data: TextData):
    """The training loop: (params, loop result)."""
    text = cfg.text
    trained = run_experiment(
        rd, **training_plan(cfg).engine(), loop_cfg=cfg.spec.loop, batch=text.batch, fingerprint=cfg.fingerprint(),
        meta={"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str))},
        eval_fn=lambda built: _validation_fn(built.model, data, text, _curve(cfg, data)),
        throughput=Throughput.for_lm(cfg.spec.model, text.batch, text.seq_len),
        global_batch=lambda sharding: data_loader.global_batch_fn(data.train, text.seq_len, text.batch, cfg.spec.grid.seed,
                                                                  sharding))
    return trained.result.state.params, trained.result


@dataclasses.dataclass
class _Params:  # what _validation_fn reads of a training state
    params: dict


def _val_curve(rd: RunDir) -> list:
    return [[r["step"], r["eval_ppl"]] for r in rd.read_metrics() if r.get("kind") == "eval" and "eval_ppl" in r]


def _window_curve(rd: RunDir) -> dict:
    """{str(step): {str(C): windowed PPL}} of the evaluations that measured it (P2 Figs 8-9)."""
    prefix = "eval_window_ppl_"
    out: dict = {}
    for r in rd.read_metrics():
        if r.get("kind") == "eval":
            row = {k.removeprefix(prefix): v for k, v in r.items() if k.startswith(prefix)}
            if row:
                out[str(r["step"])] = dict(sorted(row.items(), key=lambda kv: int(kv[0])))
    return out


def run(cfg: P2LMCfg, run_dir) -> dict:
    rd = RunDir.of(run_dir)
    start = time.perf_counter()
    data = load_text(cfg.text, cfg.spec.model.vocab_size)
    say(f"[p2_lm] data: {len(data.train):,} train / {len(data.valid):,} validation tokens, "
        f"{len(data.books)} eval books ({sum(map(len, data.books)):,} tokens), tokenizer {data.tokenizer_name}")
    try:  # before training: the windowed evaluation must have its books
        windows = le.window_books(data.books, cfg.long_eval, data.eos_id).describe()
    except ValueError as e:
        raise ConfigError(f"--lm_pseudo_books={cfg.long_eval.pseudo_books}: {e}") from None
    if windows["layout"] == "pseudo_books":
        say(f"[p2_lm] windows on {windows['pseudo_books']} pseudo-books of {windows['pseudo_book_tokens']:,} tokens, "
            f"every window size ending where the {windows['anchor']}-token windows end")
    if cfg.spec.loop is None:
        from ssmgate.interventions.convert_mamba3 import load_official
        params = jax.tree.map(jnp.asarray, load_official(cfg.init_official, cfg.spec.model))
        if cfg.official_gate is not None:  # stops the run unless the converted model is the published one
            cfg.official_gate.check(cfg.spec.model, params, data.books, cfg.long_eval, rd, lm_runs.params_digest(params),
                                      eos_id=data.eos_id)
        evals = _validation_fn(build_model(cfg.spec.model), data, cfg.text)(_Params(params))
        trained = {"steps": 0, "resumed_from": None, "tokens_per_s": None, "init_official": cfg.init_official}
    else:
        params, result = train(cfg, rd, data)
        evals = {k.removeprefix("eval_"): v for k, v in result.last_eval.items()}
        steps_run = result.step - (result.resumed_from or 0)
        trained = {"steps": result.step, "resumed_from": result.resumed_from,
                   "tokens_per_s": steps_run * cfg.text.batch * cfg.text.seq_len / max(result.wall_s, 1e-9)}
    train_wall = time.perf_counter() - start
    digest = lm_runs.params_digest(params)
    long_eval = evaluate(cfg.spec.model, params, data.books, cfg.long_eval, rd, digest, eos_id=data.eos_id)
    summary = {"variant": cfg.variant, "params": presets.param_count(cfg.spec.model), **trained,
               "train_wall_s": train_wall, "wall_s": time.perf_counter() - start,
               "ppl": evals.get("ppl"), "val_accuracy": evals.get("accuracy"),
               "val_curve": _val_curve(rd), "window_ppl_along_training": _window_curve(rd),
               "params_digest": digest,
               "data": {"train_tokens": int(len(data.train)), "valid_tokens": int(len(data.valid)),
                        "eval_books": len(data.books), "tokenizer": data.tokenizer_name},
               "long_eval": long_eval}
    if jax.process_index() == 0:
        rd.write_json("summary.json", summary)
        plot_curves(rd, names=("loss", "ppl", "accuracy"))
    say(f"[p2_lm] validation PPL {summary['ppl']:.3f}; window PPL "
        + ", ".join(f"{c}: {v:.3f}" for c, v in long_eval["window_ppl"].items() if v is not None))
    return summary
