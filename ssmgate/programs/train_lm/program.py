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
import json

import jax
import numpy as np

from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.tasks import synthetic_lm
from ssmgate.train import lm_runs
from ssmgate.train import loop, mesh as meshlib, sweep
from ssmgate.train.compile_step import TrainPlan
from ssmgate.train.experiment import run_experiment
from ssmgate.train.run_dir import RunDir, say
from ssmgate.train.run_spec import RunSpec
from ssmgate.train.throughput import Throughput
from ssmgate.train.writers import plot_curves

EVAL_SEED_OFFSET = 1_000_003  # the evaluation set's seed: seed + this, never a training step's key


@dataclasses.dataclass(frozen=True)
class TrainLMCfg:
    task: synthetic_lm.SyntheticCfg
    spec: RunSpec                    # model, optimizer, loop, mesh, replicas, stop rule
    eval_batches: int = 4
    force_sweep: bool = False

    @property
    def is_sweep(self) -> bool:
        return len(self.spec.replicas) > 1 or self.force_sweep

    def fingerprint(self) -> str:
        """What a checkpoint must match to be resumed: everything but the mesh and the loop's
        logging/checkpoint cadence (a run may resume on another mesh)."""
        return self.spec.fingerprint({"task": dataclasses.asdict(self.task), "eval_batches": self.eval_batches})

    def validate(self) -> "TrainLMCfg":
        model = self.spec.validate().model
        if self.task.vocab_size != model.vocab_size:
            raise ConfigError(f"task vocabulary {self.task.vocab_size} != --vocab_size={model.vocab_size}")
        if self.eval_batches < 1:
            raise ConfigError(f"--train_eval_batches={self.eval_batches}: expected >= 1")
        try:
            # -1 (all devices): checked by run()
            meshlib.check_batch(self.task.batch, self.spec.mesh.data, self.spec.mesh.microbatches)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return self


def data_args(cfg: TrainLMCfg) -> dict:
    """The batches of step k and the fixed evaluation batches, as lm_runs.build_run takes them."""
    task = cfg.task
    eval_keys = jax.random.split(synthetic_lm.step_key(cfg.spec.replicas[0].seed + EVAL_SEED_OFFSET, 0), cfg.eval_batches)
    return dict(sample=lambda seed, k: synthetic_lm.sample(synthetic_lm.step_key(seed, k), task),
                eval_batches=[synthetic_lm.sample(k, task) for k in eval_keys])


def describe(cfg: TrainLMCfg) -> str:
    """The --dry_run report: config, parameter counts, mesh and every parameter's sharding."""
    lines = [f"model: {cfg.spec.model}", f"optimizer: {cfg.spec.optim}", f"task: {cfg.task}", f"loop: {cfg.spec.loop}",
             f"replicas ({len(cfg.spec.replicas)}): " + "; ".join(r.label for r in cfg.spec.replicas[:8])
             + (" ..." if len(cfg.spec.replicas) > 8 else ""),
             "", presets.count_table(cfg.spec.model, cfg.spec.preset or "")]
    if cfg.spec.preset in presets.PAPER_SIZES:
        paper, total = presets.PAPER_SIZES[cfg.spec.preset], presets.param_count(cfg.spec.model)
        lines.append(f"  the paper states {paper / 1e6:,.0f} M: this model is {100 * (total / paper - 1):+.1f}%")
    return "\n".join(lines + lm_runs.describe_mesh(cfg.spec.model, cfg.spec.mesh, cfg.task.batch))


def training_plan(cfg: TrainLMCfg) -> TrainPlan:
    """The run's step (the run's and `python -m ssmgate.aot`'s)."""
    task = cfg.task
    return TrainPlan(cfg.spec.model, cfg.spec.optim, cfg.spec.replicas, synthetic_lm.lm_loss, cfg.spec.mesh,
                     force_sweep=cfg.force_sweep,
                     batch=lambda: jax.eval_shape(lambda: synthetic_lm.sample(synthetic_lm.step_key(0, 0), task)))


def run(cfg: TrainLMCfg, run_dir) -> dict:
    rd = RunDir.of(run_dir)
    labels = [r.label for r in cfg.spec.replicas]
    trained = run_experiment(
        rd, **training_plan(cfg).engine(), loop_cfg=cfg.spec.loop, batch=cfg.task.batch, fingerprint=cfg.fingerprint(),
        throughput=throughput(cfg),
        meta={"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "labels": labels},
        stop=cfg.spec.stop if cfg.is_sweep and cfg.spec.stop.metric else None, **data_args(cfg))
    result = trained.result
    summary = _summary(cfg, result, labels)
    if jax.process_index() == 0:
        rd.write_json("summary.json", summary)
        plot_curves(rd, labels=labels if cfg.is_sweep else None)
    for message in summary.get("divergence", []):
        say(f"[train] {message}")
    return summary


def throughput(cfg: TrainLMCfg) -> Throughput:
    return Throughput.for_lm(cfg.spec.model, cfg.task.batch, cfg.task.seq_len, len(cfg.spec.replicas))


def _summary(cfg: TrainLMCfg, result: loop.LoopResult, labels) -> dict:
    steps_run = result.step - (result.resumed_from or 0)
    tokens = steps_run * throughput(cfg).tokens_per_step
    summary = {"replicas": labels, "final": {k.removeprefix("eval_"): v for k, v in result.last_eval.items()},
               "steps": result.step, "params": presets.param_count(cfg.spec.model), "wall_s": result.wall_s,
               "tokens_per_s": tokens / max(result.wall_s, 1e-9), "resumed_from": result.resumed_from,
               "params_digest": lm_runs.params_digest(result.state.train.params if cfg.is_sweep else result.state.params)}
    if cfg.is_sweep:
        s = result.state
        summary.update(escape_step=[None if v < 0 else int(v) for v in np.asarray(s.escape_step)],
                       stopped_step=[None if v < 0 else int(v) for v in np.asarray(s.stopped_step)],
                       diverged=[bool(v) for v in np.asarray(s.diverged)],
                       divergence=sweep.report_divergence(s, labels))
    return summary
