"""The loop at run time: stop requests (SIGTERM/SIGINT), the non-finite check read a step late under
the real donated step, throughput lines, the profiler window, W&B, async checkpoints and run
directories on an object store."""
import json
import os
import signal
import sys
import types

import jax
import numpy as np
import pytest

from ssmgate.models.config import ModelCfg
from ssmgate.train import loop, mesh as meshlib, throughput
from ssmgate.train.preemption import Preempted
from ssmgate.train.run_dir import RunDir
from ssmgate.train.step import make_train_step
from tests.train.test_loop import TX, batch_of, loss_fn, records, single


def donated_step():
    """The step as programs build it: jitted with shardings and its input state donated."""
    init = single()
    mesh = meshlib.make_mesh(meshlib.MeshCfg())
    shardings = meshlib.state_shardings(jax.eval_shape(init), mesh, "replicated")
    return meshlib.jit_step(make_train_step(loss_fn, TX), shardings, meshlib.batch_sharding(mesh))


def run(path, steps=12, batch_fn=None, step_fn=None, **cfg):
    init = single()
    cfg = loop.LoopCfg(steps=steps, log_every=cfg.pop("log_every", 4), tensorboard=False, **cfg)
    return loop.run(RunDir(path), cfg, init_state=init, abstract_state=jax.eval_shape(init),
                    step_fn=step_fn or donated_step(), batch_fn=batch_fn or (lambda k: batch_of(0, k)),
                    meta={}, fingerprint="f")


def same_params(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_after_the_current_step_and_the_rerun_ends_bit_identical(tmp_path, sig):
    full = run(tmp_path / "full")

    def batch_fn(k):
        if k == 5:
            os.kill(os.getpid(), sig)  # arrives while step 5 is being prepared
        return batch_of(0, k)

    before = signal.getsignal(sig)  # pytest-xdist workers ignore SIGINT, a plain pytest does not
    with pytest.raises(Preempted) as stopped:
        run(tmp_path / "part", batch_fn=batch_fn)
    assert stopped.value.step == 6 and signal.Signals(sig).name in str(stopped.value)
    assert sorted(int(p.name) for p in (tmp_path / "part" / "checkpoints").iterdir()) == [6]
    assert records(tmp_path / "part")[-1]["kind"] == "stopped"
    assert signal.getsignal(sig) == before  # the loop's handler is gone again
    resumed = run(tmp_path / "part")
    assert resumed.resumed_from == 6 and same_params(resumed.state, full.state)


def test_divergence_under_the_donated_step_saves_the_last_good_state(tmp_path):
    with pytest.raises(loop.TrainingDiverged, match=r"step 7: the loss is not finite.*step 6"):
        run(tmp_path, batch_fn=lambda k: batch_of(0, k, nan_at=6), ckpt_every=4)
    assert [r for r in records(tmp_path) if r["kind"] == "error"] == [
        {"step": 7, "kind": "error", "error": "step 7: the loss is not finite"}]
    good = run(tmp_path / "ref", steps=6)
    restored = loop.Checkpointer(tmp_path / "checkpoints").restore(jax.eval_shape(single()), step=6)[1]
    assert int(restored.step) == 6 and same_params(restored, good.state)


def test_the_host_reads_a_steps_metrics_only_after_the_next_step_is_dispatched(tmp_path):
    events = []
    jitted = jax.jit(make_train_step(loss_fn, TX))

    class Flag:  # a metrics leaf that records when the loop looks at it
        def __init__(self, k, code):
            self.k, self.code = k, code

        def __array__(self, dtype=None, copy=None):
            events.append(("read", self.k))
            return np.asarray(self.code, dtype)

    def step_fn(state, batch):
        k = len([e for e in events if e[0] == "dispatch"])
        events.append(("dispatch", k))
        state, metrics = jitted(state, batch)
        return state, dict(metrics, nonfinite=Flag(k, metrics["nonfinite"]))

    run(tmp_path, steps=8, step_fn=step_fn, log_every=4)
    first_read = {k: events.index(("read", k)) for k in range(8)}
    for k in (0, 1, 2, 4, 5, 6):  # inside a progress window: read after step k + 1 is dispatched
        assert first_read[k] > events.index(("dispatch", k + 1)), events


def test_progress_lines_carry_tokens_per_second_and_mfu(tmp_path, capsys):
    cfg = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8)
    tp = throughput.Throughput.for_lm(cfg, batch=16, seq_len=8)
    flops = throughput.model_flops(cfg, 16, 8)
    init = single()
    cfg = loop.LoopCfg(steps=4, log_every=2, tensorboard=False)
    loop.run(RunDir(tmp_path), cfg, init_state=init, abstract_state=jax.eval_shape(init), step_fn=donated_step(),
             batch_fn=lambda k: batch_of(0, k), meta={}, fingerprint="f", throughput=tp)
    train = [r for r in records(tmp_path) if r["kind"] == "train"]
    for r in train:
        assert r["tokens_per_s"] == pytest.approx(r["steps_per_s"] * 128)
        assert r["mfu"] == pytest.approx(r["steps_per_s"] * flops / throughput.measured_cpu_matmul_flops())
    assert "tokens/s, MFU " in capsys.readouterr().out


def test_peak_flops_table_and_rate_format():
    assert throughput.peak_for_kind("TPU v5 lite") == 197e12  # not v5p's
    assert throughput.peak_for_kind("NVIDIA H100 80GB HBM3") == 989e12
    assert throughput.peak_for_kind("Some New Chip") is None
    assert throughput.measured_cpu_matmul_flops() > 1e8
    assert [throughput.format_rate(v) for v in (950, 12_300, 4.56e6)] == ["950", "12.3k", "4.6M"]


def test_profile_steps_write_a_trace_and_bad_windows_are_refused(tmp_path):
    run(tmp_path, steps=6, profile_steps=(2, 3))
    assert list((tmp_path / "profile").rglob("*.xplane.pb"))
    with pytest.raises(ValueError, match="profile_steps=4:9: expected FIRST:LAST"):
        loop.LoopCfg(steps=6, profile_steps=(4, 9)).validate()


def test_wandb_gets_the_scalars_when_a_project_is_named(tmp_path, monkeypatch):
    logged, calls = [], {}

    class FakeRun:
        def log(self, scalars, step):
            logged.append((step, scalars))

        def finish(self):
            calls["finished"] = True

    fake = types.SimpleNamespace(init=lambda **kw: calls.update(kw) or FakeRun())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run(tmp_path / "w", steps=4, wandb_project="proj")
    assert calls["project"] == "proj" and calls["resume"] == "allow" and calls["finished"]
    assert [s for s, _ in logged] == [4] and logged[0][1]["train/loss"] > 0
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(ImportError, match="pip install wandb"):
        run(tmp_path / "x", steps=4, wandb_project="proj")


def test_async_checkpoints_resume_bit_identical(tmp_path):
    full = run(tmp_path / "full")
    run(tmp_path / "part", steps=8, ckpt_every=4, ckpt_async=True)
    resumed = run(tmp_path / "part", ckpt_every=4, ckpt_async=True)
    assert resumed.resumed_from == 8 and same_params(resumed.state, full.state)


def test_object_store_run_dirs_rewrite_metrics_instead_of_appending(tmp_path):
    local, remote = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    remote.local = False  # the code path of gs:// paths, on a local folder
    for rd in (local, remote):
        for k in range(3):
            rd.log_metrics({"step": k, "loss": 1.0 / (k + 1)})
        rd.truncate_metrics(1)
        rd.log_metrics({"step": 2, "loss": 0.0})
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == (tmp_path / "b" / "metrics.jsonl").read_text()
    assert [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


def test_a_rerun_writes_no_metrics_line_twice(tmp_path):
    init = single()
    cfg = loop.LoopCfg(steps=8, log_every=4, tensorboard=False)
    eval_fn = jax.jit(lambda s: {"w": s.params["w2"]["kernel"].sum()})

    def go():
        return loop.run(RunDir(tmp_path), cfg, init_state=init, abstract_state=jax.eval_shape(init),
                        step_fn=donated_step(), batch_fn=lambda k: batch_of(0, k), eval_fn=eval_fn, meta={},
                        fingerprint="f")

    go()
    once = (tmp_path / "metrics.jsonl").read_text()
    go()  # a finished run again: restores step 8 and evaluates, without a second eval line
    assert (tmp_path / "metrics.jsonl").read_text() == once
    import shutil
    shutil.rmtree(tmp_path / "checkpoints")  # killed before its first checkpoint: lines but no state
    go()
    assert (tmp_path / "metrics.jsonl").read_text().count('"kind": "eval"') == 1
    assert [r["step"] for r in records(tmp_path) if r["kind"] == "train"] == [4, 8]
