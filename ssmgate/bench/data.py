"""Data benchmark (`python -m ssmgate.bench data`): the sharded text pipeline (`ssmgate.data`).

On synthetic `files:` corpora generated in a temporary folder (JSON-lines files and plain-text
files of random English-like words; deleted afterwards), of `--small_mb` and `--big_mb` MB of text:

1. Tokenization: `prepare` (byte tokenizer) of the big corpus with 1 worker and with every core,
   MB of text per second.
2. Loader throughput: training batches of `--read_batch` x `--read_seq_len` read synchronously (no prefetch:
   the whole cost a step would wait for), tokens/s for one process reading the whole batch and for
   process 0 of 2 reading its half, against the tokens/s that the cpu-scale p2_lm pair trains at
   (`experiments/p2/cpu/lm_rope{05,0}.flags`: 800 steps of 16 x 256 tokens in 349 s and 271 s,
   docs/reproduction.md), the faster of the two.
3. Memory: a fresh process imports the loader, resets its peak RSS (Linux: /proc/self/clear_refs),
   opens the prepared shards and reads `--read_steps` batches (with prefetch, as training does);
   its peak RSS (VmHWM) on the big corpus against the small one.

The machine is shared: the load average before each measurement is in the JSON and the table.
Prints a table, writes JSON (--out, default runs/bench/data.json); --docs replaces the block
between '<!-- bench:data -->' markers.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import flags

from ssmgate.bench.cores import _cpu_name, write_result

FLAGS = flags.FLAGS
flags.DEFINE_float("small_mb", 10.0, "Text of the small corpus, MB.", lower_bound=0.1)
flags.DEFINE_float("big_mb", 100.0, "Text of the big corpus, MB (the issue's case: 1024).", lower_bound=0.1)
flags.DEFINE_integer("read_steps", 500, "Batches read per loader measurement.", lower_bound=1)
flags.DEFINE_integer("read_batch", 16, "Rows per global batch (cpu-scale p2_lm: 16).", lower_bound=2)
flags.DEFINE_integer("read_seq_len", 256, "Tokens per row (cpu-scale p2_lm: 256).", lower_bound=1)
flags.DEFINE_string("workdir", None, "Folder for the temporary corpora and shards (default: the system's temp).")

# cpu-scale p2_lm pair (docs/reproduction.md): 800 steps x 16 x 256 tokens in 349 s (rotation), 271 s (none)
P2_CPU_TOKENS_PER_S = 800 * 16 * 256 / 271
MB = 1 << 20

_CHILD = """
import json, sys, time
from ssmgate.data.loader import Loader
from ssmgate.data.store import TokenStore

def status_mb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024

directory, steps, batch, seq_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak RSS (VmHWM): the imports' transient peak is not the loader's
before = status_mb("VmRSS")
loader = Loader(TokenStore(directory), seq_len, batch, 0, prefetch=2)
start = time.perf_counter()
for k in range(steps):
    loader(k)
print(json.dumps({"rss_before_mb": before, "peak_mb": status_mb("VmHWM"), "seconds": time.perf_counter() - start}))
"""


def make_corpus(root: Path, megabytes: float, seed: int = 0) -> int:
    """JSON-lines files (90% of the text, documents of ~4 KB) and text files (~64 KB each) of random
    words; returns the bytes of text written."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", np.uint8)
    words = ["".join(map(chr, rng.choice(letters, size=rng.integers(1, 10)))) for _ in range(5000)]
    pool = " ".join(rng.choice(words, size=400_000)).replace(" t ", ". The ")  # ~2 MB to cut documents from
    root.mkdir(parents=True)
    total, target = 0, int(megabytes * MB)
    jsonl_target, file_size = int(0.9 * target), min(32 * MB, max(MB, target // 16))
    n_file = 0
    while total < jsonl_target:
        lines, size = [], 0
        while size < file_size and total + size < jsonl_target:
            start, length = rng.integers(0, len(pool) - 8192), rng.integers(1000, 7000)
            doc = pool[start:start + length]
            lines.append(json.dumps({"text": doc}))
            size += len(doc)
        (root / f"part-{n_file:05d}.jsonl").write_text("\n".join(lines) + "\n")
        total, n_file = total + size, n_file + 1
    while total < target:
        start, length = rng.integers(0, len(pool) - 70_000), rng.integers(32_000, 96_000)
        (root / f"book-{n_file:05d}.txt").write_text(pool[start:start + length])
        total, n_file = total + len(pool[start:start + length]), n_file + 1
    return total


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def time_prepare(spec: str, out: Path, workers: int, text_bytes: int) -> dict:
    from ssmgate.data.prepare import prepare

    load = _load()
    start = time.perf_counter()
    store = prepare(spec, "train", out, workers=workers, log=None)
    seconds = time.perf_counter() - start
    return {"workers": workers, "seconds": seconds, "mb_per_s": text_bytes / MB / seconds, "tokens": len(store),
            "shards": len(store.manifest["shards"]), "load": load,
            "disk_mb": sum(p.stat().st_size for p in out.glob("shard-*.array_record")) / MB}


def time_loader(directory: Path, steps: int, batch: int, seq_len: int, processes: int) -> dict:
    from ssmgate.data.loader import Loader, process_share
    from ssmgate.data.store import TokenStore

    loader = Loader(TokenStore(directory), seq_len, batch, 0, share=process_share(batch, 0, processes), prefetch=0)
    loader.local_batch(0)  # opens the readers
    load = _load()
    start = time.perf_counter()
    for k in range(steps):
        loader.local_batch(k)
    seconds = time.perf_counter() - start
    tokens = steps * (batch // processes) * seq_len
    return {"processes": processes, "steps": steps, "tokens_per_s": tokens / seconds, "load": load,
            "ms_per_step": 1e3 * seconds / steps}


def child_rss(directory: Path, steps: int, batch: int, seq_len: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(directory), str(steps), str(batch), str(seq_len)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"the RSS child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(small_mb: float, big_mb: float, steps: int, batch: int, seq_len: int, workdir: str | None,
            log=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="ssmgate-bench-data-", dir=workdir))
    cores = os.cpu_count() or 1
    try:
        corpora = {}
        for name, mb in (("small", small_mb), ("big", big_mb)):
            start = time.perf_counter()
            text_bytes = make_corpus(root / name, mb, seed=len(name))
            corpora[name] = {"mb": text_bytes / MB, "spec": f"files:{root / name}/*", "bytes": text_bytes}
            log(f"[bench data] {name} corpus: {text_bytes / MB:,.1f} MB in {time.perf_counter() - start:.1f} s")
        big = corpora["big"]
        tokenize = [time_prepare(big["spec"], root / f"big-w{w}", w, big["bytes"]) for w in sorted({1, cores})]
        for row in tokenize:
            log(f"[bench data] prepare {big['mb']:,.0f} MB, {row['workers']} workers: {row['mb_per_s']:.1f} MB/s")
        if cores > 1:
            shutil.rmtree(root / "big-w1")  # disk: the 1-worker shards are the same stream again
        big_dir = root / f"big-w{cores}"
        small_dir = root / "small-shards"
        time_prepare(corpora["small"]["spec"], small_dir, cores, corpora["small"]["bytes"])

        loader = []
        for name, directory in (("small", small_dir), ("big", big_dir)):
            for processes in (1, 2):
                row = dict(time_loader(directory, steps, batch, seq_len, processes), corpus=name)
                row["x_p2_cpu"] = row["tokens_per_s"] / P2_CPU_TOKENS_PER_S
                loader.append(row)
                log(f"[bench data] loader, {name} corpus, process 0 of {processes}: {row['tokens_per_s']:,.0f} "
                    f"tokens/s ({row['x_p2_cpu']:.0f}x the cpu-scale p2_lm)")
        memory = {}
        for name, directory in (("small", small_dir), ("big", big_dir)):
            memory[name] = dict(child_rss(directory, steps, batch, seq_len), load=_load())
            log(f"[bench data] fresh process, {name} corpus: peak RSS {memory[name]['peak_mb']:.1f} MB")
        memory["growth_mb"] = memory["big"]["peak_mb"] - memory["small"]["peak_mb"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"corpora": {k: {"mb": v["mb"]} for k, v in corpora.items()}, "tokenize": tokenize, "loader": loader,
            "memory": memory, "p2_cpu_tokens_per_s": P2_CPU_TOKENS_PER_S, "batch": batch, "seq_len": seq_len,
            "read_steps": steps}


def markdown(r: dict) -> str:
    small, big = r["corpora"]["small"]["mb"], r["corpora"]["big"]["mb"]
    lines = [f"Measured {r['date']} on {r['cpu']} ({r['cores']} cores, shared with other work: load averages in "
             f"the tables), `{r['command']}`; byte tokenizer, synthetic `files:` corpora of {small:,.0f} MB and "
             f"{big:,.0f} MB of text (90% JSON lines, 10% text files).", "",
             f"**Tokenization** (`prepare` of the {big:,.0f} MB corpus):", "",
             "| workers | seconds | MB of text / s | tokens | shards | on disk (MB) | load |", "|---|---|---|---|---|---|---|"]
    for t in r["tokenize"]:
        lines.append(f"| {t['workers']} | {t['seconds']:.1f} | {t['mb_per_s']:.1f} | {t['tokens']:,} | {t['shards']} | "
                     f"{t['disk_mb']:,.0f} | {t['load']} |")
    lines += ["", f"**Loader** (batches of {r['batch']} x {r['seq_len']}, read synchronously, {r['read_steps']} "
              f"steps; the cpu-scale p2_lm pair trains {r['p2_cpu_tokens_per_s']:,.0f} tokens/s at best):", "",
              "| corpus | process | tokens/s of that process | ms / step | × p2_lm cpu | load |", "|---|---|---|---|---|---|"]
    for row in r["loader"]:
        lines.append(f"| {r['corpora'][row['corpus']]['mb']:,.0f} MB | 0 of {row['processes']} | "
                     f"{row['tokens_per_s']:,.0f} | {row['ms_per_step']:.2f} | {row['x_p2_cpu']:.0f}× | {row['load']} |")
    m = r["memory"]
    lines += ["", f"**Memory** (a fresh process opens the shards and reads {r['read_steps']} batches with prefetch; the "
              "peak is VmHWM, reset after the imports):", "",
              "| corpus | RSS after imports (MB) | peak RSS while reading (MB) | read time (s) | load |",
              "|---|---|---|---|---|"]
    for name in ("small", "big"):
        lines.append(f"| {r['corpora'][name]['mb']:,.0f} MB | {m[name]['rss_before_mb']:.1f} | "
                     f"{m[name]['peak_mb']:.1f} | {m[name]['seconds']:.2f} | {m[name]['load']} |")
    lines += ["", f"Peak RSS growth from {small:,.0f} MB to {big:,.0f} MB of text: **{m['growth_mb']:+.1f} MB**."]
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu_name(), "cores": os.cpu_count(),
              "command": "python -m ssmgate.bench " + " ".join(sys.argv[1:]),
              **measure(FLAGS.small_mb, FLAGS.big_mb, FLAGS.read_steps, FLAGS.read_batch, FLAGS.read_seq_len, FLAGS.workdir)}
    print(markdown(result))
    write_result(result, markdown(result), "runs/bench/data.json", "data")
