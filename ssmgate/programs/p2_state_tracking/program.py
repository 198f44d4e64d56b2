"""Program `p2_state_tracking`: P2's Table 2 for one task (protocol §6) — every transition, an LR sweep each.

For each model of Table 2 (Mamba-2; Mamba-3 without rotation, with static rotation; the
overdamped and critical companion-form cores; the underdamped row = native Mamba-3, and the
underdamped companion-form core as a like-for-like check, protocol §1.5) it trains the learning-rate
grid as one vmapped sweep on the length curriculum of §6.2, picks the learning rate with the best
validation accuracy (fixed sequences of the test length, their own seed), and measures answer
accuracy and scaled accuracy on a separate test set at each test length (224 and 256; odd lengths
for arithmetic: 223 and 255). For parity and mod 3 it reads the phase code of the trained
native Mamba-3 (protocol §6.3, Fig 5): the per-symbol phase increments dt * theta of every
(head, pair) of layer 0, and the pair that best separates the symbols (input 0 -> 0 degrees,
input 1 -> 360/m degrees).

Each model trains in its own run directory (<run_dir>/<model>/, resumable); summary.json:
{"task", "models", "lrs", "test_lens", "accuracy"[model][len], "scaled_accuracy"[model][len],
"chosen_lr"[model], "val_accuracy"[model] (per lr), "stopped_step"[model] (per replica, -1: ran to
the end; with --stop_thr a replica whose validation accuracy reaches it is frozen), "phase_code" {"deg": [input 0, input 1],
"head", "pair", "pairs_deg"} (parity and mod 3), "wall_s", "wall_s_per_model"[model], "steps", "resumed_from"
(None, or the earliest step a model's training continued from a checkpoint)}.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

import jax
import numpy as np

from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.models.lm import logits as lm_logits, sown_intermediates
from ssmgate.tasks import state_tracking as st
from ssmgate.tasks.synthetic_lm import lm_loss, step_key
from ssmgate.train import mesh as meshlib, sweep
from ssmgate.train.experiment import make_mesh, run_experiment
from ssmgate.train.run_dir import RunDir, say
from ssmgate.train.run_spec import RunSpec, model_key

# Table 2 rows -> the state-tracking presets' cores (ssmgate.models.presets.ST_CORES).
MODELS = {
    "mamba2": "mamba2",
    "m3_norot": "m3_norot",
    "m3_static": "m3_static",
    "overdamped": "damped_over",
    "critical": "damped_crit",
    "underdamped": "m3_native",
    "underdamped_companion": "damped_under",
}
TABLE_MODELS = ("mamba2", "m3_norot", "m3_static", "overdamped", "critical", "underdamped")
LAYERS = {"parity": 1, "mod3": 1, "arith": 3}  # protocol §6.2
VAL_SEED, TEST_SEED = 7_000_001, 9_000_001   # evaluation sets: their own seeds, never a training key
EVAL_CHUNK = 512                             # sequences per evaluation batch


@dataclasses.dataclass(frozen=True)
class StateTrackingCfg:
    data: st.StateTrackDataCfg
    spec: RunSpec                    # its model: the shared width/depth (each row swaps block/transition);
                                     # its grid: learning rates x seeds; its stop rule: --stop_thr on accuracy
    models: tuple[str, ...] = TABLE_MODELS + ("underdamped_companion",)
    val_n: int = 2048
    test_n: int = 8192
    test_lens: tuple[int, ...] = (224, 256)
    len_quantum: int = 32            # training batches padded to a multiple of this >= L_max(step) (0: max_len)
    len_buckets: bool = False        # pad each batch to its length bucket's top instead (st.length_bucket)

    @property
    def task(self) -> str:
        return self.data.task

    @property
    def lrs(self) -> tuple:
        return self.spec.lrs

    @property
    def stop_thr(self) -> Optional[float]:
        """Early stopping: a replica is frozen once its validation accuracy reaches it."""
        return self.spec.stop.stop_thr

    def model_for(self, name: str) -> ModelCfg:
        core = presets.ST_CORES[MODELS[name]]
        return dataclasses.replace(self.spec.model, **core).validate()

    def fingerprint(self, name: str) -> str:
        """Keyed as the program's first checkpoints were: the row's model, the optimizer, the grid and the data."""
        g = self.spec.grid
        return self.spec.fingerprint({"data": dataclasses.asdict(self.data),
                                      "model": model_key(self.model_for(name)), "lrs": list(self.lrs),
                                      "seeds": g.seeds, "seed": g.seed, "val_n": self.val_n,
                                      "len_quantum": self.len_quantum, "len_buckets": self.len_buckets,
                                      "stop_thr": self.stop_thr}, parts=("optim",))

    def validate(self) -> "StateTrackingCfg":
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models:
            raise ConfigError(f"--st_models={','.join(self.models)}: expected some of {', '.join(MODELS)}")
        model = self.spec.validate().model
        if self.spec.stop.escape_thr is not None:  # the rule below stops replicas; no escape is recorded
            raise ConfigError(f"--escape_thr={self.spec.stop.escape_thr}: state tracking has no escape step (protocol "
                              "§6.2 stops a replica at --stop_thr); expected it unset")
        if model.vocab_size < st.VOCAB[self.task]:
            raise ConfigError(f"--vocab_size={model.vocab_size}: expected >= {st.VOCAB[self.task]} for {self.task}")
        for name, value in (("val_n", self.val_n), ("test_n", self.test_n)):
            if value < 1:
                raise ConfigError(f"--st_{name}={value}: expected >= 1")
        if self.len_quantum < 0:
            raise ConfigError(f"--st_len_quantum={self.len_quantum}: expected >= 0 (0 = pad every batch to --st_l_max1)")
        if self.len_buckets and self.len_quantum < 1:
            raise ConfigError(f"--st_len_buckets with --st_len_quantum={self.len_quantum}: expected --st_len_quantum >= 1 "
                              "(the bucket width)")
        for length in self.test_lens:
            if length < 3:
                raise ConfigError(f"--st_test_lens: {length}: expected lengths >= 3")
        return self


def eval_lengths(task: str, lengths) -> list[int]:
    """The test lengths a task can have (arithmetic is odd: 224 -> 223)."""
    return [st.valid_length(task, length) for length in lengths]


def fixed_set(task_cfg: st.StateTrackDataCfg, seed: int, length: int, n: int) -> list:
    """n sequences of one length in batches of EVAL_CHUNK, from their own seed."""
    keys = jax.random.split(jax.random.PRNGKey(seed + length), -(-n // EVAL_CHUNK))
    sizes = [min(EVAL_CHUNK, n - i * EVAL_CHUNK) for i in range(len(keys))]
    return [_sample_fixed_length(k, task_cfg, length, s) for k, s in zip(keys, sizes)]


# One compiled sampler per (task, length, size): op by op, a set costs dozens of small compilations.
_sample_fixed_length = jax.jit(st.sample_fixed_length, static_argnums=(1, 2, 3))
_answer_accuracy = jax.jit(st.answer_accuracy)


def answer_metrics(logits, batch):
    """The train/eval loss and metrics: cross-entropy and accuracy at the answer slot."""
    loss, metrics = lm_loss(logits, batch)
    return loss, {"accuracy": metrics["accuracy"]}


def accuracy_on(model, params, batches) -> float:
    """Answer-slot accuracy over batches (one compiled forward per model and batch shape)."""
    correct = total = 0.0
    for b in batches:
        acc = float(_answer_accuracy(lm_logits(model, params, b.inputs), b))
        correct, total = correct + acc * b.inputs.shape[0], total + b.inputs.shape[0]
    return correct / total


def phase_code(model, params, batch, task: str) -> dict:
    """Per-(head, pair) mean phase increment in degrees for input 0 and input 1 (layer 0), and the
    pair closest to the ideal code (0 and 360/m degrees, m = 2 for parity, 3 for mod 3)."""
    inter = sown_intermediates(model, params, batch.inputs)
    inc_bthr = np.asarray(inter["layers_0"]["mixer"]["phase_increment"][0], np.float64)
    tokens = np.asarray(batch.inputs)
    per_symbol = []
    for symbol in (st.BIT0, st.BIT1):
        where = tokens == symbol
        per_symbol.append(inc_bthr[where].mean(axis=0))  # (H, r) radians
    deg = [np.degrees(np.angle(np.exp(1j * s))) for s in per_symbol]  # wrapped to (-180, 180]
    ideal = 360.0 / {"parity": 2, "mod3": 3}[task]
    score = np.abs(deg[0]) + np.abs(np.abs(deg[1]) - ideal)
    head, pair = np.unravel_index(int(np.argmin(score)), score.shape)
    return {"deg": [float(deg[0][head, pair]), float(deg[1][head, pair])], "head": int(head), "pair": int(pair),
            "pairs_deg": [[float(a), float(b)] for a, b in zip(deg[0].ravel(), deg[1].ravel())],
            "ideal_deg": [0.0, ideal]}


def train_model(cfg: StateTrackingCfg, name: str, run_dir: RunDir, mesh) -> dict:
    """One row of Table 2: the LR sweep, the chosen LR, test accuracies and (native) the phase code."""
    t0 = time.perf_counter()
    model_cfg = cfg.model_for(name)
    val_len = eval_lengths(cfg.task, cfg.test_lens[:1])[0]
    replicas = cfg.spec.replicas
    data = cfg.data
    if cfg.len_buckets:  # stage (lo, width): one bucket of lengths per step, shared by the replicas
        stage = lambda k: st.length_bucket(data, k, cfg.len_quantum, cfg.spec.grid.seed)
        sample = lambda seed, k, s: st.sample(step_key(seed, k), data, k, s[1], lo=s[0])
    else:                # stage width: every batch padded to L_max(step)
        stage = lambda k: st.curriculum_width(data, k, cfg.len_quantum)
        sample = lambda seed, k, width: st.sample(step_key(seed, k), data, k, width)
    labels = [r.label for r in replicas]
    # with a stop threshold, frozen replicas keep the parameters that reached it
    trained = run_experiment(
        run_dir, model=model_cfg, optim=cfg.spec.optim, replicas=replicas, loss=answer_metrics,
        loop_cfg=dataclasses.replace(cfg.spec.loop, name=f"{cfg.task}/{name}"), mesh_cfg=cfg.spec.mesh, mesh=mesh,
        fingerprint=cfg.fingerprint(name), meta={"model": name, "labels": labels},
        stop=None if cfg.stop_thr is None else sweep.StopRule("accuracy", stop_thr=cfg.stop_thr),
        sample=sample, stage=stage, eval_batches=fixed_set(data, VAL_SEED, val_len, cfg.val_n), force_sweep=True)
    run, result = trained.built, trained.result
    val = np.asarray(result.last_eval["eval_accuracy"], np.float64).reshape(len(replicas))
    # Mean over seeds per learning rate, then the best learning rate; its best seed is tested.
    per_lr = val.reshape(len(cfg.lrs), cfg.spec.grid.seeds).mean(axis=1)
    best_lr = int(np.argmax(per_lr))
    best = best_lr * cfg.spec.grid.seeds + int(np.argmax(val.reshape(len(cfg.lrs), cfg.spec.grid.seeds)[best_lr]))
    params = jax.tree.map(lambda a: a[best], run.params(result.state))
    out = {"chosen_lr": float(cfg.lrs[best_lr]), "val_accuracy": [float(v) for v in per_lr],
           "accuracy": {}, "scaled_accuracy": {}, "replicas": labels, "diverged": np.asarray(result.state.diverged).tolist(),
           "stopped_step": np.asarray(result.state.stopped_step).tolist(), "resumed_from": result.resumed_from}
    for length in eval_lengths(cfg.task, cfg.test_lens):
        acc = accuracy_on(run.model, params, fixed_set(data, TEST_SEED, length, cfg.test_n))
        out["accuracy"][str(length)] = acc
        out["scaled_accuracy"][str(length)] = float(st.scaled_accuracy(acc, cfg.task))
    if name == "underdamped" and cfg.task in ("parity", "mod3"):
        out["phase_code"] = phase_code(run.model, params, fixed_set(data, TEST_SEED, val_len, 256)[0], cfg.task)
    out["wall_s"] = time.perf_counter() - t0
    lens = ", ".join(f"{k}: {v:.1f}" for k, v in out["scaled_accuracy"].items())
    say(f"[{cfg.task}] {name}: chosen lr {out['chosen_lr']:g}, scaled accuracy {lens}")
    return out


def describe(cfg: StateTrackingCfg) -> str:
    padding = (f"multiples of {cfg.len_quantum} holding L_max(step)" if cfg.len_quantum else f"{cfg.data.max_len}")
    if cfg.len_buckets:
        padding = f"the top of the step's length bucket (buckets of {cfg.len_quantum} lengths)"
    lines = [f"task: {cfg.data}", f"training batches padded to {padding}", f"optimizer: {cfg.spec.optim}",
             f"loop: {cfg.spec.loop}",
             f"learning rates: {', '.join(f'{lr:g}' for lr in cfg.lrs)} x {cfg.spec.grid.seeds} seed(s)",
             "early stopping: " + ("none" if cfg.stop_thr is None else
                                   f"a replica stops once its validation accuracy reaches {cfg.stop_thr:g}"),
             f"validation {cfg.val_n}, test {cfg.test_n} sequences at lengths {eval_lengths(cfg.task, cfg.test_lens)}",
             _describe_mesh(cfg)]
    for name in cfg.models:
        m = cfg.model_for(name)
        kind = m.block if m.block == "mamba2" else f"{m.block} transition={m.transition} rope_fraction={m.rope_fraction}"
        lines.append(f"{name:>22}: {kind}, {m.n_layers} layer(s), d_model {m.d_model}, d_state {m.d_state}: "
                     f"{presets.param_count(m):,} parameters")
    return "\n".join(lines)


def _describe_mesh(cfg: StateTrackingCfg) -> str:
    """The mesh line of --dry_run, refusing what the run would refuse: a replica axis that does not
    divide each model's sweep (learning rates x seeds)."""
    replicas = len(cfg.lrs) * cfg.spec.grid.seeds
    try:
        mesh, note = meshlib.mesh_for_description(cfg.spec.mesh)
        slices = mesh.shape["replica"]
        meshlib.check_replicas(replicas, slices, "each model's", "learning rates x seeds")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return f"mesh {dict(mesh.shape)}{note}: each model's {replicas} replicas, {replicas // slices} per replica slice"


def grid_resumed_from(per_model: list) -> Optional[int]:
    """The grid's "resumed_from" (the key ssmgate.reproduce reads to judge a run's wall time): None when
    every model trained from scratch, else the earliest step a model continued from (a model trained
    from scratch beside resumed ones counts as step 0), so a grid resumed only at its last steps keeps
    its earlier wall time and any other resumed grid reports none."""
    if all(step is None for step in per_model):
        return None
    return min(step or 0 for step in per_model)


def run(cfg: StateTrackingCfg, run_dir) -> dict:
    rd = RunDir.of(run_dir)
    mesh = make_mesh(cfg.spec.mesh)
    t0 = time.perf_counter()
    rows = {name: train_model(cfg, name, RunDir(rd.path / name), mesh) for name in cfg.models}
    summary = {"task": cfg.task, "models": list(cfg.models), "lrs": list(cfg.lrs), "steps": cfg.spec.loop.steps,
               "test_lens": eval_lengths(cfg.task, cfg.test_lens), "wall_s": time.perf_counter() - t0}
    for key in ("accuracy", "scaled_accuracy", "chosen_lr", "val_accuracy", "stopped_step"):
        summary[key] = {name: rows[name][key] for name in cfg.models}
    summary["wall_s_per_model"] = {name: rows[name]["wall_s"] for name in cfg.models}
    summary["resumed_from"] = grid_resumed_from([rows[name]["resumed_from"] for name in cfg.models])
    if "phase_code" in rows.get("underdamped", {}):
        summary["phase_code"] = rows["underdamped"]["phase_code"]
    if jax.process_index() == 0:
        rd.write_json("summary.json", summary)
    return summary
