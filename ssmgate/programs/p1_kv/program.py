"""Program `p1_kv`: P1's multi-token key-value retrieval (Fig 2; protocol §3, check C12 of §9).

One run trains a language model on the KV task of `ssmgate.tasks.kv_retrieval` (best-first or
best-last queries) for every gate offset delta (Mamba-2: A_log += delta at initialisation) and
every seed, at one peak learning rate, as ONE vmapped sweep. Training draws n ~ U{1..N} through
length buckets (`length_buckets.equal_buckets(1, N, kv_buckets)`; the bucket of step k comes from
(--seed, k), so every replica of the sweep shares the padded shape of step k while each example's n
is exactly U{1..N}). The loss is the masked LM loss on the value tokens of the query blocks.

Every `eval_every` steps all replicas are evaluated on one fixed set of `eval_n` examples at n = N
(its own seed, never a training key): pooled sequence accuracy (a query is right iff all m value
tokens are argmax-correct), and the same over queries whose in-context value was perturbed / clean
(a memoriser scores 0 / 1 there). A replica escapes at the first evaluation with seq_accuracy >
escape_thr (protocol §3.4: 0.95) and is frozen once it reaches stop_thr (protocol §3.3: 0.99). After training,
best-last runs evaluate every replica at each n of `lengen_ns` (fresh fixed sets, own seeds): Fig 2c.

summary.json:
  "replicas" (labels), "replica_offset", "replica_seed", "offsets", "seeds", "lr", "steps",
  "escape_step" [per replica; null = never], "stopped_step", "diverged",
  "escape_step_by_offset" {offset: [per seed]},
  "plateau_accuracy": median eval seq_accuracy of the delta >= 0 replicas over their evaluations
      before their escape (all of them if they never escape); null without delta >= 0 replicas,
  "memoriser_accuracy": (1 - eps)^m,
  "escape_fit" {slope, intercept, r2, n}: least squares escape step = slope e^delta + intercept over
      the escaped replicas (slope/intercept null with < 2 points or one e^delta; r2 null with < 3
      points or zero variance),
  "curves": [{"label", "offset", "seed", "step": [...], "seq_accuracy": [...]}] per replica (Fig 2a),
  "final" {metric: [per replica]} (the last evaluation),
  "lengen_accuracy" {offset: {n: {mean, ci95_lo, ci95_hi, per_seed}}} (best_last; a t-interval over
      seeds, lo = hi = mean with one seed), "lengen_examples" {n: examples}, "lengen_detail" {n: [every
      eval metric per replica]},
  "median_tau" {offset: {"init": [per seed], "final": [per seed]}} and "median_alpha_change"
      {offset: [per seed]} (Mamba-2; protocol §2.5 statistics of the per-head gates),
  "kv" (the task config), "block", "preset", "params", "eval_examples", "resumed_from", "wall_s".
Also kv_curve.csv (offset, seed, step, seq_acc) and, for best_last, kv_len.csv (offset, seed,
n_pairs, seq_acc) as protocol §0.1 names them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.cli import dataclass_flags
from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.tasks import kv_retrieval as kv
from ssmgate.tasks import length_buckets as lb
from ssmgate.tasks.synthetic_lm import lm_loss, step_key
from ssmgate.train import mesh as meshlib, sweep
from ssmgate.train import sweep_results
from ssmgate.train.compile_step import TrainPlan
from ssmgate.train.experiment import make_mesh, run_experiment
from ssmgate.train.run_dir import RunDir, say, to_jsonable
from ssmgate.train.run_spec import RunSpec
from ssmgate.train.step import cast_floating
from ssmgate.train.sweep_results import eval_curves, gate_stats, linear_fit, offset_key

EVAL_SEED = 5_000_011    # the in-distribution evaluation set (n = N); never a training key
LENGEN_SEED = 6_000_007  # + n: the length-generalisation sets
METRIC = "seq_accuracy"  # the escape / early-stop metric (protocol §3.4)


@dataclasses.dataclass(frozen=True)
class KVRunCfg:
    kv: kv.KVCfg                     # the task; kv.batch is the training batch
    spec: RunSpec                    # model, optimizer, loop, mesh, replicas, stop rule, evaluation sizes
    n_buckets: int = 8
    lengen_ns: tuple[int, ...] = ()

    @property
    def bounds(self) -> tuple:
        return lb.equal_buckets(1, self.kv.n_max, self.n_buckets)

    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed (not the mesh, the cadence or the lengen sets)."""
        return self.spec.fingerprint({"kv": dataclasses.asdict(self.kv), "n_buckets": self.n_buckets,
                                      "eval_n": self.spec.eval_n})

    def validate(self) -> "KVRunCfg":
        try:
            self.kv.validate()
        except ValueError as e:
            raise ConfigError(kv_flag_message(str(e))) from None
        model = self.spec.validate().model
        if model.vocab_size < self.kv.vocab_size:
            raise ConfigError(f"--vocab_size={model.vocab_size}: expected >= {self.kv.vocab_size} "
                              f"(5 special + --kv_vocab={self.kv.n_content} content tokens; "
                              f"{self.kv.padded_vocab} pads it to a multiple of 8)")
        if not 1 <= self.n_buckets <= self.kv.n_max:
            raise ConfigError(f"--kv_buckets={self.n_buckets}: expected an integer in 1..--kv_n_max={self.kv.n_max}")
        if self.spec.stop.escape_thr is None or self.spec.stop.stop_thr is None:
            raise ConfigError("--escape_thr and --stop_thr: Figure 2b's escape steps need both (protocol §3.3-3.4: "
                              "0.95 and 0.99)")
        if self.lengen_ns and self.kv.query != "best_last":
            raise ConfigError(f"--kv_lengen_ns={','.join(map(str, self.lengen_ns))}: length generalisation is "
                              "evaluated for --kv_query=best_last only (protocol §3.4, Fig 2c); expected it empty")
        for n in self.lengen_ns:
            if not 1 <= n <= self.kv.dict_size:
                raise ConfigError(f"--kv_lengen_ns: {n}: expected pair counts in 1..--kv_dict_size={self.kv.dict_size} "
                                  "(pairs are drawn without replacement)")
        if len(set(self.lengen_ns)) != len(self.lengen_ns):
            raise ConfigError(f"--kv_lengen_ns={','.join(map(str, self.lengen_ns))}: expected distinct pair counts")
        return self


TASK_FLAGS = {"n_content": "kv_vocab", "batch": "batch"}   # KVCfg's fields whose flag is not --kv_<field>


def kv_flag_message(message: str) -> str:
    """'n_max=0: expected ...' -> '--kv_n_max=0: expected ...' (KVCfg's field as its flag)."""
    return dataclass_flags.flag_message(message, kv.KVCfg, "kv_", TASK_FLAGS, unmatched="keep")


# --- data --------------------------------------------------------------------------------------------------

def eval_chunk(cfg: KVRunCfg, n: int, examples: int) -> tuple[int, int]:
    """(chunks, examples per chunk) of an evaluation at n pairs: a chunk holds at most the tokens of one
    training batch at n = N (so n = 4N evaluates a quarter of the batch at a time), and the chunks
    are balanced; the set has chunks x chunk >= `examples` examples."""
    budget = cfg.kv.batch * kv.seq_len(cfg.kv, cfg.kv.n_max)
    largest = max(1, min(examples, budget // kv.seq_len(cfg.kv, n)))
    chunks = -(-examples // largest)
    return chunks, -(-examples // chunks)


def fixed_set(cfg: KVRunCfg, dictionary, seed: int, n: int, examples: int) -> kv.KVBatch:
    """A fixed evaluation set at exactly n pairs, from its own seed: a KVBatch whose arrays have a
    leading chunk axis (chunks, chunk, ...)."""
    chunks, chunk = eval_chunk(cfg, n, examples)
    task = dataclasses.replace(cfg.kv, batch=chunk)
    keys = jax.random.split(jax.random.PRNGKey(seed), chunks)
    parts = [kv.sample_jit(k, task, dictionary, n, n) for k in keys]
    return jax.tree.map(lambda *a: jnp.stack(a), *parts)


def kv_loss(logits, batch: kv.KVBatch):
    """The training loss: masked cross-entropy on the query value tokens (lm_loss) and, as metrics,
    token accuracy and the per-query sequence accuracy of the batch."""
    loss, metrics = lm_loss(logits, batch)
    ok = kv.query_correct(jnp.argmax(logits, axis=-1), batch)
    queries = jnp.maximum(batch.query_mask.sum(), 1.0)
    return loss, {"accuracy": metrics["accuracy"], "seq_accuracy": ok.sum() / queries}


def make_evaluate(model, compute_dtype):
    """evaluate(params, data) -> pooled metrics over every chunk of a fixed set (exact counts, one
    compiled loop over chunks): loss, accuracy (tokens), seq_accuracy, seq_accuracy_perturbed,
    seq_accuracy_clean (nan when a set has no such query), n_queries."""
    def chunk_sums(params, b):
        logits, _ = model.apply({"params": params}, b.inputs)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, b.targets[..., None], axis=-1)[..., 0]
        pred = jnp.argmax(logits, axis=-1)
        ok = kv.query_correct(pred, b)
        valid = b.query_mask > 0
        pert = valid & b.query_perturbed
        clean = valid & ~b.query_perturbed
        count = lambda x: x.sum().astype(jnp.int32)
        return {"nll": (nll * b.mask).sum(), "tokens": count(b.mask > 0),
                "token_correct": count((pred == b.targets) & (b.mask > 0)),
                "queries": count(valid), "correct": count(ok), "perturbed": count(pert),
                "correct_perturbed": count(ok & pert), "clean": count(clean), "correct_clean": count(ok & clean)}

    def evaluate(params, data):
        params = cast_floating(params, compute_dtype)
        sums = jax.tree.map(lambda a: a.sum(0), jax.lax.map(lambda b: chunk_sums(params, b), data))
        ratio = lambda a, b: jnp.where(sums[b] > 0, sums[a] / jnp.maximum(sums[b], 1), jnp.nan)
        return {"loss": sums["nll"] / jnp.maximum(sums["tokens"], 1), "accuracy": ratio("token_correct", "tokens"),
                "seq_accuracy": ratio("correct", "queries"),
                "seq_accuracy_perturbed": ratio("correct_perturbed", "perturbed"),
                "seq_accuracy_clean": ratio("correct_clean", "clean"), "n_queries": sums["queries"]}
    return evaluate


# --- statistics --------------------------------------------------------------------------------------------

def plateau_accuracy(steps, values, offsets, escape) -> Optional[float]:
    """Median eval seq_accuracy of the delta >= 0 replicas over their evaluations before their escape
    (every evaluation if they never escape)."""
    pooled = []
    for r, (offset, esc) in enumerate(zip(offsets, escape)):
        if offset < 0:
            continue
        pooled += [values[i, r] for i, s in enumerate(steps) if esc is None or s < esc]
    pooled = [v for v in pooled if np.isfinite(v)]
    return float(np.median(pooled)) if pooled else None


# --- the run -----------------------------------------------------------------------------------------------

def training_plan(cfg: KVRunCfg, dictionary=None) -> TrainPlan:
    """The sweep's step (the run's and `python -m ssmgate.aot`'s); its largest batch: the top bucket's."""
    cfg.validate()
    if dictionary is None:
        dictionary = tuple(jnp.asarray(a) for a in kv.make_dictionary(cfg.kv))
    lo, hi = cfg.bounds[-1]
    return TrainPlan(cfg.spec.model, cfg.spec.optim, cfg.spec.replicas, kv_loss, cfg.spec.mesh, force_sweep=True,
                     batch=lambda: jax.eval_shape(lambda: kv.sample(step_key(0, 0), cfg.kv, dictionary, lo, hi)))


def run(cfg: KVRunCfg, run_dir) -> dict:
    cfg.validate()
    rd = RunDir.of(run_dir)
    mesh = make_mesh(cfg.spec.mesh)
    t0 = time.perf_counter()
    replicas = cfg.spec.replicas
    labels = [r.label for r in replicas]
    dictionary = tuple(jnp.asarray(a) for a in kv.make_dictionary(cfg.kv))
    plan = training_plan(cfg, dictionary)
    task, bounds, base_seed = cfg.kv, cfg.bounds, cfg.spec.grid.seed
    eval_data = fixed_set(cfg, dictionary, EVAL_SEED, task.n_max, cfg.spec.eval_n)
    evaluation = {}

    def eval_fn(built):
        # not built.eval_fn (a mean over per-batch metrics): this pools exact counts over chunks in one
        # compiled loop and takes the fixed set as an argument, not a constant.
        evaluate = evaluation["evaluate"] = make_evaluate(built.model, jnp.dtype(cfg.spec.model.dtype))
        sweep_eval = jax.jit(lambda params, data: sweep.replica_vmap(evaluate, (0, None))(params, data))
        return lambda s: sweep_eval(s.train.params, eval_data)

    trained = run_experiment(
        rd, **plan.engine(), loop_cfg=dataclasses.replace(cfg.spec.loop, name=f"p1_kv {task.query}"), mesh=mesh,
        fingerprint=cfg.fingerprint(), stop=cfg.spec.stop, resume_stopped=True, eval_fn=eval_fn,
        meta={"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "labels": labels},
        sample=lambda seed, k, b: kv.sample(step_key(seed, k), task, dictionary, b[0], b[1]),
        stage=lambda k: lb.bucket_for_step(bounds, base_seed, int(k), salt=kv.BUCKET_SALT))
    built, result, evaluate = trained.built, trained.result, evaluation["evaluate"]
    state = result.state
    escape = [None if v < 0 else int(v) for v in np.asarray(state.escape_step)]
    offsets = [r.offset for r in replicas]
    seeds = list(range(cfg.spec.grid.seed, cfg.spec.grid.seed + cfg.spec.grid.seeds))
    steps, values = eval_curves(rd.read_metrics(), len(replicas), [METRIC])
    values = values[METRIC]

    summary = {
        "program": "p1_kv", "query": task.query, "kv": dataclasses.asdict(task), "block": cfg.spec.model.block,
        "preset": cfg.spec.preset, "params": presets.param_count(cfg.spec.model), "lr": cfg.spec.optim.lr,
        "replicas": labels, "replica_offset": offsets, "replica_seed": [r.seed for r in replicas],
        "offsets": list(cfg.spec.grid.offsets), "seeds": seeds, "steps": result.step,
        "resumed_from": result.resumed_from,
        "escape_thr": cfg.spec.stop.escape_thr, "stop_thr": cfg.spec.stop.stop_thr,
        "escape_step": escape,
        "stopped_step": [None if v < 0 else int(v) for v in np.asarray(state.stopped_step)],
        "diverged": [bool(v) for v in np.asarray(state.diverged)],
        "escape_step_by_offset": {offset_key(o): [escape[i] for i, r in enumerate(replicas) if r.offset == o]
                                  for o in cfg.spec.grid.offsets},
        "plateau_accuracy": plateau_accuracy(steps, values, offsets, escape),
        "memoriser_accuracy": (1.0 - task.eps) ** task.m,
        "escape_fit": linear_fit([math.exp(offsets[i]) for i, e in enumerate(escape) if e is not None],
                                 [e for e in escape if e is not None]),
        "curves": [{"label": labels[r], "offset": offsets[r], "seed": replicas[r].seed, "step": steps,
                    "seq_accuracy": [float(v) for v in values[:, r]]} for r in range(len(replicas))],
        "final": {k.removeprefix("eval_"): v for k, v in result.last_eval.items()},
        "eval_examples": int(eval_data.inputs.shape[0] * eval_data.inputs.shape[1]),
    }
    for message in sweep.report_divergence(state, labels):
        say(f"[p1_kv] {message}")

    final_params = built.params(state)
    if cfg.lengen_ns:
        summary.update(length_generalisation(cfg, evaluate, dictionary, final_params, replicas))
    summary.update(gate_stats(built, cfg.spec.model, replicas, final_params))
    summary["wall_s"] = time.perf_counter() - t0
    if jax.process_index() == 0:
        rd.write_csv("kv_curve.csv", ("offset", "seed", "step", "seq_acc"),
                     [(offsets[r], replicas[r].seed, s, values[i, r])
                      for r in range(len(replicas)) for i, s in enumerate(steps)])
        if cfg.lengen_ns:
            rd.write_csv("kv_len.csv", ("offset", "seed", "n_pairs", "seq_acc"),
                         [(o, seeds[i], n, acc) for o, by_n in summary["lengen_accuracy"].items()
                          for n, cell in by_n.items() for i, acc in enumerate(cell["per_seed"])])
        rd.write_json("summary.json", summary)
    esc = ", ".join(f"{o}: {v}" for o, v in summary["escape_step_by_offset"].items())
    say(f"[p1_kv] escape steps by offset {{{esc}}}; plateau accuracy {summary['plateau_accuracy']}")
    return to_jsonable(summary)


def length_generalisation(cfg: KVRunCfg, evaluate, dictionary, params, replicas) -> dict:
    """Fig 2c: every replica at each n of lengen_ns on a fresh fixed set (seed LENGEN_SEED + n)."""
    examples = cfg.spec.lengen_examples
    return sweep_results.length_generalisation(
        cfg.lengen_ns, lambda n: fixed_set(cfg, dictionary, LENGEN_SEED + n, n, examples), evaluate, params,
        replicas, cfg.spec.grid.offsets, "seq_accuracy", "p1_kv")


def describe(cfg: KVRunCfg) -> str:
    """The --dry_run report: task, lengths, model size, optimizer, replicas, evaluation sets, mesh."""
    t, N = cfg.kv, cfg.kv.n_max
    mean_len = float(np.mean([kv.seq_len(t, n) for n in range(1, N + 1)]))
    lines = [f"task: {t}",
             f"  sequence length at n = N = {N}: {kv.seq_len(t, N)} tokens (mean over U{{1..{N}}}: {mean_len:.0f}); "
             f"{cfg.n_buckets} length buckets {cfg.bounds[:4]}{' ...' if cfg.n_buckets > 4 else ''}",
             f"  memoriser accuracy (1 - eps)^m = {(1 - t.eps) ** t.m:.4f}",
             f"model: {cfg.spec.model}", f"optimizer: {cfg.spec.optim}", f"loop: {cfg.spec.loop}",
             f"escape: first eval with {METRIC} > {cfg.spec.stop.escape_thr}; stop at >= {cfg.spec.stop.stop_thr}",
             cfg.spec.replicas_line()]
    chunks, chunk = eval_chunk(cfg, N, cfg.spec.eval_n)
    lines.append(f"eval: {chunks * chunk} examples at n = {N} ({chunks} chunk(s) of {chunk})")
    for n in cfg.lengen_ns:
        chunks, chunk = eval_chunk(cfg, n, cfg.spec.lengen_examples)
        lines.append(f"length generalisation n = {n}: {kv.seq_len(t, n)} tokens, {chunks * chunk} examples "
                     f"({chunks} chunk(s) of {chunk})")
    lines += ["", presets.count_table(cfg.spec.model, cfg.spec.preset or "")]
    mesh, note = meshlib.mesh_for_description(cfg.spec.mesh)
    lines.append(f"mesh {dict(mesh.shape)}{note}")
    return "\n".join(lines)
