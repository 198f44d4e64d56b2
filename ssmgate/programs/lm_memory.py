"""Peak memory of evaluating one long window (issue #7: a 64K-token window must not need memory
that grows with its length beyond one piece's activations).

`measure(cfg, lengths, piece_len)` runs, for each length, a fresh Python process that builds the
model (random weights: memory does not depend on their values), scores one window of that many
tokens with `lm_eval.sequence_scores` in pieces of `piece_len`, and reports the process's peak
resident memory (ru_maxrss). Fresh processes make the peaks comparable: nothing measured earlier
in the parent inflates them. The result also states what the window's full logits alone would take,
the memory a non-chunked evaluation would need on top.
"""
from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from typing import Sequence

from ssmgate.models.config import ModelCfg


def _child(cfg_json: str, length: int, piece_len: int) -> dict:
    import jax
    import numpy as np

    from ssmgate.models.lm import build_model
    from ssmgate.programs import lm_eval

    cfg = ModelCfg(**json.loads(cfg_json)).validate()
    model = build_model(cfg)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 8), np.int32))["params"]
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, length)).astype(np.int32)
    start = time.perf_counter()
    nll, _ = lm_eval.sequence_scores(model, params, tokens, np.ones((1, length - 1), np.float32), piece_len)
    seconds = time.perf_counter() - start
    return {"window": length, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "seconds_incl_compile": seconds, "mean_nll": float(nll.mean())}


def measure(cfg: ModelCfg, lengths: Sequence[int], piece_len: int) -> dict:
    """{"piece_len", "runs": [{"window", "peak_rss_mb", "seconds_incl_compile", "mean_nll"}], "growth_mb" (last minus
    first peak), "full_logits_mb" (float32 logits of the longest window, for scale)}."""
    cfg_json = json.dumps(dataclasses.asdict(cfg))
    runs = []
    for length in lengths:
        proc = subprocess.run([sys.executable, "-m", "ssmgate.programs.lm_memory", cfg_json, str(length),
                               str(piece_len)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"lm_memory: the window of {length} tokens failed:\n{proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    longest = max(lengths)
    return {"piece_len": piece_len, "runs": runs,
            "growth_mb": runs[-1]["peak_rss_mb"] - runs[0]["peak_rss_mb"],
            "full_logits_mb": longest * cfg.vocab_size * 4 / 2 ** 20}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
