"""A corpus cut into pieces: consecutive runs of its documents that workers tokenize on their own.

`listing(spec, split)` names every part of a corpus with its size in bytes, in document order:
the embedded corpus's topics, a PG-19 folder's books, the files of a `files:` glob, or a prepared
TFDS split as one range of examples. The listing is cheap (paths and sizes, no text read), and its
digest tells a resumed prepare whether the corpus changed. `cut(listing, target_bytes)` groups the
parts into pieces of about `target_bytes` (a JSON-lines file or a TFDS split larger than that is
cut into byte or example ranges), and `documents(piece)` reads one piece's documents. Reading
the pieces of a cut in order gives exactly `text_corpus.open_corpus(spec, split)`'s documents.

A part is a JSON-serializable list (it is stored in the prepare's plan):
`["embedded", split, i]`, `["pg19", path]`, `["text", path]`, `["jsonl", path, key, start, end]`,
`["tfds", name, split, data_dir, key, start, stop]`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Iterator

from ssmgate.tasks import text_files as files
from ssmgate.tasks import text_corpus


def listing(spec: str, split: str, *, data_dir: str | os.PathLike | None = None,
            text_key: str = "book_text") -> list[tuple[list, int]]:
    """(part, size in bytes) of every part of `split` of the corpus, in document order. Raises what
    `open_corpus` raises for a bad spec, a missing folder or an unprepared dataset."""
    text_corpus._check_split(split)
    kind, where, key = text_corpus.parse_corpus(spec)
    if kind == "embedded":
        return [(["embedded", split, i], len(doc.encode("utf-8")))
                for i, doc in enumerate(text_corpus.embedded_corpus(split))]
    if kind == "pg19":
        return [(["pg19", str(path)], path.stat().st_size) for path in text_corpus.pg19_book_files(where, split)]
    if kind == "tfds":
        return [_tfds_part(where, split, data_dir, key or text_key)]
    _, json_key = files.parse(spec.partition(":")[2])
    parts = []
    for path in files.list_files(spec.partition(":")[2], split):
        size = os.path.getsize(path)
        parts.append((["jsonl", path, json_key, 0, size] if files.is_jsonl(path) else ["text", path], size))
    return parts


def _tfds_part(name: str, split: str, data_dir, key: str) -> tuple[list, int]:
    text_corpus.tfds_text(name, split, data_dir, key)  # its checks: prepared, feature present
    import tensorflow_datasets as tfds

    info = tfds.builder(name, data_dir=data_dir).info.splits[split]
    n = int(info.num_examples)
    return ["tfds", name, split, None if data_dir is None else os.fspath(data_dir), key, 0, n], int(info.num_bytes) or n


def digest(parts: list[tuple[list, int]]) -> str:
    """sha256 of the listing: another file set, order or size gives another digest."""
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _split_part(part: list, size: int, target: int) -> list[tuple[list, int]]:
    """A JSON-lines file or TFDS range larger than `target` as consecutive smaller ranges."""
    if size <= target or part[0] not in ("jsonl", "tfds"):
        return [(part, size)]
    lo, hi = part[-2], part[-1]
    n = math.ceil(size / target)
    bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
    return [([*part[:-2], a, b], size * (b - a) // max(hi - lo, 1)) for a, b in zip(bounds, bounds[1:]) if b > a]


def cut(parts: list[tuple[list, int]], target_bytes: int) -> list[list[list]]:
    """Pieces (lists of consecutive parts) of about `target_bytes` each; at least one piece."""
    target = max(int(target_bytes), 1)
    pieces, current, size = [], [], 0
    for part, part_size in parts:
        for sub, sub_size in _split_part(part, part_size, target):
            if current and size + sub_size > target:
                pieces.append(current)
                current, size = [], 0
            current.append(sub)
            size += sub_size
    return pieces + [current] if current or not pieces else pieces


@functools.lru_cache(maxsize=3)
def _embedded(split: str) -> list[str]:
    return text_corpus.embedded_corpus(split)


def part_documents(part: list) -> Iterator[str]:
    kind = part[0]
    if kind == "embedded":
        yield _embedded(part[1])[part[2]]
    elif kind == "pg19":
        yield text_corpus.read_pg19_book(Path(part[1]))
    elif kind == "text":
        yield files.read_text_file(part[1])
    elif kind == "jsonl":
        yield from files.jsonl_documents(part[1], part[2], part[3], part[4])
    elif kind == "tfds":
        _, name, split, data_dir, key, start, stop = part
        yield from text_corpus.tfds_text(name, f"{split}[{start}:{stop}]", data_dir, key)
    else:
        raise ValueError(f"corpus part {part!r}: unknown kind {kind!r}; expected embedded, pg19, text, jsonl or tfds")


def documents(piece: list[list]) -> Iterator[str]:
    for part in piece:
        yield from part_documents(part)
