"""The `files:` corpus: text and JSON-lines files in sorted path order, splits, keys and errors."""
import json
import os

import pytest

from ssmgate.data import pieces
from ssmgate.tasks import text_files as files
from ssmgate.tasks import text_corpus
from tests.data.conftest import JSONL, documents_in_order, write_corpus


def test_text_and_jsonl_documents_in_sorted_path_order(corpus_dir):
    got = list(text_corpus.open_corpus(f"files:{corpus_dir}/*", "train"))
    assert got == documents_in_order()
    only_jsonl = list(text_corpus.open_corpus(f"files:{corpus_dir}/*.jsonl", "train"))
    assert only_jsonl == JSONL["b.jsonl"] + JSONL["d.jsonl"]


def test_the_json_key_is_chosen_after_a_hash(tmp_path):
    root = write_corpus(tmp_path / "c", texts={}, jsonl={"x.jsonl": ["one", "two"]}, key="content")
    assert list(text_corpus.open_corpus(f"files:{root}/*.jsonl#content", "train")) == ["one", "two"]
    with pytest.raises(ValueError, match=r"x.jsonl \(line at byte 0\): expected a JSON object with a string under "
                                         r"'text'; found \['content', 'id'\]"):
        list(text_corpus.open_corpus(f"files:{root}/*.jsonl", "train"))


def test_bad_json_lines_name_the_file_and_byte(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl \(line at byte 15\): not a JSON object"):
        list(text_corpus.open_corpus(f"files:{tmp_path}/*.jsonl", "train"))


def test_split_field_in_the_glob(tmp_path):
    for split in ("train", "validation"):
        (tmp_path / split).mkdir()
        (tmp_path / split / "doc.txt").write_text(f"{split} text")
    spec = f"files:{tmp_path}/{{split}}/*.txt"
    assert list(text_corpus.open_corpus(spec, "validation")) == ["validation text"]
    assert list(text_corpus.open_corpus(spec, "train")) == ["train text"]
    with pytest.raises(FileNotFoundError, match=r"no file matches the glob '.*/test/\*\.txt' \(split 'test'\)"):
        text_corpus.open_corpus(spec, "test")
    with pytest.raises(ValueError, match=r"no \{split\} field, so it names the train split only, not 'validation'"):
        text_corpus.open_corpus(f"files:{tmp_path}/train/*.txt", "validation")


def test_a_glob_that_matches_nothing_is_an_error_before_reading(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"corpus='files:.*/nothing\*\.txt': no file matches"):
        text_corpus.open_corpus(f"files:{tmp_path}/nothing*.txt", "train")
    with pytest.raises(ValueError, match="expected 'embedded', 'pg19:<folder>'.*'files:<glob>"):
        text_corpus.open_corpus("files:", "train")


@pytest.mark.parametrize("n_ranges", [1, 2, 7, 40])
def test_byte_ranges_of_a_jsonl_file_give_every_line_once(corpus_dir, n_ranges):
    path = corpus_dir / "d.jsonl"
    size = os.path.getsize(path)
    bounds = [size * i // n_ranges for i in range(n_ranges + 1)]  # most cut inside a line
    docs = [d for a, b in zip(bounds, bounds[1:]) for d in files.jsonl_documents(path, "text", a, b)]
    assert docs == JSONL["d.jsonl"]


def test_pieces_of_any_size_read_the_corpus_in_order(corpus_dir):
    parts = pieces.listing(f"files:{corpus_dir}/*", "train")
    assert [p[0] for p, _ in parts] == ["text", "jsonl", "text", "jsonl", "text"]
    for target in (1, 100, 10_000):
        cut = pieces.cut(parts, target)
        assert [d for piece in cut for d in pieces.documents(piece)] == documents_in_order()
        assert json.loads(json.dumps(cut)) == cut  # a plan stores them as JSON
    assert len(pieces.cut(parts, 100)) > len(parts)  # the larger JSON-lines files were cut into ranges
