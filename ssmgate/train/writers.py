"""Metric sinks of the loop: metrics.jsonl (always), TensorBoard event files (when tensorboardX is
installed: `pip install -e '.[tensorboard]'`), Weights & Biases (when a project is named with
`--wandb_project` and the `wandb` package is installed) and the curves plotted at the end of a run.

A metric value is a scalar or a per-replica vector (a sweep); TensorBoard gets one tag per
replica (`loss/r3`), the JSON line keeps the vector.

The TensorBoard events are written in the loop's own thread, each record flushed at once
(`_EventFile`, tensorboardX's record format): a write that fails (a full disk) raises
`StorageError` naming the file where it happened, instead of failing in tensorboardX's background
thread and again in its exit handler.
"""
from __future__ import annotations

import hashlib
import io
import socket
import time
from collections import defaultdict

import jax
import numpy as np

from ssmgate.storage_error import StorageError, cause
from ssmgate.train.run_dir import RunDir


class _EventFile:
    """One TensorBoard event file (`events.out.tfevents.<time>.<host>`, as tensorboardX names
    them), written synchronously."""

    def __init__(self, logdir):
        from tensorboardX.proto import event_pb2, summary_pb2
        from tensorboardX.record_writer import RecordWriter, directory_check
        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self.path = f"{logdir}/events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._writer = None
        self._io(lambda: directory_check(str(logdir)))
        self._writer = self._io(lambda: RecordWriter(self.path))
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _io(self, call):
        try:
            return call()
        except OSError as e:
            self._writer = None  # nothing more is written to a file that failed
            raise StorageError(f"cannot write TensorBoard events to {self.path}: {cause(e)}; metrics.jsonl holds "
                               f"every metric") from e

    def _write(self, event) -> None:
        if self._writer is not None:
            self._io(lambda: (self._writer.write(event.SerializeToString()), self._writer.flush()))

    def add_scalars(self, scalars: dict, step: int) -> None:
        summary = self._summary_pb2.Summary(value=[self._summary_pb2.Summary.Value(tag=tag, simple_value=value)
                                                   for tag, value in scalars.items()])
        self._write(self._event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            self._io(writer.close)


def _tensorboard_writer(logdir):
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return None
    return _EventFile(logdir)


def _wandb_run(project: str, run_dir: RunDir, config):
    """A W&B run named after the run directory; resumed (same id) when the run resumes."""
    try:
        import wandb
    except ImportError:
        raise ImportError(f"--wandb_project={project} needs the wandb package: pip install wandb") from None
    name = run_dir.path.name
    digest = hashlib.sha256(str(run_dir.path).encode()).hexdigest()[:8]  # stable across processes and restarts
    run_id = "".join(c if c.isalnum() or c in "-_" else "-" for c in f"{name}-{digest}")
    return wandb.init(project=project, name=name, id=run_id, resume="allow", dir=str(run_dir.path) if run_dir.local
                      else None, config=config)


def _scalars(metrics: dict, kind: str):
    """(tag, value) for every numeric scalar; a per-replica vector gives one tag per replica."""
    for name, value in metrics.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "fiub":
            continue
        if arr.ndim == 0:
            yield f"{kind}/{name}", float(arr)
        else:
            for r, v in enumerate(arr.reshape(-1)):
                yield f"{kind}/{name}/r{r}", float(v)


class MetricWriters:
    """Writes on process 0 only (every process of a multi-host run holds the same global metrics)."""

    def __init__(self, run_dir: RunDir, *, tensorboard: bool = True, wandb_project: str = "", config=None):
        self.run_dir = run_dir
        self.active = jax.process_index() == 0
        self.tb = _tensorboard_writer(run_dir.file("tensorboard")) if tensorboard and self.active else None
        self.wandb = _wandb_run(wandb_project, run_dir, config) if wandb_project and self.active else None

    def write(self, step: int, metrics: dict, *, kind: str) -> None:
        if not self.active:
            return
        self.run_dir.log_metrics({"step": int(step), "kind": kind, **metrics})
        scalars = dict(_scalars(metrics, kind)) if self.tb is not None or self.wandb is not None else {}
        if self.tb is not None and scalars:
            self.tb.add_scalars(scalars, step)
        if self.wandb is not None and scalars:
            self.wandb.log(scalars, step=int(step))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def curves(records: list[dict], kind: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (steps, values (n,) or (n, K)) for the records of one kind."""
    series = defaultdict(list)
    for r in records:
        if r.get("kind") != kind:
            continue
        for name, v in r.items():
            if name in ("step", "kind") or v is None or isinstance(v, str):
                continue
            series[name].append((r["step"], np.asarray(v, np.float64)))
    out = {}
    for name, pts in series.items():
        try:
            out[name] = (np.array([s for s, _ in pts]), np.stack([v for _, v in pts]))
        except ValueError:
            continue  # a metric whose shape changed between records is not plotted
    return out


def plot_curves(run_dir: RunDir, names=("loss", "accuracy", "seq_accuracy"), labels=None) -> list[str]:
    """Writes curves.png (train loss and accuracies, eval metrics; one line per replica);
    returns the written file names ([] when matplotlib is missing or there is nothing to plot)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    records = run_dir.read_metrics()
    panels = []
    for kind in ("train", "eval"):
        c = curves(records, kind)
        for name in names:
            key = name if kind == "train" else f"eval_{name}"
            if key in c:
                panels.append((kind, key, *c[key]))
    if not panels:
        return []
    kinds = sorted({kind for kind, *_ in panels}, key=("train", "eval").index)
    cols = max(sum(1 for p in panels if p[0] == kind) for kind in kinds)
    fig, axes = plt.subplots(len(kinds), cols, figsize=(4 * cols, 3.2 * len(kinds)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for kind_row, kind in enumerate(kinds):
        for ax, (_, key, steps, values) in zip(axes[kind_row], [p for p in panels if p[0] == kind]):
            ax.set_visible(True)
            values = values.reshape(len(steps), -1)
            for r in range(values.shape[1]):
                label = labels[r] if labels is not None and r < len(labels) else None
                ax.plot(steps, values[:, r], label=label, lw=1.2)
            ax.set_title(f"{kind}: {key}")
            ax.set_xlabel("step")
            if key.endswith("loss"):
                ax.set_yscale("log")
    if labels is not None and len(labels) <= 16:
        axes[-1][0].legend(fontsize=7)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    run_dir.write_text("curves.png", image.getvalue())
    return ["curves.png"]
