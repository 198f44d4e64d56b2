"""`prepare`: tokenize a corpus once into token shards, in parallel, resumably.

The corpus is listed (`pieces.listing`) and cut into pieces, one per shard; worker processes
(default: one per core) take the pieces in order and each writes its shard and then the shard's
done-marker. The token stream is the shards in order, so it does not depend on how many workers
ran: it is exactly `text_packing.token_stream` of the same documents, `max_tokens` cut included.

Resuming: the plan (pieces and what is prepared) is written first and reused; a shard whose
done-marker exists and whose file matches the marker's size and CRC-32 is never redone, so a killed
prepare, restarted with the same arguments (any worker count), tokenizes only the unfinished
shards. A finished directory is checked the same way against its manifest (every shard read once):
a truncated or changed shard is tokenized again and the manifest written anew. A directory
prepared for another corpus, split, tokenizer or max_tokens, or whose corpus files changed since,
is refused.

With `max_tokens`, shards finish in order and the prepare stops as soon as the finished prefix holds
max_tokens tokens, so a small budget of a huge corpus tokenizes little of it.
"""
from __future__ import annotations

import glob
import math
import multiprocessing
import os
import socket
import time
from pathlib import Path
from typing import Callable

from ssmgate.data import pieces, shards
from ssmgate.data.shard_worker import tokenize_job, tokenize_piece
from ssmgate.data.store import TokenStore
from ssmgate.processes import alive
from ssmgate.tasks.tokenizers import load_tokenizer

SHARD_BYTES = 64 << 20   # text per shard at most (a shard of byte tokens: 128 MB of uint16 before zstd)
MIN_SHARD_BYTES = 1 << 20  # below this a shard is not worth a worker process


class PrepareMismatch(ValueError):
    """The output directory holds a prepare of something else."""


def _identity(corpus: str, split: str, tok, max_tokens: int | None, record_tokens: int, listing_digest: str) -> dict:
    return {"format": shards.FORMAT, "corpus": corpus, "split": split, "tokenizer": tok.name,
            "vocab_size": int(tok.vocab_size), "eos_id": int(tok.eos_id), "max_tokens": max_tokens,
            "dtype": shards.token_dtype(tok.vocab_size).name, "record_tokens": record_tokens,
            "listing_digest": listing_digest}


def _check_same(out: Path, plan: dict, identity: dict) -> None:
    diffs = [f"{k}={plan.get(k)!r} (not {v!r})" for k, v in identity.items() if plan.get(k) != v]
    if diffs:
        what = "; ".join(diffs).replace("listing_digest=", "the corpus's file listing: digest ")
        raise PrepareMismatch(f"{out}: already prepared with {what}; delete it or choose another --out")


def _remove_stale_tmp(out: Path) -> None:
    """Temporary shard files that a killed process of this host left (its pid is gone)."""
    host = socket.gethostname()
    for path in glob.glob(str(out / f"*.tmp-{glob.escape(host)}-*")):
        pid = path.rsplit("-", 1)[-1]
        if pid.isdigit() and not alive(int(pid)):
            Path(path).unlink(missing_ok=True)


def _done(out: Path, i: int, log) -> dict | None:
    """Shard i's done-marker if the shard is intact (else None, the shard and marker removed so it is
    tokenized again); a marker from before checksums gets the shard's checksum once it reads back."""
    marker = shards.read_json(out / shards.done_name(i))
    if marker is None:
        return None
    bad = shards.problem(out / shards.shard_name(i), marker)
    if bad is not None:
        _redo(out, i, bad, log)
        return None
    if "crc32" not in marker:
        marker = {**marker, **shards.checksum(out / shards.shard_name(i))}
        shards.write_json(out / shards.done_name(i), marker)
    return marker


def _redo(out: Path, i: int, why: str, log) -> None:
    if log:
        log(f"[prepare] {out / shards.shard_name(i)}: {why}; tokenizing it again")
    (out / shards.done_name(i)).unlink(missing_ok=True)
    (out / shards.shard_name(i)).unlink(missing_ok=True)


def _intact(out: Path, manifest: dict, log) -> bool:
    """Whether every shard of a finished directory matches its manifest entry; if not, the
    manifest goes (the directory is unfinished again) and so do the shards that do not."""
    bad = {i: why for i, entry in enumerate(manifest["shards"])
           if (why := shards.problem(out / entry["name"], entry)) is not None}
    if not bad and all("crc32" in entry for entry in manifest["shards"]):
        return True
    (out / shards.MANIFEST).unlink()
    for i, why in bad.items():
        _redo(out, i, why, log)
    return False


def _needed_prefix(done: dict[int, dict], max_tokens: int | None) -> int | None:
    """How many leading shards the stream needs once they are done (None: not known yet)."""
    total, i = 0, 0
    while i in done:
        total += done[i]["tokens"]
        i += 1
        if max_tokens is not None and total >= max_tokens:
            return i
    return None


def prepare(corpus: str, split: str, out: str | os.PathLike, *, tokenizer: str = "byte",
            max_tokens: int | None = None, workers: int | None = None, data_dir: str | os.PathLike | None = None,
            text_key: str = "book_text", shard_bytes: int = SHARD_BYTES, record_tokens: int = shards.RECORD_TOKENS,
            log: Callable[[str], None] | None = print) -> TokenStore:
    """Prepares (or finishes, or just opens) the token shards of `split` of `corpus` in `out` and
    returns the opened stream."""
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens={max_tokens!r}: expected an int >= 1 (or None: the whole corpus)")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers={workers}: expected >= 1")
    if shard_bytes < 1 or record_tokens < 1:
        raise ValueError(f"shard_bytes={shard_bytes}, record_tokens={record_tokens}: expected both >= 1")
    tok = load_tokenizer(tokenizer)
    out = Path(out)
    parts = pieces.listing(corpus, split, data_dir=data_dir, text_key=text_key)
    identity = _identity(corpus, split, tok, max_tokens, record_tokens, pieces.digest(parts))

    if out.exists() and not out.is_dir():
        raise PrepareMismatch(f"{out}: a file, not a folder; expected a new folder or one that a prepare started")
    plan = shards.read_json(out / shards.PLAN)
    if plan is not None:
        _check_same(out, plan, identity)
        manifest = shards.read_json(out / shards.MANIFEST)
        if manifest is not None and _intact(out, manifest, log):
            return TokenStore(out)
    else:
        if out.exists() and any(out.iterdir()):
            raise PrepareMismatch(f"{out}: not empty and holds no {shards.PLAN}; expected a new folder or one "
                                  "that a prepare started")
        out.mkdir(parents=True, exist_ok=True)
        total = sum(size for _, size in parts)
        target = min(shard_bytes, max(min(MIN_SHARD_BYTES, shard_bytes), math.ceil(total / (4 * workers))))
        plan = {**identity, "target_bytes": target, "pieces": pieces.cut(parts, target)}
        shards.write_json(out / shards.PLAN, plan)
    _remove_stale_tmp(out)

    n = len(plan["pieces"])
    done = {i: m for i in range(n) if (m := _done(out, i, log)) is not None}
    pending = [i for i in range(n) if i not in done]
    progress = _progress(n, log)
    if done:
        progress(done, f"{len(done)} of {n} shards done before, resuming")
    needed = _needed_prefix(done, max_tokens)
    if needed is None and pending:
        jobs = [(str(out), i, plan["pieces"][i], tokenizer, max_tokens, identity["dtype"], record_tokens)
                for i in pending]
        _run(jobs, min(workers, len(jobs)), done, max_tokens, progress)
        needed = _needed_prefix(done, max_tokens)
    needed = n if needed is None else needed
    missing = [i for i in range(needed) if i not in done]
    if missing:  # only possible if a worker failed silently; never write a manifest over a gap
        raise RuntimeError(f"{out}: shards {missing[:5]} did not finish; run the prepare again")

    entries, total = [], 0
    for i in range(needed):
        used = done[i]["tokens"] if max_tokens is None else min(done[i]["tokens"], max_tokens - total)
        entries.append({"name": shards.shard_name(i), "records": done[i]["records"], "tokens": used,
                        "documents": done[i]["documents"], "bytes": done[i]["bytes"], "crc32": done[i]["crc32"]})
        total += used
    shards.write_json(out / shards.MANIFEST, {**identity, "n_tokens": total, "shards": entries, "complete": True})
    if log:
        log(f"[prepare] {out}: {total:,} tokens in {len(entries)} shards ({tok.name}, vocab {tok.vocab_size})")
    return TokenStore(out)


def _progress(n: int, log) -> Callable:
    """progress(done, note): a Progress line at most once a second (and for the last shard)."""
    if log is None:
        return lambda done, note="": None
    from ssmgate.train.run_dir import Progress  # imports JAX: kept out of the worker processes

    bar, last = Progress("prepare", n), [0.0]

    def progress(done: dict, note: str = "") -> None:
        now = time.perf_counter()
        if now - last[0] >= 1.0 or len(done) == n:
            last[0] = now
            tokens = sum(m["tokens"] for m in done.values())
            bar.update(len(done), "shard", f"{tokens:,} tokens" + (f", {note}" if note else ""))
    return progress


def _run(jobs: list[tuple], workers: int, done: dict, max_tokens: int | None, progress: Callable) -> None:
    """Runs the jobs (in order, `workers` at a time), adding each finished shard to `done`; stops
    early once the stream's max_tokens are all done."""
    if workers == 1:
        for job in jobs:
            marker = tokenize_piece(*job)
            done[marker["index"]] = marker
            progress(done)
            if _needed_prefix(done, max_tokens) is not None:
                return
        return
    # spawn: the parent may run JAX, whose threads a fork would copy in an unknown state
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for marker in pool.imap_unordered(tokenize_job, jobs):
            done[marker["index"]] = marker
            progress(done, f"{workers} workers")
            if _needed_prefix(done, max_tokens) is not None:
                break
        pool.terminate()  # shards after the max_tokens cut that are still running
    _remove_stale_tmp(Path(jobs[0][0]))
