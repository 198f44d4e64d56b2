"""Program `p1_horn`: P1's Horn-clause rule retrieval (Fig 3b-d, Table 1; protocol §4, §2.5, check C14 of §9).

One run trains a language model on the Horn-clause task of `ssmgate.tasks.horn` in one regime for
every gate offset delta (Mamba-2: A_log += delta at initialisation; a Transformer takes delta = 0
only) and every seed, at one peak learning rate, as ONE vmapped sweep. Training draws the pool size
k ~ U{k_min..k_max} per example through length buckets (`HornCfg.k_buckets`; the bucket of step k
comes from (--seed, k) as in `horn.batch_for_step`, so every replica shares the padded shape of
step k). The loss is the masked LM loss on the 4 name digits + <EOS> of every row (turn-1 and
turn-2 rows are separate examples, protocol §4.1).

Evaluation, every `eval_every` steps, on fixed sets drawn from their own seeds (never a training key),
pooled exactly over chunks (first-turn rows only; `horn_ranking.RULES` scores each kind):
  first_turn          k ~ U{k_min..k_max} of the training regime, rule class1 (protocol §4.5 accuracy);
  no_oracle           (retrieval regime) pool of exactly probe_k clauses, no class-1 clause, static
                      names, rule static_class1 (the memorisation probe, Fig 3b);
  random_oracle_name  (retrieval regime) probe_k clauses, the oracle renamed inside the fresh-name
                      region, rule answer (the retrieval probe, Fig 3c).
probe_k = min(PROBE_K = 32, k_max) unless given. `early` is the first evaluation at or after
early_frac x steps (the last one if there is none), `final` the last.
After training, the lengen regime evaluates every replica at each pool size of `lengen_ks` (PL pools,
reverse rank order, fresh names; first-turn accuracy, rule class1; fixed sets from own seeds): Fig 3d.
With `weak_betas` it also evaluates them with a weak retriever (P1 App. C, Fig 5 top; protocol §5.4): the
pools are the top k of a PL ranking at each finite beta (0 virtually random, 1 noisily ordered), no oracle
injected, so a pool may hold no class-1 clause and its row then counts as a failure (end-to-end success);
beside it the measured recall@k, the fraction of rows whose pool holds a class-1 clause.
Gate statistics (Mamba-2, protocol §2.5 / Table 1) per replica from the initial and final parameters:
median over all heads of tau = 1/(softplus(dt_bias) e^{A_log}) and the median |delta alpha|
(sweep_results.gate_stats), and the token-averaged variant with dt_t averaged over the valid tokens of
`gate_prompts` fixed first-turn prompts instead of softplus(dt_bias).
Optional escape / early stop (--escape_thr / --stop_thr; default off) on the first_turn accuracy.

summary.json:
  "program", "regime", "horn" (the task config; k_max resolved, beta "inf" when infinite), "block", "preset",
  "params", "lr",
  "replicas" (labels), "replica_offset", "replica_seed", "offsets", "seeds", "steps", "resumed_from",
  "escape_thr", "stop_thr", "escape_step" / "stopped_step" [per replica; null = never], "diverged",
  "probe_k" (null in the lengen regime), "eval_sets" {set: {"k": [lo, hi], "kind", "examples", "seed"}},
  "curves": [{"label", "offset", "seed", "step": [...], "first_turn": [...], "no_oracle": [...],
      "random_oracle_name": [...]}] per replica (accuracies; the probes in the retrieval regime only),
  "early_step", "final_step", "early" / "final" {set: {offset: mean over seeds}} and
      "early_per_seed" / "final_per_seed" {set: {offset: [per seed]}},
  "final_eval" {eval metric: [per replica]} (the last evaluation: "accuracy", "loss" of first_turn and
      "<probe>_accuracy", "<probe>_loss"),
  "lengen_ks", "lengen_accuracy" {offset: {k: {mean, ci95_lo, ci95_hi, per_seed}}} (lengen regime;
      a t-interval over seeds, lo = hi = mean with one seed), "lengen_examples" {k: examples},
      "lengen_detail" {k: [{accuracy, loss} per replica]},
  "weak_betas", "weak_accuracy" {beta: {offset: {k: {mean, ci95_lo, ci95_hi, per_seed}}}} and "weak_recall"
      {beta: {k: fraction of rows with a class-1 clause in the pool}} (lengen regime with weak_betas),
  Mamba-2 only: "median_tau" {offset: {"init": [per seed], "final": [per seed]}}, "median_alpha_change"
      {offset: [per seed]}, the same token-averaged as "median_tau_token", "median_alpha_change_token",
      and "table1" / "table1_token" {offset: {median_tau_before, median_tau_after, median_abs_dalpha}}
      (medians over seeds),
  "graph" {max_out_degree, eligible_paths}, "eval_examples", "wall_s".
CSV files (protocol §0.1): horn_curve.csv (init, seed, step, acc_no_oracle, acc_rand_name, acc_first_turn;
probe cells empty in the lengen regime), horn_len.csv (init, k, acc, ci95_lo, ci95_hi, n_seeds; acc is
the mean over seeds; lengen regime), gate_drift.csv (init, seed, median_tau_before, median_tau_after,
median_abs_dalpha and the three token-averaged columns; Mamba-2). init is the offset key ('-6', '3').
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
from ssmgate.models import gates, presets
from ssmgate.models.config import ModelCfg
from ssmgate.tasks import horn
from ssmgate.tasks import horn_ranking as hr
from ssmgate.tasks import length_buckets as lb
from ssmgate.tasks.synthetic_lm import lm_loss, step_key
from ssmgate.train import lm_runs
from ssmgate.train import mesh as meshlib, sweep
from ssmgate.train import sweep_results
from ssmgate.train.compile_step import TrainPlan
from ssmgate.train.experiment import make_mesh, run_experiment
from ssmgate.train.run_dir import RunDir, say, to_jsonable
from ssmgate.train.run_spec import RunSpec
from ssmgate.train.step import cast_floating
from ssmgate.train.sweep_results import eval_curves, gate_stats, offset_key

# Fixed evaluation sets: own seeds, never a training key (training keys are step_key(seed, k)).
SET_SEEDS = {"first_turn": 7_000_003, "no_oracle": 7_100_003, "random_oracle_name": 7_200_003}
LENGEN_SEED = 7_300_000   # + k
WEAK_SEED = 7_500_000     # + 1000 x beta index + k
GATE_SEED = 7_400_009     # the token-averaged gate statistics' prompts
GATE_CHUNK = 8            # prompts per forward pass of the token-averaged gate statistics
PROBES = ("no_oracle", "random_oracle_name")
KIND = {"no_oracle": "no_oracle", "random_oracle_name": "rand_name"}  # probe -> horn.sample_eval kind
METRIC = "accuracy"       # the escape / early-stop metric: first-turn accuracy on the training distribution


def metric_name(eval_set: str, what: str) -> str:
    """Eval metric keys: 'accuracy' / 'loss' for first_turn, '<probe>_accuracy' for the probes."""
    return what if eval_set == "first_turn" else f"{eval_set}_{what}"


@dataclasses.dataclass(frozen=True)
class HornRunCfg:
    horn: horn.HornCfg               # the task; horn.batch is the training batch, horn.n_buckets its buckets
    spec: RunSpec                    # model, optimizer, loop, mesh, replicas, stop rule, evaluation sizes
    probe_n: Optional[int] = None         # None: spec.eval_n
    probe_k: Optional[int] = None         # None: min(PROBE_K, k_max)
    lengen_ks: tuple[int, ...] = ()
    weak_betas: tuple[float, ...] = ()    # finite PL betas of the weak-retriever evaluation (lengen regime)
    early_frac: float = 0.1
    gate_prompts: int = 64

    @property
    def bounds(self) -> tuple:
        return self.horn.k_buckets()

    @property
    def probe_pool(self) -> Optional[int]:
        """The probes' pool size (retrieval regime), None in the lengen regime."""
        if self.horn.regime != "retrieval":
            return None
        return min(horn.PROBE_K, self.horn.k_upper) if self.probe_k is None else self.probe_k

    @property
    def eval_sets(self) -> dict:
        """{set: (kind, k_lo, k_hi, examples)} of the evaluations during training."""
        t = self.horn
        sets = {"first_turn": ("train", t.k_min, t.k_upper, self.spec.eval_n)}
        if t.regime == "retrieval":
            k = self.probe_pool
            sets.update({p: (KIND[p], k, k, self.probe_n or self.spec.eval_n) for p in PROBES})
        return sets

    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed (not the mesh, the cadence or the lengen sets)."""
        return self.spec.fingerprint({"horn": dataclasses.asdict(self.horn), "eval_sets": self.eval_sets})

    def validate(self) -> "HornRunCfg":
        try:
            self.horn.validate()
            graph = horn.build_graph(self.horn)
        except ValueError as e:
            raise ConfigError(horn_flag_message(str(e))) from None
        model = self.spec.validate().model
        if model.vocab_size < horn.VOCAB_SIZE:
            raise ConfigError(f"--vocab_size={model.vocab_size}: expected >= {horn.VOCAB_SIZE} "
                              "(the Horn task's character tokens, protocol §4.2)")
        if self.gate_prompts < 1:
            raise ConfigError(f"--horn_gate_prompts={self.gate_prompts}: expected >= 1")
        if self.probe_n is not None and self.probe_n < 1:
            raise ConfigError(f"--horn_probe_n={self.probe_n}: expected >= 1")
        if not 0.0 < self.early_frac <= 1.0:
            raise ConfigError(f"--horn_early_frac={self.early_frac}: expected a fraction of training in (0, 1]")
        regime = self.horn.regime
        if regime == "retrieval":
            if self.lengen_ks:
                raise ConfigError(f"--horn_lengen_ks={','.join(map(str, self.lengen_ks))}: length generalisation "
                                  "is evaluated for --horn_regime=lengen only (protocol §4.5, Fig 3d); expected it empty")
            limit = graph.K - graph.max_out_degree
            if not 1 <= self.probe_pool <= limit:
                raise ConfigError(f"--horn_probe_k={self.probe_pool}: expected 1..{limit} (the no-oracle probe draws "
                                  f"its pool from the non-class-1 clauses: K = {graph.K} minus the graph's max "
                                  f"out-degree {graph.max_out_degree})")
        else:
            for name, value in (("horn_probe_k", self.probe_k), ("horn_probe_n", self.probe_n)):
                if value is not None:
                    raise ConfigError(f"--{name}={value}: the no-oracle / random-oracle-name probes belong to "
                                      "--horn_regime=retrieval (protocol §4.5, Fig 3b/c); expected it unset")
        for k in self.lengen_ks:
            if not 1 <= k <= self.horn.K:
                raise ConfigError(f"--horn_lengen_ks: {k}: expected pool sizes in 1..--horn_K={self.horn.K} "
                                  "(a pool holds clauses of one layer)")
        if len(set(self.lengen_ks)) != len(self.lengen_ks):
            raise ConfigError(f"--horn_lengen_ks={','.join(map(str, self.lengen_ks))}: expected distinct pool sizes")
        if self.weak_betas:
            text = ",".join(f"{b:g}" for b in self.weak_betas)
            if regime != "lengen":
                raise ConfigError(f"--horn_weak_betas={text}: the weak retriever evaluates the length-generalisation "
                                  "models (--horn_regime=lengen, P1 App. C); expected it empty")
            if not all(math.isfinite(b) and b >= 0 for b in self.weak_betas) or len(set(self.weak_betas)) != len(
                    self.weak_betas):
                raise ConfigError(f"--horn_weak_betas={text}: expected distinct finite PL betas >= 0 (0: random "
                                  "pools, 1: noisily ordered)")
        return self


TASK_FLAGS = {"n_buckets": "horn_buckets", "batch": "batch"}   # HornCfg's fields whose flag is not --horn_<field>


def horn_flag_message(message: str) -> str:
    """'k_max=64: expected ...' -> '--horn_k_max=64: expected ...' (HornCfg's field as its flag)."""
    return dataclass_flags.flag_message(message, horn.HornCfg, "horn_", TASK_FLAGS, unmatched="keep")


def task_dict(task: horn.HornCfg) -> dict:
    """HornCfg as JSON-able fields: an infinite beta as the string 'inf' (JSON has no inf), k_max resolved."""
    d = dataclasses.asdict(task)
    d["beta"] = "inf" if math.isinf(task.beta) else task.beta
    d["k_max"] = task.k_upper
    return d


# --- data --------------------------------------------------------------------------------------------------

def eval_chunk(cfg: HornRunCfg, k_hi: int, examples: int) -> tuple[int, int]:
    """(chunks, examples per chunk) of a set padded to k_hi clauses: a chunk holds at most the tokens of
    one training batch at k = k_max, balanced; chunks x chunk >= examples."""
    budget = cfg.horn.batch * horn.seq_len(cfg.horn.k_upper)
    largest = max(1, min(examples, budget // horn.seq_len(k_hi)))
    chunks = -(-examples // largest)
    return chunks, -(-examples // chunks)


def fixed_set(cfg: HornRunCfg, graph, seed: int, kind: str, k_lo: int, k_hi: int, examples: int) -> horn.HornBatch:
    """A fixed first-turn set from its own seed: a HornBatch with a leading chunk axis (chunks, chunk, ...).
    kind "train" draws the training distribution (the regime's pools, k ~ U{k_lo..k_hi}); the other kinds
    are the exact-k sets of `horn.sample_eval` (k_lo = k_hi)."""
    chunks, chunk = eval_chunk(cfg, k_hi, examples)
    keys = jax.random.split(jax.random.PRNGKey(seed), chunks)
    if kind == "train":
        task = dataclasses.replace(cfg.horn, turns="first", batch=chunk)
        parts = [horn.sample_jit(k, task, graph, k_lo, k_hi) for k in keys]
    else:
        parts = [horn.sample_eval_jit(k, cfg.horn, graph, kind, k_hi, chunk) for k in keys]
    return jax.tree.map(lambda *a: jnp.stack(a), *parts)


def horn_loss(graph, rule: str):
    """The training loss: masked cross-entropy on the name digits + <EOS> (lm_loss) and, as metrics,
    token accuracy, exact-target accuracy and the name accuracy of the batch by `rule`."""
    def loss(logits, batch: horn.HornBatch):
        value, metrics = lm_loss(logits, batch)
        return value, dict(metrics, name_accuracy=horn.accuracy(logits, batch, graph, rule))
    return loss


def make_evaluate(model, compute_dtype, graph):
    """evaluate(params, data, rule) -> pooled metrics over every chunk of a fixed set (exact counts, one
    compiled loop over chunks): loss (masked NLL per scored token), accuracy (rows whose emitted name
    is correct by `rule`, static), n (rows)."""
    def chunk_sums(params, b, rule):
        logits, _ = model.apply({"params": params}, b.inputs)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, b.targets[..., None], axis=-1)[..., 0]
        ok = hr.correct(horn.emitted_names(logits, b), b, graph, rule)
        return {"nll": (nll * b.mask).sum(), "tokens": b.mask.sum(), "correct": ok.sum().astype(jnp.int32),
                "rows": jnp.asarray(ok.shape[0], jnp.int32)}

    def evaluate(params, data, rule):
        params = cast_floating(params, compute_dtype)
        sums = jax.tree.map(lambda a: a.sum(0), jax.lax.map(lambda b: chunk_sums(params, b, rule), data))
        return {"loss": sums["nll"] / jnp.maximum(sums["tokens"], 1.0),
                "accuracy": sums["correct"] / jnp.maximum(sums["rows"], 1), "n": sums["rows"]}
    return evaluate


# --- statistics --------------------------------------------------------------------------------------------

def early_index(steps, total_steps: int, frac: float) -> Optional[int]:
    """Index of the first evaluation at or after frac x total_steps; the last one if none is; None without any."""
    if not steps:
        return None
    for i, s in enumerate(steps):
        if s >= frac * total_steps:
            return i
    return len(steps) - 1


def by_offset(values, replicas, offsets) -> tuple[dict, dict]:
    """({offset key: mean over seeds}, {offset key: [per seed]}) of per-replica values (NaN skipped in the mean)."""
    per = {offset_key(o): [float(values[r]) for r, rep in enumerate(replicas) if rep.offset == o] for o in offsets}
    mean = {o: (float(np.nanmean(v)) if np.isfinite(v).any() else None) for o, v in per.items()}
    return mean, per


def _median_over_seeds(tau: dict, change: dict) -> dict:
    return {o: {"median_tau_before": float(np.median(tau[o]["init"])),
                "median_tau_after": float(np.median(tau[o]["final"])),
                "median_abs_dalpha": float(np.median(change[o]))} for o in tau}


def sum_dt_fn(model, model_cfg: ModelCfg):
    """params, inputs -> ((n_layers * heads,) sum of dt_t = softplus(dt_raw_t + dt_bias) over the valid (non-PAD)
    tokens, their count), heads in gates.gate_paths order; dt_raw_t is the last `heads` columns of each mixer's
    in_proj output (captured, so the model needs no change)."""
    h = model_cfg.n_ssm_heads

    def sum_dt(params, inputs):
        _, state = model.apply({"params": params}, inputs, mutable=["intermediates"],
                               capture_intermediates=lambda m, name: m.name == "in_proj" and name == "__call__")
        inter = state["intermediates"]
        valid = (inputs != horn.PAD).astype(jnp.float32)[..., None]
        out = []
        for i in range(model_cfg.n_layers):
            (proj,) = inter[f"layers_{i}"]["mixer"]["in_proj"]["__call__"]
            dt_bias = params[f"layers_{i}"]["mixer"][gates.DT_BIAS_NAME]
            dt = jax.nn.softplus(proj[..., -h:].astype(jnp.float32) + dt_bias)
            out.append((dt * valid).sum((0, 1)))
        return jnp.concatenate(out), valid.sum()
    return sum_dt


def token_gate_stats(run_built, model_cfg: ModelCfg, replicas, final_params, prompts) -> dict:
    """protocol §2.5's token-averaged variant: per head rate = mean_t(dt_t) e^{A_log} over the prompts' valid
    tokens, tau = 1 / rate, alpha = exp(-rate); the median tau over heads at init and after training and
    the median |delta alpha|, per offset and seed (Mamba-2 only)."""
    if model_cfg.block != "mamba2":
        return {}
    init = jax.jit(lm_runs.init_params_fn(run_built.model, model_cfg))
    sum_dt = jax.jit(sum_dt_fn(run_built.model, model_cfg))
    chunk = GATE_CHUNK if prompts.shape[0] % GATE_CHUNK == 0 else prompts.shape[0]  # in_proj outputs are wide

    def rates(params):
        a_log = np.concatenate([a for _, a, _ in gates.head_gates(params)])
        parts = [jax.device_get(sum_dt(params, prompts[i:i + chunk])) for i in range(0, prompts.shape[0], chunk)]
        total = np.sum([np.asarray(p[0], np.float64) for p in parts], axis=0)
        return total / max(sum(float(p[1]) for p in parts), 1.0) * np.exp(a_log)

    tau, change = {}, {}
    for r, rep in enumerate(replicas):
        key_init, _ = jax.random.split(jax.random.PRNGKey(rep.seed))  # as sweep.init_sweep
        before = rates(jax.device_get(init(key_init, jnp.float32(rep.offset))))
        after = rates(jax.device_get(jax.tree.map(lambda a: a[r], final_params)))
        entry = tau.setdefault(offset_key(rep.offset), {"init": [], "final": []})
        entry["init"].append(float(np.median(1.0 / before)))
        entry["final"].append(float(np.median(1.0 / after)))
        change.setdefault(offset_key(rep.offset), []).append(float(np.median(np.abs(np.exp(-after) - np.exp(-before)))))
    return {"median_tau_token": tau, "median_alpha_change_token": change}


# --- the run -----------------------------------------------------------------------------------------------

def training_plan(cfg: HornRunCfg) -> TrainPlan:
    """The sweep's step (the run's and `python -m ssmgate.aot`'s); its largest batch: the top bucket's."""
    cfg.validate()
    task = cfg.horn
    graph = horn.build_graph(task)
    lo, hi = cfg.bounds[-1]
    spec = cfg.spec
    return TrainPlan(spec.model, spec.optim, spec.replicas, horn_loss(graph, hr.RULES[task.regime]), spec.mesh,
                     force_sweep=True,
                     batch=lambda: jax.eval_shape(lambda: horn.sample(step_key(0, 0), task, graph, lo, hi)))


def run(cfg: HornRunCfg, run_dir) -> dict:
    cfg.validate()
    rd = RunDir.of(run_dir)
    mesh = make_mesh(cfg.spec.mesh)
    t0 = time.perf_counter()
    replicas, grid_offsets = cfg.spec.replicas, cfg.spec.grid.offsets
    labels = [r.label for r in replicas]
    task, bounds, base_seed = cfg.horn, cfg.bounds, cfg.spec.grid.seed
    graph = horn.build_graph(task)
    sets = {name: fixed_set(cfg, graph, SET_SEEDS[name], kind, lo, hi, n)
            for name, (kind, lo, hi, n) in cfg.eval_sets.items()}
    set_rules = {name: ("class1" if name == "first_turn" else hr.RULES[KIND[name]]) for name in sets}
    evaluation = {}

    def eval_fn(built):
        # not built.eval_fn (a mean over per-batch metrics): this pools exact counts over chunks in one
        # compiled loop and takes the fixed sets as arguments, not constants.
        evaluate = evaluation["evaluate"] = make_evaluate(built.model, jnp.dtype(cfg.spec.model.dtype), graph)

        def sweep_eval(params, data):
            out = {}
            for name, d in data.items():
                m = sweep.replica_vmap(lambda p, dd, rl=set_rules[name]: evaluate(p, dd, rl), (0, None))(params, d)
                out[metric_name(name, "accuracy")] = m["accuracy"]
                out[metric_name(name, "loss")] = m["loss"]
            return out

        sweep_eval = jax.jit(sweep_eval)
        return lambda s: sweep_eval(s.train.params, sets)

    trained = run_experiment(
        rd, **training_plan(cfg).engine(), loop_cfg=dataclasses.replace(cfg.spec.loop, name=f"p1_horn {task.regime}"),
        mesh=mesh, fingerprint=cfg.fingerprint(), stop=cfg.spec.stop, resume_stopped=cfg.spec.stop.stop_thr is not None,
        eval_fn=eval_fn, meta={"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "labels": labels},
        sample=lambda seed, k, b: horn.sample(step_key(seed, k), task, graph, b[0], b[1]),
        stage=lambda k: lb.bucket_for_step(bounds, base_seed, int(k)))  # as horn.batch_for_step
    built, result, evaluate = trained.built, trained.result, evaluation["evaluate"]
    state = result.state
    offsets = [r.offset for r in replicas]
    seeds = list(range(cfg.spec.grid.seed, cfg.spec.grid.seed + cfg.spec.grid.seeds))
    names = list(sets)
    steps, values = eval_curves(rd.read_metrics(), len(replicas), [metric_name(n, "accuracy") for n in names])
    curve = {n: values[metric_name(n, "accuracy")] for n in names}
    i_early = early_index(steps, cfg.spec.loop.steps, cfg.early_frac)

    summary = {
        "program": "p1_horn", "regime": task.regime, "horn": task_dict(task), "block": cfg.spec.model.block,
        "preset": cfg.spec.preset, "params": presets.param_count(cfg.spec.model), "lr": cfg.spec.optim.lr,
        "replicas": labels, "replica_offset": offsets, "replica_seed": [r.seed for r in replicas],
        "offsets": list(grid_offsets), "seeds": seeds, "steps": result.step, "resumed_from": result.resumed_from,
        "escape_thr": cfg.spec.stop.escape_thr, "stop_thr": cfg.spec.stop.stop_thr,
        "escape_step": [None if v < 0 else int(v) for v in np.asarray(state.escape_step)],
        "stopped_step": [None if v < 0 else int(v) for v in np.asarray(state.stopped_step)],
        "diverged": [bool(v) for v in np.asarray(state.diverged)],
        "probe_k": cfg.probe_pool,
        "eval_sets": {n: {"kind": kind, "k": [lo, hi], "seed": SET_SEEDS[n],
                          "examples": int(sets[n].inputs.shape[0] * sets[n].inputs.shape[1])}
                      for n, (kind, lo, hi, _) in cfg.eval_sets.items()},
        "curves": [{"label": labels[r], "offset": offsets[r], "seed": replicas[r].seed, "step": steps,
                    **{n: [float(v) for v in curve[n][:, r]] for n in names}} for r in range(len(replicas))],
        "early_step": None if i_early is None else steps[i_early], "final_step": steps[-1] if steps else None,
        "early": {}, "final": {}, "early_per_seed": {}, "final_per_seed": {},
        "final_eval": {k.removeprefix("eval_"): v for k, v in result.last_eval.items()},
        "graph": {"max_out_degree": graph.max_out_degree, "eligible_paths": int(graph.eligible1.size)},
        "eval_examples": int(sets["first_turn"].inputs.shape[0] * sets["first_turn"].inputs.shape[1]),
        "lengen_ks": list(cfg.lengen_ks),
    }
    if steps:
        for when, i in (("early", i_early), ("final", len(steps) - 1)):
            for n in names:
                summary[when][n], summary[f"{when}_per_seed"][n] = by_offset(curve[n][i], replicas, grid_offsets)
    for message in sweep.report_divergence(state, labels):
        say(f"[p1_horn] {message}")

    final_params = built.params(state)
    if cfg.lengen_ks:
        summary.update(length_generalisation(cfg, graph, evaluate, final_params, replicas))
    if cfg.weak_betas:
        summary.update(weak_retrieval(cfg, graph, evaluate, final_params, replicas))
    summary.update(gate_stats(built, cfg.spec.model, replicas, final_params))
    if cfg.spec.model.block == "mamba2":
        task_p = dataclasses.replace(task, turns="first", batch=cfg.gate_prompts)
        prompts = horn.sample_jit(jax.random.PRNGKey(GATE_SEED), task_p, graph, task.k_min, task.k_upper).inputs
        summary.update(token_gate_stats(built, cfg.spec.model, replicas, final_params, prompts))
        summary["table1"] = _median_over_seeds(summary["median_tau"], summary["median_alpha_change"])
        summary["table1_token"] = _median_over_seeds(summary["median_tau_token"], summary["median_alpha_change_token"])
    summary["wall_s"] = time.perf_counter() - t0
    if jax.process_index() == 0:
        _write_csvs(rd, summary, replicas, steps, curve)
        rd.write_json("summary.json", summary)
    if steps:
        say("[p1_horn] final " + "; ".join(f"{n}: " + ", ".join(f"{o} {v:.3f}" for o, v in summary["final"][n].items()
                                                                  if v is not None) for n in names))
    return to_jsonable(summary)


def _write_csvs(rd: RunDir, summary: dict, replicas, steps, curve) -> None:
    probes = summary["regime"] == "retrieval"
    rows = []
    for r, rep in enumerate(replicas):
        for i, s in enumerate(steps):
            rows.append((offset_key(rep.offset), rep.seed, s, curve["no_oracle"][i, r] if probes else None,
                         curve["random_oracle_name"][i, r] if probes else None, curve["first_turn"][i, r]))
    rd.write_csv("horn_curve.csv", ("init", "seed", "step", "acc_no_oracle", "acc_rand_name", "acc_first_turn"), rows)
    if summary.get("lengen_accuracy"):
        rd.write_csv("horn_len.csv", ("init", "k", "acc", "ci95_lo", "ci95_hi", "n_seeds"),
                     [(o, k, c["mean"], c["ci95_lo"], c["ci95_hi"], len(c["per_seed"]))
                      for o, by_k in summary["lengen_accuracy"].items() for k, c in by_k.items()])
    if "median_tau" in summary:
        tau, ch, tau_t, ch_t = (summary[k] for k in ("median_tau", "median_alpha_change", "median_tau_token",
                                                     "median_alpha_change_token"))
        seeds = summary["seeds"]
        rd.write_csv("gate_drift.csv", ("init", "seed", "median_tau_before", "median_tau_after", "median_abs_dalpha",
                                        "median_tau_before_token", "median_tau_after_token",
                                        "median_abs_dalpha_token"),
                     [(o, seeds[i], tau[o]["init"][i], tau[o]["final"][i], ch[o][i], tau_t[o]["init"][i],
                       tau_t[o]["final"][i], ch_t[o][i]) for o in tau for i in range(len(tau[o]["init"]))])


def length_generalisation(cfg: HornRunCfg, graph, evaluate, params, replicas) -> dict:
    """Fig 3d / Table 1: every replica at each pool size of lengen_ks on a fresh fixed set (seed
    LENGEN_SEED + k; PL pools, first turn, rule class1)."""
    examples = cfg.spec.lengen_examples
    return sweep_results.length_generalisation(
        cfg.lengen_ks, lambda k: fixed_set(cfg, graph, LENGEN_SEED + k, "lengen", k, k, examples),
        lambda p, d: evaluate(p, d, "class1"), params, replicas, cfg.spec.grid.offsets, "accuracy", "p1_horn",
        keep=("accuracy", "loss"))


def weak_retrieval(cfg: HornRunCfg, graph, evaluate, params, replicas) -> dict:
    """P1 Fig 5 (top): every replica at each pool size of lengen_ks with pools from a weak retriever (PL at each
    beta of weak_betas, no oracle injected); end-to-end first-turn accuracy and the sets' recall@k."""
    examples = cfg.spec.lengen_examples
    accuracy, recall = {}, {}
    for i, beta in enumerate(cfg.weak_betas):
        weak = dataclasses.replace(cfg, horn=dataclasses.replace(cfg.horn, beta=beta))
        sets = {k: fixed_set(weak, graph, WEAK_SEED + 1000 * i + k, "lengen", k, k, examples) for k in cfg.lengen_ks}
        key = f"{beta:g}"
        recall[key] = {str(k): float(jnp.mean(data.oracle_pos >= 0)) for k, data in sets.items()}
        say(f"[p1_horn] weak retriever beta {key}: recall@k " + ", ".join(f"{k} {r:.3f}" for k, r in recall[key].items()))
        accuracy[key] = sweep_results.length_generalisation(
            cfg.lengen_ks, sets.__getitem__, lambda p, d: evaluate(p, d, "class1"), params, replicas,
            cfg.spec.grid.offsets,
            "accuracy", f"p1_horn weak beta {key}", keep=("accuracy",))["lengen_accuracy"]
    return {"weak_betas": [f"{b:g}" for b in cfg.weak_betas], "weak_accuracy": accuracy, "weak_recall": recall}


def describe(cfg: HornRunCfg) -> str:
    """The --dry_run report: task, graph, lengths, model size, optimizer, replicas, evaluation sets, mesh."""
    spec, stop = cfg.spec, cfg.spec.stop
    t = cfg.horn
    graph = horn.build_graph(t)
    mean_len = float(np.mean([horn.seq_len(k) for k in range(t.k_min, t.k_upper + 1)]))
    lines = [f"task: {t}",
             f"  graph: {t.props_per_set} props x 3 sets, K = {t.K} clauses per layer, max out-degree "
             f"{graph.max_out_degree}, {graph.eligible1.size} layer-1 clauses start a 2-step path",
             f"  sequence length at k = k_max = {t.k_upper}: {horn.seq_len(t.k_upper)} tokens (mean over "
             f"U{{{t.k_min}..{t.k_upper}}}: {mean_len:.0f}); {len(cfg.bounds)} length buckets {cfg.bounds[:4]}"
             f"{' ...' if len(cfg.bounds) > 4 else ''}",
             f"model: {spec.model}", f"optimizer: {spec.optim}", f"loop: {spec.loop}", spec.replicas_line(),
             f"escape: {'off' if stop.escape_thr is None else f'first eval with {METRIC} > {stop.escape_thr}'}; "
             f"early stop: {'off' if stop.stop_thr is None else f'{METRIC} >= {stop.stop_thr}'}; "
             f"'early' = first eval at or after step {cfg.early_frac * spec.loop.steps:g}"]
    for name, (kind, lo, hi, n) in cfg.eval_sets.items():
        chunks, chunk = eval_chunk(cfg, hi, n)
        ks = f"k = {hi}" if lo == hi else f"k ~ U{{{lo}..{hi}}}"
        pools = t.regime if kind == "train" else kind
        lines.append(f"eval {name} ({pools} pools, {ks}): {chunks * chunk} examples ({chunks} chunk(s) of {chunk})")
    for k in cfg.lengen_ks:
        chunks, chunk = eval_chunk(cfg, k, cfg.spec.lengen_examples)
        lines.append(f"length generalisation k = {k}: {horn.seq_len(k)} tokens, {chunks * chunk} examples "
                     f"({chunks} chunk(s) of {chunk})")
    if cfg.weak_betas:
        lines.append(f"weak retriever (Fig 5 top): PL pools at beta {', '.join(f'{b:g}' for b in cfg.weak_betas)}, "
                     "no oracle injected, at the same pool sizes")
    lines += ["", presets.count_table(cfg.spec.model, cfg.spec.preset or "")]
    mesh, note = meshlib.mesh_for_description(cfg.spec.mesh)
    lines.append(f"mesh {dict(mesh.shape)}{note}")
    return "\n".join(lines)
