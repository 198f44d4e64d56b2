"""Text corpora for the language-model pipeline (protocol §7): documents as an iterable of strings.

Sources, all offline at run time:

- `embedded_corpus(split)`: a small English corpus that exists wherever CPython does, the help texts
  of `pydoc_data.topics` (what `help("assert")` prints). It lets the LM programs, their tests and the
  `quick` scale run on a fresh machine with no download. Measured on CPython 3.11.7: 79 documents,
  464,970 characters (466,117 UTF-8 bytes) in all; train 69 documents / 401,726 characters,
  validation 6 / 24,174, test 4 / 39,070. The texts follow the CPython release (3.11.2 ships
  466,019 characters), the split of each topic does not: it is fixed by a hash of the topic name.
- `pg19_folder(root, split)`: a local copy of PG-19 in its published layout (`metadata.csv` and
  `train/ validation/ test/` folders of `<book_id>.txt`), read with the standard library only.
- `tfds_text(name, split, data_dir, text_key)`: any TFDS text dataset already prepared on disk in
  the `array_record` format (e.g. the official `pg19`, feature `book_text`), read through
  `tfds.data_source`, which needs neither TensorFlow nor network. Nothing is downloaded here.
- `files:<glob>` in `open_corpus`: plain-text and JSON-lines files (`ssmgate.tasks.text_files`).

Every source yields its documents in a deterministic order, so a token stream built from it (see
`text_packing`) is the same on every machine.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Iterator

from ssmgate.tasks import text_files

SPLITS = ("train", "validation", "test")
# Embedded-corpus split by hash bucket of the topic name (out of 100): 90 / 5 / 5.
_SPLIT_PERCENT = {"train": (0, 90), "validation": (90, 95), "test": (95, 100)}


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")


# ---------------------------------------------------------------------------------------------------
# Embedded corpus: CPython's pydoc topics.


def _stable_bucket(name: str) -> int:
    """0..99 from SHA-256 of `name`; unlike `hash()`, the same in every process and on every machine."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % 100


def split_of_topic(topic: str) -> str:
    """The embedded-corpus split that `topic` belongs to (90 / 5 / 5 by a stable hash of its name)."""
    bucket = _stable_bucket(topic)
    return next(s for s, (lo, hi) in _SPLIT_PERCENT.items() if lo <= bucket < hi)


def _pydoc_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # some minimal Python builds strip the pydoc data
        raise RuntimeError("embedded_corpus needs the standard-library module pydoc_data.topics, "
                           "which this Python installation lacks") from e
    return topics


def embedded_topics(split: str) -> list[str]:
    """The topic names of `split`, sorted."""
    _check_split(split)
    return [t for t in sorted(_pydoc_topics()) if split_of_topic(t) == split]


def embedded_corpus(split: str) -> list[str]:
    """The help texts of `split`'s topics, in sorted topic order (sizes in the module docstring)."""
    topics = _pydoc_topics()
    return [topics[t] for t in embedded_topics(split)]


# ---------------------------------------------------------------------------------------------------
# PG-19 from a local folder.


@dataclasses.dataclass(frozen=True)
class Book:
    book_id: int
    title: str
    publication_date: str
    url: str
    text: str


def _book_id(name: str, where: Path) -> int:
    try:
        return int(name)
    except ValueError:
        raise ValueError(f"{where}: book id {name!r} is not an integer (PG-19 ids are Gutenberg numbers)") from None


def read_pg19_metadata(path: str | os.PathLike) -> dict[int, tuple[str, str, str]]:
    """`metadata.csv` as {book_id: (short_book_title, publication_date, url)}.

    PG-19's file has no header and the columns `_id,short_book_title,publication_date,url`; a header
    row (first field not a number) is accepted and skipped. A title holding unquoted commas is
    rejoined, since the date and url are always the last two fields.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: PG-19 metadata file not found (expected metadata.csv with columns "
                                "_id,short_book_title,publication_date,url)")
    out: dict[int, tuple[str, str, str]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for line_no, row in enumerate(csv.reader(f), start=1):
            if not row:
                continue
            if line_no == 1 and not row[0].strip().isdigit():
                continue  # header row
            if len(row) < 4:
                raise ValueError(f"{path}:{line_no}: expected 4 fields (_id,short_book_title,publication_date,url), "
                                 f"got {len(row)}: {row!r}")
            book_id = _book_id(row[0].strip(), Path(f"{path}:{line_no}"))
            out[book_id] = (",".join(row[1:-2]), row[-2], row[-1])
    return out


def _split_files(folder: Path) -> dict[int, Path]:
    """{book_id: path} of the `<id>.txt` files in one split folder."""
    return {_book_id(p.stem, p): p for p in folder.iterdir() if p.suffix == ".txt"}


def pg19_folder(root: str | os.PathLike, split: str) -> Iterator[Book]:
    """The books of `split` under a local PG-19 copy, sorted by id, read one at a time.

    Layout errors are raised here, before iteration: a missing root, metadata.csv or split folder; a
    book file with no metadata row; and, when all three split folders are present (a full copy), a
    book listed in metadata.csv that is in none of them. A partial copy (say test/ and validation/
    only, enough for protocol §7.2) skips that last check, since metadata.csv lists the books of all splits.
    Texts are stripped of surrounding whitespace, as the TFDS `pg19` builder does, so both sources
    give the same documents.
    """
    _check_split(split)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: PG-19 folder not found (expected metadata.csv and {', '.join(SPLITS)}/)")
    metadata = read_pg19_metadata(root / "metadata.csv")
    folder = root / split
    if not folder.is_dir():
        present = [s for s in SPLITS if (root / s).is_dir()]
        raise FileNotFoundError(f"{folder}: split {split!r} not found under the PG-19 folder {root} "
                                f"(splits present: {present})")
    files = _split_files(folder)
    unknown = sorted(set(files) - set(metadata))
    if unknown:
        raise ValueError(f"{files[unknown[0]]}: book {unknown[0]} is not listed in {root / 'metadata.csv'} "
                         f"({len(unknown)} such books in {folder})")
    if all((root / s).is_dir() for s in SPLITS):
        on_disk = set(files).union(*(_split_files(root / s) for s in SPLITS if s != split))
        absent = sorted(set(metadata) - on_disk)
        if absent:
            tried = ", ".join(str(root / s / f"{absent[0]}.txt") for s in SPLITS)
            raise FileNotFoundError(f"book {absent[0]} is listed in {root / 'metadata.csv'} but absent: none of "
                                    f"{tried} exists ({len(absent)} listed books absent)")

    def books() -> Iterator[Book]:
        for book_id in sorted(files):
            title, date, url = metadata[book_id]
            yield Book(book_id, title, date, url, read_pg19_book(files[book_id]))

    return books()


def read_pg19_book(path: Path) -> str:
    """One book's text as `pg19_folder` gives it (surrounding whitespace stripped)."""
    return path.read_text(encoding="utf-8").strip()


def pg19_book_files(root: str | os.PathLike, split: str) -> list[Path]:
    """The book files of `split`, sorted by id (the order of `pg19_folder`), after its layout checks;
    no text is read."""
    pg19_folder(root, split)  # raises on a bad layout; the generator it returns is not started
    files = _split_files(Path(root) / split)
    return [files[book_id] for book_id in sorted(files)]


# ---------------------------------------------------------------------------------------------------
# Any prepared TFDS text dataset.


def tfds_text(name: str, split: str, data_dir: str | os.PathLike | None = None,
              text_key: str = "book_text") -> Iterator[str]:
    """The `text_key` feature of each example of a TFDS dataset prepared on disk, as str, in the
    order of the prepared files (fixed by the files, so the same on every read).

    `name` may carry a config and version (`"pg19:0.1.1"`), `split` a slice (`"test[:10]"`). The
    dataset must already be prepared under `data_dir` (default: $TFDS_DATA_DIR or
    ~/tensorflow_datasets) in the `array_record` format, e.g. by `tfds build pg19
    --file_format=array_record` on a machine with TensorFlow (the `pg19` builder reads its GCS
    bucket through tf.io.gfile). Reading needs neither TensorFlow nor network; nothing is
    downloaded at run time. Errors are raised here, before iteration.
    """
    import tensorflow_datasets as tfds  # lazy: only this source needs it
    from tensorflow_datasets.core import constants

    where = os.fspath(data_dir) if data_dir is not None else f"{constants.get_default_data_dir()} (TFDS default)"
    not_prepared = (f"TFDS dataset {name!r} is not prepared under data_dir={where}; nothing is downloaded at "
                    f"run time: prepare it beforehand (e.g. `tfds build {name.split(':')[0]} --data_dir=... "
                    "--file_format=array_record`) or point data_dir at a prepared copy")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise FileNotFoundError(not_prepared + " (no builder of that name is registered either)") from None
    if not builder.is_prepared():
        raise FileNotFoundError(f"{not_prepared} (looked in {builder.data_dir})")
    features = builder.info.features
    if text_key not in features:
        raise ValueError(f"text_key={text_key!r}: not a feature of TFDS dataset {name!r}; "
                         f"features: {sorted(features.keys())}")
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)

    def texts() -> Iterator[str]:
        for i in range(len(source)):
            value = source[i][text_key]
            yield value.decode("utf-8") if isinstance(value, bytes) else str(value)

    return texts()


# ---------------------------------------------------------------------------------------------------
# One spelling for every source, as the programs' flags take it.

CORPUS_FORMS = ("'embedded', 'pg19:<folder>', 'tfds:<name>[#<text feature>]' (e.g. 'tfds:pg19#book_text') or "
                "'files:<glob>[#<json key>]' (e.g. 'files:/data/{split}/*.jsonl#text')")


def parse_corpus(spec: str, name: str = "corpus") -> tuple[str, str, str]:
    """(kind, where, key) of a corpus spec: ("embedded", "", ""), ("pg19", folder, ""),
    ("tfds", dataset name, text feature or "") or ("files", glob, json key or ""). Raises
    ValueError naming `name` and the accepted forms."""
    kind, _, where = spec.partition(":")
    head, _, key = where.partition("#")
    if kind == "embedded" and not where:
        return kind, "", ""
    if kind == "pg19" and where:
        return kind, where, ""
    if kind in ("tfds", "files") and head:
        return kind, head, key
    raise ValueError(f"{name}={spec!r}: expected {CORPUS_FORMS}")


def open_corpus(spec: str, split: str, *, data_dir: str | os.PathLike | None = None,
                text_key: str = "book_text") -> Iterator[str]:
    """The documents of `split` of the corpus named by `spec`: "embedded" (the pydoc corpus),
    "pg19:<folder>" (a local PG-19 copy), "tfds:<name>[#<feature>]" (a prepared TFDS dataset read
    by `tfds_text` with `data_dir`; its text feature is <feature>, default `text_key`) or
    "files:<glob>[#<key>]" (text and JSON-lines files, `ssmgate.tasks.text_files`; `{split}` in the glob
    is the split). Layout and preparation errors are raised here, before iteration."""
    _check_split(split)
    kind, where, key = parse_corpus(spec)
    if kind == "embedded":
        return iter(embedded_corpus(split))
    if kind == "pg19":
        return (book.text for book in pg19_folder(where, split))
    if kind == "tfds":
        return tfds_text(where, split, data_dir, key or text_key)
    return text_files.files_corpus(spec.partition(":")[2], split)
