"""The spec of a training run, one model or a vmapped sweep of replicas: what every program that trains
a model of the zoo has besides its task, validated once and fingerprinted once.

    RunSpec(model, optim, loop, mesh, grid, stop, eval_n, lengen_eval_n, preset)

- `grid` is the replica grid, seeds x learning rates x gate offsets (`Grid`); it is the one home of the
  seeds and the gate offsets. The learning rates are the optimizer's `optim.lr` and, in a learning-rate
  sweep, the grid's `more_lrs` after it: each rate is held once.
- `stop` is the sweep's escape and early-stop rule (`sweep.StopRule`; None thresholds: no escape, no
  early stop; an accuracy's thresholds lie in (0, 1]), `eval_n` the examples of the fixed evaluation
  set during training, `lengen_eval_n` those of each length-generalisation set after it (None: `eval_n`).

A program's config composes a RunSpec with its task config (docs/training.md); `fingerprint(task)`
hashes the spec's part and the task's part together, the key a checkpoint must match to resume.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Optional

from ssmgate.config_error import ConfigError
from ssmgate.models.config import ModelCfg
from ssmgate.train import loop as looplib, mesh as meshlib, sweep
from ssmgate.train.optim import OptimCfg
from ssmgate.train.sweep_results import check_offsets, offset_key

SWEEP_PARTS = ("model", "optim", "replicas", "stop")
# Fields a config dropped, with the value every run had: the key keeps them so that checkpoints written
# before still resume. ModelCfg.a_log_offset (always 0 from the flags) left when the gate offset became
# the replicas' alone.
RETIRED_MODEL_FIELDS = {"a_log_offset": 0.0}


def model_key(model: ModelCfg) -> dict:
    """The model's part of a fingerprint: its fields and the retired ones."""
    return {**dataclasses.asdict(model), **RETIRED_MODEL_FIELDS}


@dataclasses.dataclass(frozen=True)
class Grid:
    """The replicas: seeds `seed .. seed + seeds - 1` x learning rates x gate offsets delta."""
    seed: int = 0
    seeds: int = 1
    offsets: tuple = (0.0,)
    more_lrs: tuple = ()   # a learning-rate sweep's rates after the optimizer's own; empty: that one alone

    def replicas(self, lrs: tuple) -> list:
        return sweep.grid(range(self.seed, self.seed + self.seeds), lrs, self.offsets)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    model: ModelCfg
    optim: OptimCfg
    loop: Optional[looplib.LoopCfg]       # None: the run trains nothing (p2_lm evaluating an official checkpoint)
    mesh: meshlib.MeshCfg
    grid: Grid = Grid()
    stop: sweep.StopRule = sweep.StopRule()
    eval_n: int = 1024
    lengen_eval_n: Optional[int] = None   # None: eval_n
    preset: Optional[str] = None

    @property
    def lrs(self) -> tuple:
        """The learning rates of the replicas: the optimizer's, then the grid's further ones."""
        return (self.optim.lr,) + self.grid.more_lrs

    @property
    def replicas(self) -> list:
        return self.grid.replicas(self.lrs)

    @property
    def lengen_examples(self) -> int:
        return self.lengen_eval_n or self.eval_n

    def replicas_line(self) -> str:
        """The --dry_run line of a sweep at one learning rate: its replicas, offsets, seeds and lr."""
        g = self.grid
        return (f"replicas ({len(self.replicas)}, one vmapped sweep): offsets "
                f"{', '.join(offset_key(o) for o in g.offsets)} x seeds {g.seed}..{g.seed + g.seeds - 1} "
                f"at lr {self.optim.lr:g}")

    def fingerprint(self, task: dict, parts: tuple = SWEEP_PARTS) -> str:
        """What a checkpoint must match to be resumed: the spec's `parts` (default: the model, the optimizer,
        the replicas and the stop rule) and the task's part `task`; never the mesh, the loop's cadence or the
        sets evaluated after training. A program whose checkpoints were first keyed otherwise names the parts
        it keys and passes the rest in `task`, so that its existing runs still resume."""
        spec = {"model": lambda: model_key(self.model), "optim": lambda: dataclasses.asdict(self.optim),
                "replicas": lambda: [dataclasses.asdict(r) for r in self.replicas],
                "stop": lambda: dataclasses.asdict(self.stop)}
        keyed = {**{p: spec[p]() for p in parts}, **task}
        return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def validate(self) -> "RunSpec":
        g = self.grid
        check_offsets(g.offsets, self.model.block)
        if g.seeds < 1:
            raise ConfigError(f"--seeds={g.seeds}: expected >= 1")
        if g.seed < 0:
            raise ConfigError(f"--seed={g.seed}: expected >= 0")
        if any(not math.isfinite(v) or v <= 0 for v in g.more_lrs):
            raise ConfigError(f"--lr={','.join(f'{v:g}' for v in self.lrs)}: expected positive, finite learning rates")
        if self.eval_n < 1:
            raise ConfigError(f"--eval_n={self.eval_n}: expected >= 1")
        if self.lengen_eval_n is not None and self.lengen_eval_n < 1:
            raise ConfigError(f"--lengen_eval_n={self.lengen_eval_n}: expected >= 1")
        escape, stop, metric = self.stop.escape_thr, self.stop.stop_thr, self.stop.metric
        if metric.endswith("accuracy"):  # an accuracy lies in [0, 1]; other metrics take any threshold
            if escape is not None and not 0.0 < escape < 1.0:
                raise ConfigError(f"--escape_thr={escape}: expected a value of {metric} in (0, 1) "
                                  "(or unset: no escape)")
            if stop is not None and not 0.0 < stop <= 1.0:
                raise ConfigError(f"--stop_thr={stop}: expected a value of {metric} in (0, 1] "
                                  "(or unset: no early stop)")
            if None not in (escape, stop) and stop < escape:
                raise ConfigError(f"--stop_thr={stop}: expected a value in [--escape_thr={escape}, 1] (a replica "
                                  "frozen before it escapes would have no escape step)")
        return self
