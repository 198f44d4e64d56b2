"""The prepared accelerator check of issue #39: `python -m ssmgate.bench device_check`, run by
launch/device_check.sh with the machine's own python (nothing is installed there) inside a time
budget (--budget_s). In one run, in this order (--parts selects and orders the last four):

0. roofline: the chip's own bf16 matmul FLOP/s and copy bandwidth, measured first (every later
   fraction of the roofline divides by these, not by datasheet numbers);
1. check: `pallas` compiled for the chip against a float64 `sequential` run on the host, outputs,
   final states and every input's gradient, float32 and bf16 x/B/C (the bf16 reference runs on the
   same rounded inputs, so the error is the kernel's own), for scalar_decay and rotation;
2. speed: forward and forward+backward of `pallas`, `chunked` (XLA) and upstream mamba_ssm's Triton
   kernels (`mamba_chunk_scan_combined` for scalar_decay, `mamba3_siso_combined` for rotation) at
   the same Mamba-2-130M-like shape, bf16 x/B/C, as ratios measured in this run and as fractions of
   the roofline (floor = max(FLOPs / peak, bytes / bandwidth), as in ssmgate/bench/device.py);
3. train: one AdamW step of the P2 187M Mamba-3 model (bf16 compute): tokens/s and MFU (the model
   FLOPs of ssmgate.bench.train.model_flops over the measured bf16 peak);
4. auto: the `auto` size classes of ssmgate/cores/auto.py measured with `pallas` and `chunked` as
   candidates; a core whose classes were all measured goes into OUT/auto_table.json (the repository
   table with this backend's entry added: commit it to make `auto` use it).

The budget: an item starts only if its estimated cost (ESTIMATES) fits in the time left, else it
is recorded as skipped; after every item the JSON and the markdown table are rewritten, so a kill
(the launcher's `timeout`) leaves what was done. `--parts=auto` reruns only what a first run had
to skip. The upstream kernels are imported at run time from the ignored folder that
launch/fetch_upstream.sh fills (nothing upstream is in the repository); without torch, CUDA or that
folder the upstream rows say why they were skipped and the rest runs. `--dry` runs everything at
toy sizes on any machine (on CPU the kernels interpret): the tests use it.
"""
from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import pathlib
import signal
import sys
import time
import traceback
import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from ssmgate.bench import cores as bench
from ssmgate.bench import device
from ssmgate.cores import auto

FLAGS = flags.FLAGS
flags.DEFINE_float("budget_s", 300.0, "Seconds this check may take: no item starts whose estimated cost does "
                   "not fit in what is left (the launcher stops it 45 s after).", lower_bound=0.0)
flags.DEFINE_bool("dry", False, "Toy sizes on any machine (CPU: the kernels interpret); for the tests.")
flags.DEFINE_list("parts", ["check", "speed", "train", "auto"], "Parts to run, in this order (the roofline "
                  "is always measured first).")
flags.DEFINE_string("check_out_dir", "runs/device_check", "Folder for device_check.json, device_check.md and "
                    "auto_table.json.")
flags.DEFINE_string("upstream_dir", "third_party/mamba", "Folder with upstream mamba_ssm's source "
                    "(launch/fetch_upstream.sh fills it).")
flags.DEFINE_integer("train_batch", 8, "Sequences of 2048 tokens in the training step.", lower_bound=1)

CORES = ("scalar_decay", "rotation")
PARTS = ("check", "speed", "train", "auto")
UPSTREAM_NAMES = {"scalar_decay": "mamba_chunk_scan_combined", "rotation": "mamba3_siso_combined"}
# Estimated seconds of one item on an H200 (compilation included; upstream's first call autotunes
# its Triton configs). Guesses until a device run measures them: each row of the JSON records the
# seconds since the previous row (`since_previous_s`).
ESTIMATES = {"check": 20.0, "speed": 8.0, "upstream": 45.0, "train": 100.0, "auto": 10.0}
CHECK_TOL = {"float32": {"y": 1e-4, "state": 1e-4, "grad": 1e-3},
             "bfloat16": {"y": 3e-2, "state": 3e-2, "grad": 5e-2}}


@dataclasses.dataclass(frozen=True)
class Settings:
    check_shape: tuple           # b, t, h, p, n, g, r of the correctness checks
    speed_shape: tuple           # ... of the timed rows
    chunk: int                   # chunk of pallas and chunked
    upstream_chunk: dict         # core -> upstream's own default chunk
    matmul_size: int             # of the bf16 peak measurement
    copy_bytes: int              # of the bandwidth measurement
    reps: int
    max_seconds: float           # per timed row, after its first (compiling) call
    name: str                    # "device" or "dry"
    train: tuple                 # (model config or preset name, batch, seq_len)
    auto_classes: tuple          # (max_state, max_t, measured t, measured (b, h, p, n))
    estimates: dict


def _auto_classes(base_shape) -> tuple:
    b, _, h, p, n = base_shape[:5]
    return tuple((max_state, max_t, t, shape or (b, h, p, n))
                 for max_state, shape in bench.AUTO_WIDTHS for max_t, t in bench.AUTO_CLASSES)


DEVICE = Settings(name="device", check_shape=device.CHECK_SHAPE, speed_shape=bench.DEVICE_SHAPE, chunk=64,
                  upstream_chunk={"scalar_decay": 256, "rotation": 64},   # Mamba2's and Mamba3's defaults
                  matmul_size=8192, copy_bytes=1 << 30, reps=5, max_seconds=2.0,
                  train=("p2_lm_187m_rope05", 8, 2048), auto_classes=_auto_classes(bench.DEVICE_SHAPE),
                  estimates=ESTIMATES)


def _dry_settings() -> Settings:
    from ssmgate.models.presets import P2_LM_187M
    tiny = (1, 20, 2, 16, 16, 1, 4)          # two chunks of 16, the second ragged
    model = dataclasses.replace(P2_LM_187M, n_layers=1, d_model=32, d_mlp=32, vocab_size=64, d_state=16,
                                headdim=16)
    return Settings(name="dry", check_shape=tiny, speed_shape=tiny, chunk=16, upstream_chunk={c: 16 for c in CORES},
                    matmul_size=256, copy_bytes=1 << 22, reps=1, max_seconds=0.2, train=(model, 2, 16),
                    auto_classes=((None, 16, 16, (1, 2, 16, 16)), (None, None, 20, (1, 2, 16, 16))),
                    estimates={k: 0.0 for k in ESTIMATES})


class Budget:
    """A deadline and the estimated cost of each kind of item."""

    def __init__(self, seconds: float, estimates: dict, clock=time.monotonic):
        self.clock, self.estimates = clock, estimates
        self.deadline = clock() + seconds

    def left(self) -> float:
        return self.deadline - self.clock()

    def allows(self, kind: str) -> bool:
        left = self.left()
        return left > 0 and left >= self.estimates.get(kind, 0.0)

    def why_not(self, kind: str) -> str:
        return f"skipped: budget ({self.estimates.get(kind, 0.0):.0f} s estimated, {max(0.0, self.left()):.0f} s left)"


def _error(e: BaseException) -> str:
    return "".join(traceback.format_exception_only(e)).strip().replace("\n", " ")[:300]


class Report:
    """Rows of one table and the run's facts; rewritten to OUT/device_check.{json,md} after each item."""

    def __init__(self, out_dir, meta: dict, log=print):
        self.out = pathlib.Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.meta, self.rows, self.notes, self.log = meta, [], [], log
        self.auto_table = {}
        self._last = time.monotonic()

    def add(self, row: dict | None = None, **fields) -> dict:
        """Appends `row` (the same dict: later changes to it reach the files at the next flush) with
        `fields` added; rewrites the files."""
        row = row if row is not None else {}
        row.update(fields)
        now = time.monotonic()
        row["since_previous_s"] = now - self._last      # ~ the item's cost, compilation included:
        self._last = now                                 # what ESTIMATES should be calibrated on
        self.rows.append(row)
        self.log(f"[device_check] {row['part']:8s} {row.get('core', ''):13s} {row.get('item', '')}: {row['result']}")
        self.flush()
        return row

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.log(f"[device_check] note: {text}")
        self.flush()

    def result(self) -> dict:
        return {**self.meta, "rows": self.rows, "notes": self.notes, "auto_table": self.auto_table,
                "checks_passed": all(r["ok"] for r in self.rows if r["part"] == "check" and r.get("ok") is not None)}

    def flush(self) -> None:
        for name, text in (("device_check.json", json.dumps(self.result(), indent=1, default=str) + "\n"),
                           ("device_check.md", markdown(self.result()) + "\n")):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text)
            tmp.replace(self.out / name)      # a kill mid-write leaves the previous whole file


def _cell(v, fmt="{:.2f}") -> str:
    return "" if v is None else fmt.format(v)


def markdown(result: dict) -> str:
    m = result
    peak, bw = m.get("bf16_flops"), m.get("bandwidth")
    dry = m.get("settings", {}).get("name") == "dry"
    head = (("**--dry: toy sizes, not a measurement.** " if dry else "")
            + f"Measured {m['date']} on `{m['device_kind']}` ({m['backend']}), jax {m['jax']}"
            + (f", torch {m['torch']}, triton {m['triton']}" if m.get("torch") else "")
            + (f", upstream mamba_ssm {m['upstream_commit'][:10]}" if m.get("upstream_commit") else "")
            + (f"; bf16 matmul {peak / 1e12:.1f} TFLOP/s, copy {bw / 1e12:.2f} TB/s (measured)" if peak and bw else "")
            + f"; {m.get('elapsed_s', 0):.0f} s of a {m['budget_s']:.0f} s budget"
            + (" (interrupted)" if m.get("interrupted") else "") + f". Command: `{m['command']}`.")
    lines = [head, "", "| part | core | item | dtype | result | × chunked | × upstream | % of roofline | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [r["part"], r.get("core", ""), r.get("item", ""), r.get("dtype", ""), r["result"],
                 _cell(r.get("vs_chunked")), _cell(r.get("vs_upstream")), _cell(r.get("roofline_pct"), "{:.1f}"),
                 r.get("note", "")]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    lines += [f"- {n}" for n in result["notes"]]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ upstream

def load_upstream(folder) -> tuple[types.SimpleNamespace | None, str]:
    """(upstream kernels, '') or (None, why not). Imports mamba_ssm from `folder` without running its
    package __init__, which imports the CUDA extensions of a full install (selective_scan_cuda) that
    the Triton kernels do not need; deps/ (einops, packaging) go last on sys.path."""
    folder = pathlib.Path(folder)
    if not (folder / "mamba_ssm" / "ops" / "triton" / "ssd_combined.py").exists():
        return None, (f"upstream rows skipped: {folder}/mamba_ssm is missing; fill it with "
                      "`launch/fetch_upstream.sh GIT_DIR` (a git directory of state-spaces/mamba)")
    try:
        import torch
        import triton
    except ImportError as e:
        return None, f"upstream rows skipped: torch and triton are needed and not importable here ({e})"
    if not torch.cuda.is_available():
        return None, "upstream rows skipped: torch sees no CUDA device (upstream's kernels are Triton on CUDA)"
    if str(folder / "deps") not in sys.path:
        sys.path.append(str(folder / "deps"))
    package = types.ModuleType("mamba_ssm")
    package.__path__ = [str(folder / "mamba_ssm")]
    sys.modules.setdefault("mamba_ssm", package)
    try:
        ssd = importlib.import_module("mamba_ssm.ops.triton.ssd_combined")
        siso = importlib.import_module("mamba_ssm.ops.triton.mamba3.mamba3_siso_combined")
    except Exception as e:  # noqa: BLE001 - reported; our rows still run
        return None, f"upstream rows skipped: importing mamba_ssm's Triton kernels failed: {_error(e)}"
    commit = (folder / "COMMIT").read_text().strip() if (folder / "COMMIT").exists() else None
    return types.SimpleNamespace(torch=torch, triton=triton, ssd=ssd, siso=siso, commit=commit), ""


def upstream_fn(up, core: str, inputs: dict, chunk: int, mode: str):
    """A no-argument callable running upstream's kernel on `inputs` (bf16 x/B/C as ours, the rest
    float32) that returns once the GPU is done: the forward pass (with final states, as ours), or
    forward and the gradients of <y, w> with respect to every float input (as bench.forward_backward)."""
    torch = up.torch
    half = {"x", "B", "C"}
    t = {k: torch.from_numpy(np.asarray(v, np.float32)).cuda().to(torch.bfloat16 if k in half else torch.float32)
         for k, v in inputs.items()}
    grad = mode == "fwd+bwd"
    leaves = [v.requires_grad_(True) for v in t.values()] if grad else []

    if core == "scalar_decay":
        def call():
            return up.ssd.mamba_chunk_scan_combined(t["x"], t["dt"], t["A"], t["B"], t["C"], chunk, D=t["D"],
                                                     return_final_states=not grad)
    else:
        # Mamba-3 SISO: Q = C, K = B, V = x; A dt, dt and trap head-major; biases zero; Angles = theta.
        h, n = t["x"].shape[2], t["B"].shape[3]
        zeros = torch.zeros(h, n, device="cuda", dtype=torch.float32)

        def call():
            head_major = lambda a: a.permute(0, 2, 1).contiguous()
            return up.siso.mamba3_siso_combined(
                t["C"], t["B"], t["x"], head_major(t["dt"] * t["A"]), head_major(t["dt"]), head_major(t["trap"]),
                zeros, zeros, t["theta"], D=t["D"], chunk_size=chunk, return_final_states=not grad)

    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out
    if not grad:
        def run():
            out = call()
            torch.cuda.synchronize()
            return out
        return run
    w = torch.randn_like(first(call()))

    def run_grad():
        out = torch.autograd.grad(first(call()), leaves, w, allow_unused=True)
        torch.cuda.synchronize()
        return out
    return run_grad


def time_torch(fn, reps: int, max_seconds: float) -> float:
    """Best wall time of `reps` calls after one warm-up call (which compiles and autotunes)."""
    fn()
    best, spent = float("inf"), 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
        if spent > max_seconds:
            break
    return best


# ---------------------------------------------------------------------------------------- the parts

class Check:
    """One run: settings, budget, report, the measured roofline and (lazily) the upstream kernels."""

    def __init__(self, settings: Settings, budget: Budget, report: Report, upstream_dir, log=print):
        self.s, self.budget, self.report, self.upstream_dir, self.log = settings, budget, report, upstream_dir, log
        self.peak = self.bandwidth = None
        self._upstream = None

    def upstream(self):
        if self._upstream is None:
            up, why = load_upstream(self.upstream_dir)
            self._upstream = (up, why)
            if up is None:
                self.report.note(why)
            else:
                self.report.meta.update(torch=up.torch.__version__, triton=up.triton.__version__,
                                        upstream_commit=up.commit)
        return self._upstream[0]

    def roofline(self) -> None:
        try:
            self.peak = device.measure_bf16_flops(self.s.matmul_size, self.s.reps)
            self.bandwidth = device.measure_bandwidth(self.s.copy_bytes, self.s.reps)
        except Exception as e:  # noqa: BLE001
            self.report.add(part="roofline", item="bf16 matmul, copy", result=f"failed: {_error(e)}")
            return
        self.report.meta.update(bf16_flops=self.peak, bandwidth=self.bandwidth)
        n = self.s.matmul_size
        self.report.add(part="roofline", item=f"bf16 matmul {n}x{n}x{n}", result=f"{self.peak / 1e12:.2f} TFLOP/s")
        self.report.add(part="roofline", item=f"copy 2 x {self.s.copy_bytes / 2**20:.0f} MiB",
                        result=f"{self.bandwidth / 1e12:.3f} TB/s")

    def check(self) -> None:
        for core in CORES:
            inputs = bench.make_inputs(core, *self.s.check_shape)
            for dtype in ("float32", "bfloat16"):
                if not self.budget.allows("check"):
                    self.report.add(part="check", core=core, item="y, state, gradients", dtype=dtype,
                                    result=self.budget.why_not("check"), ok=None)
                    continue
                t0 = time.monotonic()
                try:
                    run_inputs = inputs if dtype == "float32" else device._to_half(inputs)
                    ref_y, ref_state, ref_grads = device._reference(core, run_inputs)
                    fn = bench.core_fn(core, "pallas", self.s.chunk)
                    y, final = jax.jit(fn)(run_inputs)
                    got = {"y": (y, ref_y), "state": (device._state_array(final), ref_state)}
                    got.update({f"grad_{k}": (v, ref_grads[k]) for k, v in device._grads(fn, run_inputs).items()})
                except Exception as e:  # noqa: BLE001 - reported, the rest still runs
                    self.report.add(part="check", core=core, item="run", dtype=dtype, result=f"failed: {_error(e)}",
                                    ok=False, seconds=time.monotonic() - t0)
                    continue
                for what, (g, w) in got.items():
                    tol = CHECK_TOL[dtype]["grad" if what.startswith("grad") else what]
                    err = bench.relative_error(np.asarray(g, np.float64), w)
                    ok = bool(err <= tol)
                    self.report.add(part="check", core=core, item=what, dtype=dtype, rel_err=err, tol=tol, ok=ok,
                                    result=f"{'ok' if ok else 'FAIL'}: rel. err {err:.1e} (tol {tol:.0e})",
                                    seconds=time.monotonic() - t0)

    def _speed_row(self, core, name, item, chunk, mode, seconds, rows) -> dict:
        b, t = self.s.speed_shape[:2]
        scale = 1.0 if mode == "fwd" else 3.0
        flops = scale * bench.flop_count(core, "chunked", chunk, *self.s.speed_shape)
        nbytes = scale * device.io_bytes(core, *self.s.speed_shape)
        floor = max(flops / self.peak, nbytes / self.bandwidth) if self.peak and self.bandwidth else None
        bound = None if floor is None else ("FLOP" if flops / self.peak >= nbytes / self.bandwidth else "bytes")
        row = dict(part="speed", core=core, item=item, dtype="bf16 x/B/C", algorithm=name,
                   chunk=chunk, mode=mode, seconds=seconds, tokens_per_s=b * t / seconds, flops=flops, bytes=nbytes,
                   roofline_pct=None if floor is None else 100 * floor / seconds, bound=bound,
                   result=f"{seconds * 1e3:.3f} ms, {b * t / seconds / 1e6:.2f} Mtok/s",
                   note="" if bound is None else f"{bound}-bound floor")
        rows[(name, mode)] = row
        # time of chunked (upstream) / time of the row, for every row of this mode so far: rows
        # measured before upstream get their ratio to it now (the report holds the same dicts)
        base, peer = rows.get(("chunked", mode)), rows.get(("upstream", mode))
        for (_, m), r in rows.items():
            if m == mode:
                r["vs_chunked"] = base["seconds"] / r["seconds"] if base else None
                r["vs_upstream"] = peer["seconds"] / r["seconds"] if peer else None
        return row

    def speed(self) -> None:
        shape = self.s.speed_shape
        for core in CORES:
            inputs = device._to_half(bench.make_inputs(core, *shape))
            rows = {}
            for name in ("chunked", "pallas", "upstream"):
                for mode in ("fwd", "fwd+bwd"):
                    kind = "upstream" if name == "upstream" else "speed"
                    chunk = self.s.upstream_chunk[core] if name == "upstream" else self.s.chunk
                    item = f"{name}/{chunk} {mode}"
                    if name == "upstream":
                        item = f"{UPSTREAM_NAMES[core]}/{chunk} {mode}"
                        if self.upstream() is None:
                            self.report.add(part="speed", core=core, item=item, dtype="bf16 x/B/C",
                                            result="skipped: upstream unavailable (see the note)")
                            continue
                    if not self.budget.allows(kind):
                        self.report.add(part="speed", core=core, item=item, dtype="bf16 x/B/C",
                                        result=self.budget.why_not(kind))
                        continue
                    try:
                        if name == "upstream":
                            sec = time_torch(upstream_fn(self.upstream(), core, inputs, chunk, mode),
                                             self.s.reps, self.s.max_seconds)
                        else:
                            fn = bench.core_fn(core, name, chunk)
                            f = jax.jit(fn) if mode == "fwd" else bench.forward_backward(fn, inputs)
                            sec = bench.time_call(f, inputs, self.s.reps, self.s.max_seconds)
                    except Exception as e:  # noqa: BLE001
                        self.report.add(part="speed", core=core, item=item, dtype="bf16 x/B/C",
                                        result=f"failed: {_error(e)}")
                        continue
                    self.report.add(self._speed_row(core, name, item, chunk, mode, sec, rows))

    def train(self) -> None:
        model, b, seq_len = self.s.train
        name = model if isinstance(model, str) else "dry-run Mamba-3 (toy)"
        item = f"AdamW step, b={b} t={seq_len}"
        if not self.budget.allows("train"):
            self.report.add(part="train", core=name, item=item, dtype="bf16", result=self.budget.why_not("train"))
            return
        try:
            row = train_step_row(model, b, seq_len, self.peak, 3 if self.s.reps > 1 else 1)
        except Exception as e:  # noqa: BLE001
            self.report.add(part="train", core=name, item=item, dtype="bf16", result=f"failed: {_error(e)}")
            return
        self.report.add(part="train", core=name, item=item, dtype="bf16", **row)

    def auto(self) -> None:
        backend = jax.default_backend()
        for core in CORES:
            classes, complete = [], True
            for max_state, max_t, t, (b, h, p, n) in self.s.auto_classes:
                item = f"p·n ≤ {max_state or '∞'}, t ≤ {max_t or '∞'} (b={b} h={h} p={p} n={n} t={t})"
                if not self.budget.allows("auto"):
                    self.report.add(part="auto", core=core, item=item, result=self.budget.why_not("auto"))
                    complete = False
                    continue
                try:
                    entry = auto_entry(core, max_state, max_t, t, (b, h, p, n), self.s)
                except Exception as e:  # noqa: BLE001
                    self.report.add(part="auto", core=core, item=item, result=f"failed: {_error(e)}")
                    complete = False
                    continue
                classes.append(entry)
                timings = ", ".join(f"{e['algorithm']}/{e['chunk_size']} {e['fwd_seconds'] * 1e3:.2f} / "
                                    f"{e['train_seconds'] * 1e3:.2f} ms" for e in entry["timings"])
                self.report.add(part="auto", core=core, item=item, note=timings,
                                result=f"forward {bench._choice(entry['forward'])}, train {bench._choice(entry['train'])}")
            if complete and classes:
                self.report.auto_table[core] = classes
                table = dict(auto.load_table())
                table[backend] = {**table.get(backend, {}), **self.report.auto_table}
                # a --dry table (toy sizes) gets another name, so that nobody commits it by mistake
                name = "auto_table.json" if self.s.name == "device" else "auto_table.dry.json"
                (self.report.out / name).write_text(json.dumps(table, indent=1) + "\n")
                self.report.note(f"auto: {core} measured in every class; {self.report.out}/{name} holds the "
                                 f"repository table with {backend!r} added"
                                 + (" (copy it to ssmgate/cores/auto_table.json and commit it)"
                                    if self.s.name == "device" else " (toy sizes of --dry: not for committing)"))
                self.report.flush()


def auto_entry(core, max_state, max_t, t, bhpn, s: Settings) -> dict:
    """One auto class in auto_table.json's format: every candidate timed, forward and forward+backward."""
    b, h, p, n = bhpn
    g, r = s.speed_shape[5], min(s.speed_shape[6], n // 2)
    inputs = device._to_half(bench.make_inputs(core, b, t, h, p, n, g, r))
    timings = []
    for algorithm in ("chunked", "pallas"):
        fn = bench.core_fn(core, algorithm, s.chunk)
        timings.append({"algorithm": algorithm, "chunk_size": s.chunk,
                        "fwd_seconds": bench.time_call(jax.jit(fn), inputs, s.reps, s.max_seconds),
                        "train_seconds": bench.time_call(bench.forward_backward(fn, inputs), inputs, s.reps,
                                                         s.max_seconds)})
    entry = {"max_state": max_state, "max_t": max_t, "measured_t": t,
             "measured_shape": {"b": b, "h": h, "p": p, "n": n}, "inputs": "bf16 x/B/C"}
    for kind, key in (("fwd", "forward"), ("train", "train")):
        best = min(timings, key=lambda e: e[f"{kind}_seconds"])
        entry[key] = {"algorithm": best["algorithm"], "chunk_size": best["chunk_size"]}
    entry["timings"] = timings
    return entry


def train_step_row(model, b: int, seq_len: int, peak: float | None, reps: int) -> dict:
    """One jitted AdamW step (bf16 compute, float32 parameters and optimizer state, donated) on random
    tokens: best step time of `reps` after the compiling call, tokens/s and MFU."""
    import optax

    from ssmgate.bench.train import model_flops
    from ssmgate.models.lm import build_model, init_params
    from ssmgate.models.presets import count_breakdown, preset
    from ssmgate.train import optim
    from ssmgate.train.state import TrainState
    from ssmgate.train.step import make_train_step

    cfg = preset(model) if isinstance(model, str) else model.validate()
    net = build_model(cfg)

    def loss_fn(params, tokens, rng):
        logits, _ = net.apply({"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:]).mean(), {}

    tx = optim.make_optimizer(optim.OptimCfg(name="adamw", lr=3e-3, total_steps=100))
    step = jax.jit(make_train_step(loss_fn, tx, compute_dtype=jnp.dtype(cfg.dtype)), donate_argnums=0)
    state = TrainState.create(init_params(cfg, jax.random.PRNGKey(0)), tx, jax.random.PRNGKey(1))
    tokens = jax.random.randint(jax.random.PRNGKey(2), (b, seq_len + 1), 0, cfg.vocab_size, jnp.int32)
    t0 = time.perf_counter()
    state, metrics = step(state, tokens)
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        state, metrics = step(state, tokens)
        jax.block_until_ready(state)
        best = min(best, time.perf_counter() - t0)
    flops = model_flops(cfg, b, seq_len)
    mfu = None if not peak else flops / best / peak
    return {"seconds": best, "first_call_s": first, "tokens_per_s": b * seq_len / best, "flops": flops,
            "params": count_breakdown(cfg)["total"], "loss": float(metrics["loss"]),
            "roofline_pct": None if mfu is None else 100 * mfu,
            "result": f"{b * seq_len / best:,.0f} tokens/s, {best * 1e3:.1f} ms/step"
                      + ("" if mfu is None else f", MFU {100 * mfu:.1f}%"),
            "note": f"{count_breakdown(cfg)['total'] / 1e6:.1f} M params; first call {first:.1f} s"}


# --------------------------------------------------------------------------------------------- main

class Interrupted(BaseException):
    """SIGTERM (the launcher's timeout): not an Exception, so no item's error handler records it."""


def run_check(settings: Settings, parts, budget_s: float, out_dir, upstream_dir, command: str,
              log=print, clock=time.monotonic) -> dict:
    """The whole check; returns the result dict (also in OUT/device_check.json)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"device_check: unknown parts {unknown}; expected some of {list(PARTS)}")
    start = clock()
    budget = Budget(budget_s, settings.estimates, clock)
    dev = jax.devices()[0]
    meta = {"date": datetime.date.today().isoformat(), "device_kind": dev.device_kind, "backend": jax.default_backend(),
            "jax": jax.__version__, "python": sys.version.split()[0], "command": command, "budget_s": budget_s,
            "settings": dataclasses.asdict(settings)}
    report = Report(out_dir, meta, log)
    check = Check(settings, budget, report, upstream_dir, log)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise Interrupted(f"signal {signum}")

    try:
        signal.signal(signal.SIGTERM, on_term)   # the launcher's timeout: record what was done, then stop
    except ValueError:                           # not the main thread
        previous = None
    try:
        check.roofline()
        for part in parts:
            getattr(check, part)()
    except Interrupted as e:
        report.meta["interrupted"] = str(e)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        report.meta["elapsed_s"] = clock() - start
        report.flush()
    return report.result()


def main(argv) -> None:
    if len(argv) > 1:
        raise SystemExit(f"ssmgate.bench device_check: unexpected arguments {argv[1:]}")
    unknown = [p for p in FLAGS.parts if p not in PARTS]
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; expected a subset of {list(PARTS)}")
    if not FLAGS.dry and jax.default_backend() == "cpu":
        raise SystemExit("device_check: JAX's backend is 'cpu' (devices "
                         f"{jax.devices()}); run it on the accelerator machine, or pass --dry for toy sizes")
    settings = _dry_settings() if FLAGS.dry else dataclasses.replace(
        DEVICE, train=(DEVICE.train[0], FLAGS.train_batch, DEVICE.train[2]))
    command = " ".join(["python -m ssmgate.bench"] + sys.argv[1:])
    log = lambda s: print(s, flush=True)
    result = run_check(settings, FLAGS.parts, FLAGS.budget_s, FLAGS.check_out_dir, FLAGS.upstream_dir, command, log)
    print("\n" + markdown(result), flush=True)
    print(f"\n[device_check] wrote {FLAGS.check_out_dir}/device_check.json and device_check.md", flush=True)
    if not result["checks_passed"]:
        raise SystemExit("device_check: a correctness check FAILED (see the check rows)")
