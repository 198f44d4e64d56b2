"""Program `train`: a language model of the zoo trained on a synthetic task, one run or a sweep.

The framework's reference program (the experiments of P1/P2 reuse its pieces): mesh, model,
optimizer, sharded and jitted step, data from (seed, step), evaluation on a fixed set, orbax
checkpoints with automatic resume, metrics, progress, plots and summary.json. With more than one
replica (seeds x learning rates x gate offsets) the replicas are trained by one vmapped step.

summary.json: {"replicas": [labels], "final": {eval metric: value, or [per replica] in a sweep},
"steps", "params", "tokens_per_s", "wall_s", "resumed_from", "params_digest" (sha256 of the
weights), and for sweeps "escape_step", "stopped_step", "diverged", "divergence"}.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Optional

import jax
import numpy as np

from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.tasks import synthetic_lm
from ssmgate.train import lm_runs
from ssmgate.train import loop, mesh as meshlib, optim, sweep, sweep_results
from ssmgate.train.compile_step import TrainPlan
from ssmgate.train.experiment import run_experiment
from ssmgate.train.run_dir import RunDir, say
from ssmgate.train.throughput import Throughput
from ssmgate.train.writers import plot_curves

EVAL_SEED_OFFSET = 1_000_003  # the evaluation set's seed: seed + this, never a training step's key


@dataclasses.dataclass(frozen=True)
class TrainLMCfg:
    model: ModelCfg
    optim: optim.OptimCfg
    task: synthetic_lm.SyntheticCfg
    loop: loop.LoopCfg
    mesh: meshlib.MeshCfg
    replicas: tuple
    stop: sweep.StopRule = sweep.StopRule()
    eval_batches: int = 4
    preset: Optional[str] = None
    force_sweep: bool = False

    @property
    def is_sweep(self) -> bool:
        return len(self.replicas) > 1 or self.force_sweep

    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed: everything but the mesh and the loop's
        logging/checkpoint cadence (a run may resume on another mesh)."""
        keyed = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in
                 (("model", self.model), ("optim", self.optim), ("task", self.task), ("stop", self.stop))}
        keyed["replicas"] = [dataclasses.asdict(r) for r in self.replicas]
        keyed["eval_batches"] = self.eval_batches
        return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def validate(self) -> "TrainLMCfg":
        if self.task.vocab_size != self.model.vocab_size:
            raise ConfigError(f"task vocabulary {self.task.vocab_size} != --vocab_size={self.model.vocab_size}")
        sweep_results.check_offsets(tuple(dict.fromkeys(r.offset for r in self.replicas)), self.model.block)
        if self.eval_batches < 1:
            raise ConfigError(f"--eval_batches={self.eval_batches}: expected >= 1")
        try:
            meshlib.check_batch(self.task.batch, self.mesh.data, self.mesh.microbatches)  # -1 (all devices): checked by run()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return self


def data_args(cfg: TrainLMCfg) -> dict:
    """The batches of step k and the fixed evaluation batches, as lm_runs.build_run takes them."""
    task = cfg.task
    eval_keys = jax.random.split(synthetic_lm.step_key(cfg.replicas[0].seed + EVAL_SEED_OFFSET, 0), cfg.eval_batches)
    return dict(sample=lambda seed, k: synthetic_lm.sample(synthetic_lm.step_key(seed, k), task),
                eval_batches=[synthetic_lm.sample(k, task) for k in eval_keys])


def describe(cfg: TrainLMCfg) -> str:
    """The --dry_run report: config, parameter counts, mesh and every parameter's sharding."""
    lines = [f"model: {cfg.model}", f"optimizer: {cfg.optim}", f"task: {cfg.task}", f"loop: {cfg.loop}",
             f"replicas ({len(cfg.replicas)}): " + "; ".join(r.label for r in cfg.replicas[:8])
             + (" ..." if len(cfg.replicas) > 8 else ""),
             "", presets.count_table(cfg.model, cfg.preset or "")]
    if cfg.preset in presets.PAPER_SIZES:
        paper, total = presets.PAPER_SIZES[cfg.preset], presets.param_count(cfg.model)
        lines.append(f"  the paper states {paper / 1e6:,.0f} M: this model is {100 * (total / paper - 1):+.1f}%")
    return "\n".join(lines + lm_runs.describe_mesh(cfg.model, cfg.mesh, cfg.task.batch))


def training_plan(cfg: TrainLMCfg) -> TrainPlan:
    """The run's step (the run's and `python -m ssmgate.aot`'s)."""
    task = cfg.task
    return TrainPlan(cfg.model, cfg.optim, cfg.replicas, synthetic_lm.lm_loss, cfg.mesh, force_sweep=cfg.force_sweep,
                     batch=lambda: jax.eval_shape(lambda: synthetic_lm.sample(synthetic_lm.step_key(0, 0), task)))


def run(cfg: TrainLMCfg, run_dir: str) -> dict:
    rd = RunDir(run_dir)
    labels = [r.label for r in cfg.replicas]
    trained = run_experiment(
        rd, **training_plan(cfg).engine(), loop_cfg=cfg.loop, batch=cfg.task.batch, fingerprint=cfg.fingerprint(),
        throughput=throughput(cfg),
        meta={"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "labels": labels},
        stop=cfg.stop if cfg.is_sweep and cfg.stop.metric else None, **data_args(cfg))
    result = trained.result
    summary = _summary(cfg, result, labels)
    if jax.process_index() == 0:
        rd.write_json("summary.json", summary)
        plot_curves(rd, labels=labels if cfg.is_sweep else None)
    for message in summary.get("divergence", []):
        say(f"[train] {message}")
    return summary


def throughput(cfg: TrainLMCfg) -> Throughput:
    return Throughput.for_lm(cfg.model, cfg.task.batch, cfg.task.seq_len, len(cfg.replicas))


def _summary(cfg: TrainLMCfg, result: loop.LoopResult, labels) -> dict:
    steps_run = result.step - (result.resumed_from or 0)
    tokens = steps_run * throughput(cfg).tokens_per_step
    summary = {"replicas": labels, "final": {k.removeprefix("eval_"): v for k, v in result.last_eval.items()},
               "steps": result.step, "params": presets.param_count(cfg.model), "wall_s": result.wall_s,
               "tokens_per_s": tokens / max(result.wall_s, 1e-9), "resumed_from": result.resumed_from,
               "params_digest": lm_runs.params_digest(result.state.train.params if cfg.is_sweep else result.state.params)}
    if cfg.is_sweep:
        s = result.state
        summary.update(escape_step=[None if v < 0 else int(v) for v in np.asarray(s.escape_step)],
                       stopped_step=[None if v < 0 else int(v) for v in np.asarray(s.stopped_step)],
                       diverged=[bool(v) for v in np.asarray(s.diverged)],
                       divergence=sweep.report_divergence(s, labels))
    return summary
