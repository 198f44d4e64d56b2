"""Peak memory of evaluating one long window (issue #7: a 64K-token window must not need memory
that grows with its length beyond one piece's activations).

`measure(cfg, lengths, piece_len)` runs, for each length, a fresh Python process that builds the
model (random weights: memory does not depend on their values) and scores one window of that many
tokens with `lm_eval.sequence_scores` in pieces of `piece_len` tokens, twice: the first pass
compiles (XLA's compiler has its own, larger, peak); then the process's peak resident set is reset
(Linux: /proc/self/clear_refs) and the second pass is measured (VmHWM). For contrast the longest
window is also scored in one piece (`unchunked`): what the evaluation would hold without carrying
the state between pieces. Where the peak cannot be reset the lifetime peak (ru_maxrss) is reported
and `method` says so.

Each row runs `repeats` fresh processes and keeps the median peak: the same row's peak moves from
process to process (likely with how much of the compiler's freed heap the measured pass reuses), for a small
model by as much as the growth the comparison looks for, so one process per row let that noise
decide it. The spread of each row's processes is reported beside it (docs/reproduction.md, P2 LM).
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
from typing import Sequence

from ssmgate.malloc_env import without_tunables
from ssmgate.models.config import ModelCfg, config_class
from ssmgate.xla_env import with_flag


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024.0
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set size (VmHWM), Linux >= 4.0
        return True
    except OSError:
        return False


def _child(cfg_json: str, length: int, piece_len: int) -> dict:
    import jax
    import numpy as np

    from ssmgate.models.lm import build_model, init_params
    from ssmgate.train import lm_eval

    fields = json.loads(cfg_json)
    cfg = config_class(fields)(**fields).validate()
    model = build_model(cfg)
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, length)).astype(np.int32)
    weights = np.ones((1, length - 1), np.float32)
    lm_eval.sequence_scores(model, params, tokens, weights, piece_len)  # compiles
    reset = _reset_peak()
    nll, _ = lm_eval.sequence_scores(model, params, tokens, weights, piece_len)
    return {"window": length, "piece_len": piece_len, "peak_rss_mb": _peak_rss_mb(),
            "method": "VmHWM after compiling" if reset else "ru_maxrss (lifetime peak, compiler included)",
            "mean_nll": float(nll.mean())}


def child_env() -> dict:
    """The children's environment. No persistent compilation cache: every child compiles its own
    programs, so each keeps the same compiler memory when its peak is reset (a child that loaded
    them from the cache that `make reproduce` shares held 105 MB less than one that compiled them,
    so the longer window measured the smaller peak). LLVM -O0 unless XLA_FLAGS already sets an
    optimization level: a child measures memory, not speed; buffer assignment is XLA's (HLO)
    decision, not LLVM's, and the peaks measured at -O0 and -O2 agreed within 2 MB, while a child
    took 7 s instead of 24 (with `init_params` compiled). glibc's default malloc, without
    ssmgate.malloc_env's tuning: a heap that keeps every freed page would let the measured pass
    reuse the compiler's freed memory without raising the peak."""
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = without_tunables(env.get("GLIBC_TUNABLES", ""))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    env["XLA_FLAGS"] = with_flag(env.get("XLA_FLAGS", ""), "xla_backend_optimization_level", "0")
    return env


def _run_once(cfg_json: str, length: int, piece_len: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "ssmgate.train.lm_memory", cfg_json, str(length), str(piece_len)],
                          capture_output=True, text=True, env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"lm_memory: the window of {length} tokens (pieces of {piece_len}) failed:\n"
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run(cfg_json: str, length: int, piece_len: int, repeats: int) -> dict:
    """One row: the median peak of `repeats` fresh processes, each process's peak in `peaks_mb`."""
    each = [_run_once(cfg_json, length, piece_len) for _ in range(repeats)]
    peaks = [r["peak_rss_mb"] for r in each]
    return {**each[0], "peak_rss_mb": statistics.median_low(peaks), "peaks_mb": peaks}


def measure(cfg: ModelCfg, lengths: Sequence[int], piece_len: int, repeats: int = 3) -> dict:
    """{"piece_len", "repeats", "runs": [{"window", "peak_rss_mb" (median over the processes),
    "peaks_mb", "method", "mean_nll"}], "growth_mb" (largest minus smallest median peak over the
    lengths), "spread_mb" (the largest max - min of one row's processes: the noise the growth is read
    against), "unchunked": the longest window in one piece, "unchunked_extra_mb" (its median peak
    minus the chunked one of the same window), "full_logits_mb" (float32 logits of the longest
    window, for scale)}."""
    if repeats < 1:
        raise ValueError(f"lm_memory.measure: repeats={repeats}; expected >= 1")
    lengths = list(lengths)
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    runs = [_run(cfg_json, length, piece_len, repeats) for length in lengths]
    peaks = [r["peak_rss_mb"] for r in runs]
    longest = max(lengths)
    unchunked = _run(cfg_json, longest, longest - 1, repeats)
    spread = max(max(r["peaks_mb"]) - min(r["peaks_mb"]) for r in [*runs, unchunked])
    return {"piece_len": piece_len, "repeats": repeats, "runs": runs, "growth_mb": max(peaks) - min(peaks),
            "spread_mb": spread, "unchunked": unchunked,
            "unchunked_extra_mb": unchunked["peak_rss_mb"] - peaks[lengths.index(longest)],
            "full_logits_mb": longest * cfg.vocab_size * 4 / 2 ** 20}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
