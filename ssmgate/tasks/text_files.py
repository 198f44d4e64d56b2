"""The `files:` corpus: documents from plain-text and JSON-lines files matched by a glob.

Spelling: `files:<glob>[#<key>]`.

- `<glob>` is a `glob.glob` pattern (`**` matches across folders). Every matching file is a part of
  the corpus, in sorted path order, so the documents come in the same order on every machine.
- A file whose name ends in `.jsonl` holds one document per line: a JSON object whose text is
  under `<key>` (default `text`, e.g. `files:/data/*.jsonl#content`); blank lines are skipped.
  Any other file is one document, its whole UTF-8 text as it is (nothing stripped, `\r\n` kept).
- A match that is a symbolic link to nothing is an error, not a file skipped.
- Splits: `{split}` in the glob is replaced by the split's name (`files:/data/{split}/*.txt`
  reads /data/train/ for training and /data/validation/ for validation). A glob without
  `{split}` is a train split only; asking it for another split is an error rather than a silent
  reuse of the training text.

`#` is not a glob character, so it cannot be confused with the pattern (as `?` would be).
A JSON-lines file can be read in byte ranges (`jsonl_documents(path, key, start, end)`: the lines
that begin inside [start, end)), so one large file can be tokenized by several workers.
"""
from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Iterator

FILES_FORM = "'files:<glob>[#<json key>]' (*.jsonl: one JSON document per line, text under <json key>, default 'text'; other files: one document each; '{split}' in the glob is the split's name)"
DEFAULT_KEY = "text"
SPLIT_FIELD = "{split}"


def parse(where: str) -> tuple[str, str]:
    """(glob, json key) of the part after `files:`; raises ValueError on an empty glob or key."""
    pattern, _, key = where.partition("#")
    if not pattern:
        raise ValueError(f"corpus='files:{where}': expected {FILES_FORM}")
    return pattern, key or DEFAULT_KEY


def split_glob(pattern: str, split: str) -> str:
    """The glob of `split`: `{split}` replaced by the split's name; without it, train only."""
    if SPLIT_FIELD in pattern:
        return pattern.replace(SPLIT_FIELD, split)
    if split != "train":
        raise ValueError(f"corpus='files:{pattern}': the glob has no {SPLIT_FIELD} field, so it names the train "
                         f"split only, not {split!r}; write the glob with {SPLIT_FIELD} (e.g. "
                         f"files:/data/{SPLIT_FIELD}/*.jsonl) to give each split its own files")
    return pattern


def is_jsonl(path: str | os.PathLike) -> bool:
    return os.fspath(path).endswith(".jsonl")


def list_files(where: str, split: str) -> list[str]:
    """The files of `split` in sorted path order; raises FileNotFoundError when none matches, or
    when a match is a symbolic link to nothing (skipping it would drop its text unseen)."""
    pattern, _ = parse(where)
    resolved = split_glob(pattern, split)
    matched = sorted(glob.glob(resolved, recursive=True))
    dangling = [p for p in matched if os.path.islink(p) and not os.path.exists(p)]
    if dangling:
        raise FileNotFoundError(f"corpus='files:{where}': {dangling[0]} is a symbolic link to {os.readlink(dangling[0])},"
                                f" which does not exist ({len(dangling)} such match(es) of {resolved!r}); expected every "
                                f"match to be a readable file or folder")
    paths = [p for p in matched if os.path.isfile(p)]
    if not paths:
        raise FileNotFoundError(f"corpus='files:{where}': no file matches the glob {resolved!r} (split {split!r})")
    return paths


def read_text_file(path: str | os.PathLike) -> str:
    """The file's text exactly (bytes decoded, no newline translation: CRLF stays CRLF)."""
    try:
        return Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def jsonl_documents(path: str | os.PathLike, key: str, start: int = 0, end: int | None = None) -> Iterator[str]:
    """The `key` text of each line of a JSON-lines file whose first byte lies in [start, end)
    (the whole file by default). Consecutive ranges that tile the file give every line once."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                f.readline()  # `start` is inside a line: that line belongs to the previous range
        while end is None or f.tell() < end:
            offset = f.tell()
            line = f.readline()
            if not line:
                break
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{path} (line at byte {offset}): not a JSON object ({e})") from None
            text = obj.get(key) if isinstance(obj, dict) else None
            if not isinstance(text, str):
                found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
                raise ValueError(f"{path} (line at byte {offset}): expected a JSON object with a string under "
                                 f"{key!r}; found {found}")
            yield text


def file_documents(path: str | os.PathLike, key: str = DEFAULT_KEY) -> Iterator[str]:
    """The documents of one file: its lines' `key` texts (.jsonl) or its whole text."""
    if is_jsonl(path):
        yield from jsonl_documents(path, key)
    else:
        yield read_text_file(path)


def files_corpus(where: str, split: str) -> Iterator[str]:
    """Every document of `split` of `files:<where>`, in order. The files are listed (and a glob
    that matches none reported) here, before iteration."""
    paths = list_files(where, split)
    _, key = parse(where)

    def documents() -> Iterator[str]:
        for path in paths:
            yield from file_documents(path, key)
    return documents()
