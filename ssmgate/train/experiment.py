"""The one run start every training program shares: mesh -> build -> loop.

`run_experiment` makes the mesh of the run's mesh flags on the devices it has (a mismatch is a
ConfigError naming the flag), builds the run or sweep (`lm_runs.build_run`), and trains it with the
loop, which owns every side effect (checkpoints, metrics, resume). The program keeps what is its
own: the data, the loss, the evaluation and the summary it writes from the returned result.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from ssmgate.config_error import ConfigError
from ssmgate.train import lm_runs, loop, mesh as meshlib, sweep
from ssmgate.train.run_dir import RunDir
from ssmgate.train.sweep_results import stopped_at_checkpoint
from ssmgate.train.throughput import Throughput


def make_mesh(mesh_cfg: meshlib.MeshCfg, batch: Optional[int] = None):
    """The mesh of `mesh_cfg` on this run's devices, and `batch` checked against its data axis."""
    try:
        mesh = meshlib.make_mesh(mesh_cfg)
        if batch is not None:
            meshlib.check_batch(batch, mesh.shape["data"], mesh_cfg.microbatches)
    except ValueError as e:  # the mesh flags against the devices this run has
        raise ConfigError(str(e)) from None
    return mesh


@dataclasses.dataclass
class Trained:
    built: lm_runs.Run        # the model, the step, the batches: what evaluations after training reuse
    result: loop.LoopResult   # the final state, the step reached, the last evaluation, wall time

    @property
    def params(self):
        return self.built.params(self.result.state)


def run_experiment(run_dir: RunDir, *, model, optim, replicas, loss: Callable, loop_cfg: loop.LoopCfg,
                   mesh_cfg: meshlib.MeshCfg, fingerprint: str, meta: dict, mesh=None, batch: Optional[int] = None,
                   eval_fn: Optional[Callable[[lm_runs.Run], Any]] = None, stop: Optional[sweep.StopRule] = None,
                   resume_stopped: bool = False, throughput: Optional[Throughput] = None,
                   **data) -> Trained:
    """Trains `replicas` of `model` on the batches `data` describes (lm_runs.build_run's sample /
    stage / host_sample / global_batch / eval_batches / base_params / force_sweep).

    mesh: made here from `mesh_cfg` (with `batch` checked) unless given (a program that trains
    several rows on one mesh). eval_fn(built) -> the loop's evaluation (default: the mean of the
    loss's metrics over `eval_batches`). stop: the sweep's escape and early-stop rule on the labels
    of `replicas`. resume_stopped: a sweep whose every replica had stopped at its last checkpoint
    ends there instead of training on (its rerun reproduces the finished run)."""
    if mesh is None:
        mesh = make_mesh(mesh_cfg, batch)
    data.setdefault("eval_batches", ())
    built = lm_runs.build_run(model, optim, replicas, loss=loss, mesh=mesh, mode=mesh_cfg.params,
                              microbatches=mesh_cfg.microbatches, remat=mesh_cfg.remat,
                              loss_chunk=mesh_cfg.loss_chunk, **data)
    stopping = {}
    if stop is not None:
        stopping = dict(after_eval=sweep.after_eval(stop, [r.label for r in replicas]), done_fn=sweep.all_stopped)
    if resume_stopped:
        stopped = stopped_at_checkpoint(run_dir, built.abstract, fingerprint, loop_cfg.steps)
        if stopped is not None:
            loop_cfg = dataclasses.replace(loop_cfg, steps=stopped)
    result = loop.run(run_dir, loop_cfg, init_state=built.init_state, abstract_state=built.abstract,
                      step_fn=built.step, batch_fn=built.batch_fn,
                      eval_fn=built.eval_fn if eval_fn is None else eval_fn(built), meta=meta,
                      fingerprint=fingerprint, throughput=throughput, **stopping)
    return Trained(built, result)
