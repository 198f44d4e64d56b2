"""Program `p1_tools`: tool calling with retrieved tool pools after gate scaling (P1 §5, Figs 4-5).

    python -m ssmgate.main --flagfile=experiments/p1/cpu/tools_sft.flags --run_dir=runs/p1_tools/tools_sft

1. Start from a pretrained language model: the latest checkpoint of `--tools_init_run` (a run directory,
   e.g. of `p2_lm` with `--block=mamba2`; relative paths are siblings of --run_dir), or fresh
   weights when it is empty.
2. One replica per gate scale s of `--gate_offset` (written `ln:s`; Mamba-2: A_log += ln s, P1's e^lambda <- s
   e^lambda before fine-tuning), all fine-tuned by one vmapped program on the same batches:
   tool-calling prompts built from BFCL python simple's documents (`tasks.tool_prompts`) for the
   functions that are not held out, pools of k ~ U{1..--tools_k_max} by BM25 with the correct
   tool injected (`tasks.tool_pools.main_pool`), the loss on the answer's bytes. A model without
   a gate (Fig 4's Transformer, `--block=llama`) is one replica at `--gate_offset=0`.
3. Evaluation on the held-out functions' questions: greedy decoding of each replica at every pool
   size of `--tools_eval_k` (main setting) and, for every strength of `--tools_weak_betas`, at
   `--tools_weak_eval_k` with the weak Plackett–Luce retriever (no injection); every output scored by
   the BFCL checker (accuracy) and the out-of-pool hallucination counter (`tasks.bfcl_checker`),
   and read leniently for tool choice alone (the function an output starts to call: right name,
   name outside the pool). Each (setting, k) cell keeps its pools and outputs in
   `tools_eval_cells.jsonl`, so a killed evaluation resumes and scores are recomputed from them.
   The same scoring of as many training questions (their functions seen in fine-tuning) at k =
   --tools_k_max tells a model that answers from its weights from one that learnt nothing.

summary.json: "gate_scales", "accuracy" {s: {k: value}}, "hallucination" {s: {k}}, "malformed"
{s: {k}}, "name_accuracy" {s: {k}}, "name_out_of_pool" {s: {k}}, "weak" {beta: {s: {k}}} (accuracy),
"weak_hallucination" {beta: {s: {k}}}, "weak_name_accuracy" {beta: {s: {k}}},
"weak_recall" {beta: {k}}, "bm25_recall" {k}, "seen_accuracy" {s} (and "seen_" + each other metric: the
first n_test training questions in main-setting pools of k_max), "n_seen", "samples" (a few outputs), "n_test", "n_train",
"held_out_functions", "steps", "wall_s", "train_wall_s", "params_digest".
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from ssmgate.cli import dataclass_flags
from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.tasks import bfcl, bfcl_checker, tool_pools, tool_prompts as tpr
from ssmgate.tasks.synthetic_lm import LMBatch
from ssmgate.tasks.tokenizers import load_tokenizer
from ssmgate.train import lm_decode
from ssmgate.train import lm_runs
from ssmgate.train import sweep
from ssmgate.train.cell_store import CellStore
from ssmgate.train.checkpoint import CheckpointError, Checkpointer
from ssmgate.train.compile_step import TrainPlan
from ssmgate.train.experiment import run_experiment
from ssmgate.train.lm_runs import text_loss
from ssmgate.train.run_dir import RunDir, say
from ssmgate.train.run_spec import RunSpec
from ssmgate.train.writers import plot_curves

CELLS_FILE = "tools_eval_cells.jsonl"


@dataclasses.dataclass(frozen=True)
class ToolsCfg:
    test_percent: int = 20          # functions held out for testing (by a hash of the name)
    k_max: int = 24                 # training pools k ~ U{1..k_max} (protocol §5.2 [REC])
    seq_len: int = 4096             # the longest training row
    quantum: int = 256
    batch: int = 8
    eval_k: tuple[int, ...] = (1, 4, 8, 16, 24, 32, 48, 64, 72)   # protocol §5.2 [REC]
    weak_betas: tuple[float, ...] = (0.05, 10.0)                   # protocol §5.4
    weak_k: tuple[int, ...] = (1, 4, 8, 16, 24, 32, 48, 64, 72)
    max_new: int = 96               # decoded bytes per answer
    eval_batch: int = 32            # prompts per decoding program
    max_test: Optional[int] = None  # evaluate only the first N held-out questions
    tokenizer: str = "byte"         # "byte", or the pretrained model's tokenizer.json / .model
    data_dir: Optional[str] = None  # BFCL data folder (default: the bfcl-eval package's)

    def validate(self) -> "ToolsCfg":
        for name in ("k_max", "seq_len", "quantum", "batch", "max_new", "eval_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected >= 1")
        if not 0 < self.test_percent < 100:
            raise ValueError(f"test_percent={self.test_percent}: expected 1..99")
        for name in ("eval_k", "weak_k"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: expected pool sizes >= 1")
        if any(not b >= 0 for b in self.weak_betas):
            raise ValueError(f"weak_betas={self.weak_betas}: expected strengths >= 0")
        if self.max_test is not None and self.max_test < 1:
            raise ValueError(f"max_test={self.max_test}: expected >= 1")
        return self


# ToolsCfg's fields are --tools_<field> but these (the shared --batch and --tokenizer, two named more plainly).
TOOLS_FLAGS = {"batch": "batch", "tokenizer": "tokenizer", "weak_k": "tools_weak_eval_k",
               "data_dir": "tools_bfcl_data_dir"}


@dataclasses.dataclass(frozen=True)
class P1ToolsCfg:
    tools: ToolsCfg
    spec: RunSpec             # model, optimizer, loop, mesh; its grid: the gate offsets ln s at one seed
    init_run: str = ""

    def fingerprint(self) -> str:
        """The model, the optimizer, the data, the offsets, the starting weights and the seed (keyed as the
        program's first checkpoints were)."""
        tools = {k: v for k, v in dataclasses.asdict(self.tools).items()
                 if k in ("test_percent", "k_max", "seq_len", "quantum", "batch", "data_dir", "tokenizer")}
        return self.spec.fingerprint({"tools": tools, "gate_offsets": list(self.spec.grid.offsets),
                                      "init_run": self.init_run, "seed": self.spec.grid.seed},
                                     parts=("model", "optim"))

    @property
    def gate_scales(self) -> tuple:
        """P1's gate scales s = e^delta, the labels of the replicas and of the summary."""
        return tuple(math.exp(o) for o in self.spec.grid.offsets)

    def validate(self) -> "P1ToolsCfg":
        try:
            self.tools.validate()
        except ValueError as e:
            raise ConfigError(dataclass_flags.flag_message(str(e), ToolsCfg, "tools_", TOOLS_FLAGS,
                                                           unmatched="keep")) from None
        model = self.spec.validate().model
        if self.spec.grid.seeds != 1 or self.spec.grid.more_lrs:
            raise ConfigError("p1_tools fine-tunes one seed at one learning rate (protocol §5.2); expected "
                              "--seeds=1 and one --lr")
        if self.tools.tokenizer == "byte" and model.vocab_size < tpr.BYTES.vocab_size:
            raise ConfigError(f"--vocab_size={model.vocab_size}: the byte tokenizer has "
                              f"{tpr.BYTES.vocab_size} tokens; expected --vocab_size >= {tpr.BYTES.vocab_size}")
        return self


def _key(s: float) -> str:
    return f"{s:g}"


def init_run_dir(cfg: P1ToolsCfg, run_dir) -> Optional[Path]:
    if not cfg.init_run:
        return None
    path = Path(cfg.init_run)
    return path if path.is_absolute() else Path(run_dir).parent / path


def load_base_params(cfg: P1ToolsCfg, where: Optional[Path]):
    """The pretrained parameters of `where`'s latest checkpoint, checked against the model flags."""
    if where is None:
        return None
    if not (where / "checkpoints").is_dir():
        raise ConfigError(f"--tools_init_run={cfg.init_run}: {where} holds no checkpoints/ (expected the run directory "
                          "of a finished pretraining run)")
    with Checkpointer(where / "checkpoints") as c:
        try:
            step, state, _ = c.restore_raw()
        except CheckpointError as e:
            raise ConfigError(f"--tools_init_run={cfg.init_run}: {e}") from None
    params = state.get("params") if isinstance(state, dict) else None
    expected = presets.param_shapes(cfg.spec.model)
    got = None if params is None else jax.tree.map(np.shape, params)
    want = jax.tree.map(lambda a: tuple(a.shape), expected)
    if got != want:
        raise ConfigError(f"--tools_init_run={cfg.init_run}: the checkpoint's parameters (step {step}) do not fit the "
                          f"model flags ({cfg.spec.model.block}, d_model {cfg.spec.model.d_model}, "
                          f"{cfg.spec.model.n_layers} layers);"
                          " pass the pretraining run's model flags")
    say(f"[p1_tools] starting from step {step} of {where}")
    return jax.tree.map(lambda a: np.asarray(a, np.float32), params)


def describe(cfg: P1ToolsCfg) -> str:
    return "\n".join([f"model: {cfg.spec.model}", f"optimizer: {cfg.spec.optim}", f"tools: {cfg.tools}",
                      f"gate scales: {', '.join(map(_key, cfg.gate_scales))} (one vmapped sweep)",
                      f"init_run: {cfg.init_run or '(fresh weights)'}", f"loop: {cfg.spec.loop}", "",
                      presets.count_table(cfg.spec.model, cfg.spec.preset or "")]
                     + lm_runs.describe_mesh(cfg.spec.model, cfg.spec.mesh))


def _score(outputs, examples, pools) -> dict:
    """The checker's accuracy, hallucination and malformed rates, and how often the pool held the tool."""
    got = bfcl_checker.score(outputs, [e.function for e in examples], [e.answer for e in examples], pools)
    return {**got, "recall": float(np.mean([e.name in pool for e, pool in zip(examples, pools)]))}


STRICT, LENIENT = ("accuracy", "hallucination", "malformed"), ("name_accuracy", "name_out_of_pool")


def evaluate(cfg: P1ToolsCfg, model, params_stacked, data: tpr.ToolData, store: CellStore) -> dict:
    """Every (setting, k) cell: per replica the checker's rates (STRICT) and the lenient tool-choice
    rates (LENIENT). A cell stores its pools and every decoded output, so scores are recomputed from
    them and a new metric never needs a new decoding."""
    t = cfg.tools
    examples = data.test[:t.max_test] if t.max_test else data.test
    scales = [_key(s) for s in cfg.gate_scales]

    def cell(setting: str, k: int, beta: Optional[float], asked=examples, which="held-out"):
        k = min(k, len(data.index))

        def measure():
            rng = np.random.default_rng([cfg.spec.grid.seed, k, 0 if beta is None else int(round(beta * 1000)) + 1])
            if beta is None:
                pools = [tool_pools.main_pool(data.index, e.question, e.name, k, rng) for e in asked]
            else:
                pools = [tool_pools.weak_pool(data.index, e.question, k, beta, rng) for e in asked]
            say(f"[p1_tools] decoding {len(asked)} {which} questions x {len(scales)} gate scales, "
                f"{setting} pools of {k}")
            outputs = [[] for _ in scales]
            for lo in range(0, len(asked), t.eval_batch):
                prompts = tpr.eval_prompts(data, asked[lo:lo + t.eval_batch], pools[lo:lo + t.eval_batch])
                eos = data.tokenizer.eos_id
                tokens = lm_decode.greedy(model, params_stacked, prompts, t.max_new, eos, replicas=True)
                for r in range(len(scales)):
                    outputs[r] += [data.tokenizer.decode(row) for row in lm_decode.until_eos(tokens[r], eos)]
            return {"pools": [list(p) for p in pools], "outputs": dict(zip(scales, outputs))}
        got = store.get(f"v2|{setting}|{k}", measure)
        return got, {s: _score(got["outputs"][s], asked, got["pools"]) for s in scales}

    out = {m: {s: {} for s in scales} for m in STRICT + LENIENT}
    out.update({"weak": {}, "weak_hallucination": {}, "weak_name_accuracy": {}, "weak_recall": {},
                "bm25_recall": {}, "samples": {}})
    for k in t.eval_k:
        got, scores = cell("main", k, None)
        for s in scales:
            for metric in STRICT + LENIENT:
                out[metric][s][str(k)] = scores[s][metric]
        out["bm25_recall"][str(k)] = tool_pools.bm25_recall(data.index, [e.question for e in examples],
                                                            [e.name for e in examples], min(k, len(data.index)))
        out["samples"][str(k)] = {s: got["outputs"][s][:3] for s in scales}
    # In distribution: questions of fine-tuning's own functions (answers seen in training), as many as are
    # tested, in its pools (main setting, k_max). Beside the held-out rows it separates a model that learnt
    # nothing from one that answers from its weights but not from the pool.
    seen = data.train[:len(examples)]
    _, scores = cell("seen", t.k_max, None, seen, "training")
    for metric in STRICT + LENIENT:
        out[f"seen_{metric}"] = {s: scores[s][metric] for s in scales}
    out["n_seen"] = len(seen)
    for beta in t.weak_betas:
        b = f"{beta:g}"
        for name in ("weak", "weak_hallucination", "weak_name_accuracy"):
            out[name][b] = {s: {} for s in scales}
        out["weak_recall"][b] = {}
        for k in t.weak_k:
            _, scores = cell(f"weak{b}", k, beta)
            for s in scales:
                out["weak"][b][s][str(k)] = scores[s]["accuracy"]
                out["weak_hallucination"][b][s][str(k)] = scores[s]["hallucination"]
                out["weak_name_accuracy"][b][s][str(k)] = scores[s]["name_accuracy"]
            out["weak_recall"][b][str(k)] = scores[scales[0]]["recall"]
    return out


def _held_out_loss(model, data: tpr.ToolData, cfg: P1ToolsCfg):
    """Teacher-forced loss on a fixed set of held-out questions with main-setting pools of k_max:
    the progress signal logged during fine-tuning (the decoding evaluation runs at the end)."""
    examples = data.test[:32]
    rng = np.random.default_rng([cfg.spec.grid.seed, 10 ** 6])
    rows, weights = [], []
    texts = []
    for e in examples:
        names = tool_pools.main_pool(data.index, e.question, e.name, min(data.k_max, len(data.index)), rng)
        texts.append((tpr.render_prompt(e.question, tpr.pool_docs(data.index, e, names)),
                      tpr.render_call(e.name, tpr.answer_args(e))))
    width = max(len(data.encode(p)) + len(data.encode(a)) + 1 for p, a in texts)
    for p, a in texts:
        t, w = tpr.encode_example(data, p, a, width)
        rows.append(t)
        weights.append(w)
    rows, weights = np.stack(rows), np.stack(weights)
    batch = LMBatch(rows[:, :-1], rows[:, 1:], weights[:, 1:])
    score = jax.jit(sweep.replica_vmap(lambda params: text_loss(model.apply({"params": params}, batch.inputs)[0], batch)))

    def eval_fn(state):
        loss, metrics = score(state.train.params)
        return {"loss": loss, "accuracy": metrics["accuracy"]}
    return eval_fn


def training_plan(cfg: P1ToolsCfg) -> TrainPlan:
    """The sweep's step (the run's and `python -m ssmgate.aot`'s); its largest batch: rows of --tools_seq_len."""
    replicas = tuple(cfg.spec.replicas)
    return TrainPlan(cfg.spec.model, cfg.spec.optim, replicas, text_loss, cfg.spec.mesh, force_sweep=True,
                     batch=lambda: LMBatch.shapes(cfg.tools.batch, cfg.tools.seq_len))


def run(cfg: P1ToolsCfg, run_dir) -> dict:
    rd = RunDir.of(run_dir)
    start = time.perf_counter()
    t = cfg.tools
    try:
        examples = bfcl.load_simple_python(t.data_dir)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None
    train, test = tpr.split(examples, t.test_percent)
    tokenizer = load_tokenizer(t.tokenizer)
    if tokenizer.vocab_size > cfg.spec.model.vocab_size:
        raise ConfigError(f"--vocab_size={cfg.spec.model.vocab_size}: the tokenizer {t.tokenizer} has "
                          f"{tokenizer.vocab_size} tokens")
    data = tpr.ToolData(tool_pools.ToolIndex([e.function for e in examples]), train, test, t.k_max, t.seq_len,
                        t.quantum, tokenizer)
    try:
        data.validate()
    except ValueError as e:
        raise ConfigError(f"--tools_{e}") from None
    say(f"[p1_tools] {len(train)} training / {len(test)} held-out questions ({len({e.name for e in test})} "
        f"held-out functions), shared pool of {len(data.index)} tools")
    base = load_base_params(cfg, init_run_dir(cfg, rd.path))
    labels = [f"s={_key(s)}" for s in cfg.gate_scales]
    trained = run_experiment(
        rd, **training_plan(cfg).engine(), loop_cfg=cfg.spec.loop, fingerprint=cfg.fingerprint(),
        meta={"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "labels": labels},
        eval_fn=lambda built: _held_out_loss(built.model, data, cfg), base_params=base,
        host_sample=lambda seed, k: tpr.sft_batch(data, t.batch, seed, k))
    built, result = trained.built, trained.result
    train_wall = time.perf_counter() - start
    params = result.state.train.params
    digest = lm_runs.params_digest(params)
    evals = evaluate(cfg, built.model, params, data, CellStore(rd.file(CELLS_FILE), digest))
    summary = {"gate_scales": [_key(s) for s in cfg.gate_scales], **evals, "n_train": len(train),
               "n_test": len(test[:t.max_test] if t.max_test else test),
               "held_out_functions": sorted({e.name for e in test}), "k_max_train": t.k_max, "steps": result.step,
               "resumed_from": result.resumed_from, "init_run": str(init_run_dir(cfg, rd.path) or ""),
               "train_wall_s": train_wall, "wall_s": time.perf_counter() - start, "params_digest": digest}
    if jax.process_index() == 0:
        rd.write_json("summary.json", summary)
        plot_curves(rd, names=("loss", "accuracy"), labels=labels)
    k_top = str(max(t.eval_k))
    say("[p1_tools] at k=" + k_top + ": " + "; ".join(
        f"s={s} acc {evals['accuracy'][s][k_top]:.3f} halluc {evals['hallucination'][s][k_top]:.3f} "
        f"name {evals['name_accuracy'][s][k_top]:.3f}"
        for s in summary["gate_scales"]))
    return summary
