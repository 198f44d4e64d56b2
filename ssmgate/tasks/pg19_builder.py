"""A TFDS builder of its own for PG-19 in a local folder (metadata.csv + train/ validation/ test/
of <book_id>.txt), preparing the `array_record` files that `text_corpus.tfds_text` reads, with
neither TensorFlow nor network:

    python -m ssmgate.tasks.pg19_builder --root=/data/pg19 --data_dir=/data/tfds
    ... then --lm_corpus=tfds:pg19_folder#book_text --lm_tfds_data_dir=/data/tfds (or pg19:/data/pg19 directly)

The books are read by `text_corpus.pg19_folder`, so the layout checks and the text (stripped, as the
official `pg19` builder does) are the same as the direct reader's; the features are the official
builder's (book_text, book_id, book_title, publication_date, url). Splits present in the folder are
prepared; a partial copy (test/ and validation/ only) is fine.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from absl import app, flags

from ssmgate.tasks import text_corpus

NAME = "pg19_folder"


class Pg19Folder(tfds.core.GeneratorBasedBuilder):
    # A one-part module name keeps TFDS from probing ssmgate's package for checksum files, a probe
    # that imports `importlib_resources` (not installed on Python >= 3.9).
    __module__ = NAME
    VERSION = tfds.core.Version("1.0.0")

    def __init__(self, *, root: str | None = None, **kwargs):
        self._root = None if root is None else Path(root)
        super().__init__(**kwargs)

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, description="PG-19 books from a local folder", features=
                                     tfds.features.FeaturesDict({"book_text": tfds.features.Text(),
                                                                 "book_id": np.int64,
                                                                 "book_title": tfds.features.Text(),
                                                                 "publication_date": tfds.features.Text(),
                                                                 "url": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        if self._root is None:
            raise ValueError(f"{NAME}: root=<the local PG-19 folder> is needed to prepare the dataset")
        splits = [s for s in text_corpus.SPLITS if (self._root / s).is_dir()]
        if not splits:
            raise FileNotFoundError(f"{self._root}: none of {', '.join(text_corpus.SPLITS)}/ found")
        return {s: self._generate_examples(text_corpus.pg19_folder(self._root, s)) for s in splits}

    def _generate_examples(self, books):
        for b in books:
            yield b.book_id, {"book_text": b.text, "book_id": b.book_id, "book_title": b.title,
                              "publication_date": b.publication_date, "url": b.url}


def prepare(root, data_dir) -> str:
    """Prepares the dataset from `root` under `data_dir`; returns the --lm_corpus spelling that reads it."""
    Pg19Folder(root=root, data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return f"tfds:{NAME}#book_text"


def main(argv):
    del argv
    if not flags.FLAGS.root or not flags.FLAGS.data_dir:
        raise app.UsageError("--root and --data_dir are required")
    spec = prepare(flags.FLAGS.root, flags.FLAGS.data_dir)
    print(f"[pg19_builder] prepared {NAME} under {flags.FLAGS.data_dir}: use --lm_corpus={spec} "
          f"--lm_tfds_data_dir={flags.FLAGS.data_dir}")


if __name__ == "__main__":  # the flags exist only for this command, not for importers
    flags.DEFINE_string("root", None, "The local PG-19 folder (metadata.csv, train/ validation/ test/).")
    flags.DEFINE_string("data_dir", None, "Where to write the TFDS dataset.")
    app.run(main)
