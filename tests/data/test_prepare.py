"""`prepare`: token shards equal to text_packing.token_stream for any worker count, resumable, and
refusing a directory prepared for something else."""
import json

import numpy as np
import pytest

from ssmgate.data import __main__ as cli, prepare as prep, shards
from ssmgate.data.store import TokenStore
from ssmgate.tasks import text_corpus, text_packing, tokenizers
from tests.tasks.test_text_data import make_pg19

BYTE = tokenizers.ByteTokenizer()
SMALL = dict(shard_bytes=200, record_tokens=64, log=None)  # many shards, rows across records and shards


def expected(spec, split="train", max_tokens=None, **kw):
    return text_packing.token_stream(text_corpus.open_corpus(spec, split, **kw), BYTE, max_tokens=max_tokens)


def test_one_worker_gives_the_packers_stream(corpus_dir, tmp_path):
    spec = f"files:{corpus_dir}/*"
    store = prep.prepare(spec, "train", tmp_path / "out", workers=1, **SMALL)
    want = expected(spec)
    assert len(store) == len(want) and store.read(0, len(store)).tolist() == want.tolist()
    manifest = json.loads((tmp_path / "out" / shards.MANIFEST).read_text())
    assert manifest["complete"] and manifest["tokenizer"] == "byte" and manifest["vocab_size"] == 258
    assert manifest["eos_id"] == 256 and manifest["dtype"] == "uint16" and len(manifest["shards"]) > 5
    assert sum(s["tokens"] for s in manifest["shards"]) == manifest["n_tokens"] == len(want)


def test_three_workers_give_the_same_stream_also_with_a_token_budget(tmp_path):
    want = expected("embedded")
    store = prep.prepare("embedded", "train", tmp_path / "all", workers=3, shard_bytes=40_000, log=None)
    np.testing.assert_array_equal(store.read(0, len(store)), want)
    assert len(json.loads((tmp_path / "all" / shards.PLAN).read_text())["pieces"]) >= 6
    # A budget inside the fourth shard: the prepare stops early, the stream is cut exactly there.
    budget = 123_457
    cut = prep.prepare("embedded", "train", tmp_path / "cut", workers=3, shard_bytes=40_000, max_tokens=budget,
                       log=None)
    np.testing.assert_array_equal(cut.read(0, len(cut)), expected("embedded", max_tokens=budget))
    one = prep.prepare("embedded", "train", tmp_path / "one", workers=1, shard_bytes=40_000, max_tokens=budget,
                       log=None)
    np.testing.assert_array_equal(one.read(0, len(one)), cut.read(0, len(cut)))
    used = len(json.loads((tmp_path / "one" / shards.MANIFEST).read_text())["shards"])
    assert len(list((tmp_path / "one").glob("*.done.json"))) == used < 6  # the later shards were never read


def test_pg19_folder_source(tmp_path):
    root = make_pg19(tmp_path / "pg19")
    store = prep.prepare(f"pg19:{root}", "train", tmp_path / "out", workers=1, **SMALL)
    assert store.read(0, len(store)).tolist() == expected(f"pg19:{root}").tolist()


def test_a_killed_prepare_redoes_only_its_unfinished_shards(corpus_dir, tmp_path, monkeypatch):
    spec, out = f"files:{corpus_dir}/*", tmp_path / "out"
    calls = []
    real = prep.tokenize_piece

    def dies_in_shard_4(*args):
        calls.append(args[1])
        if args[1] == 4:  # dies mid-shard: its first document read, the next one fails
            args = (*args[:2], [args[2][0], ["text", str(tmp_path / "vanished.txt")]], *args[3:])
        return real(*args)

    monkeypatch.setattr(prep, "tokenize_piece", dies_in_shard_4)
    with pytest.raises(FileNotFoundError, match="vanished.txt"):
        prep.prepare(spec, "train", out, workers=1, **SMALL)
    assert calls == [0, 1, 2, 3, 4] and not (out / shards.MANIFEST).exists()
    assert not list(out.glob("*.tmp-*"))  # the interrupted shard left nothing half-written

    # A shard written but never marked done (killed between the two) is redone as well.
    (out / shards.done_name(1)).unlink()
    kept = {i: (out / shards.shard_name(i)).stat().st_mtime_ns for i in (0, 2, 3)}
    calls.clear()
    monkeypatch.setattr(prep, "tokenize_piece", lambda *a: calls.append(a[1]) or real(*a))
    store = prep.prepare(spec, "train", out, workers=1, **SMALL)
    n = len(json.loads((out / shards.PLAN).read_text())["pieces"])
    assert calls == [1, *range(4, n)]
    assert {i: (out / shards.shard_name(i)).stat().st_mtime_ns for i in (0, 2, 3)} == kept
    assert store.read(0, len(store)).tolist() == expected(spec).tolist()
    calls.clear()
    prep.prepare(spec, "train", out, workers=1, **SMALL)  # complete: opened, nothing tokenized
    assert calls == []


def test_a_directory_prepared_for_something_else_is_refused(corpus_dir, tmp_path, capsys):
    out = tmp_path / "out"
    prep.prepare("embedded", "train", out, workers=1, max_tokens=1000, log=None)
    for kw, what in ((dict(corpus="embedded", max_tokens=2000), "max_tokens=1000 (not 2000)"),
                     (dict(corpus=f"files:{corpus_dir}/*", max_tokens=1000), "corpus='embedded' (not 'files:"),
                     (dict(corpus="embedded", split="validation", max_tokens=1000), "split='train'")):
        with pytest.raises(prep.PrepareMismatch, match=what.replace("(", r"\(").replace(")", r"\)")) as e:
            prep.prepare(kw.pop("corpus"), kw.pop("split", "train"), out, workers=1, log=None, **kw)
        assert "\n" not in str(e.value) and "delete it or choose another --out" in str(e.value)
    # The same corpus spec whose files changed since.
    prep.prepare(f"files:{corpus_dir}/*", "train", tmp_path / "files", workers=1, log=None)
    (corpus_dir / "f.txt").write_text("new")
    with pytest.raises(prep.PrepareMismatch, match="the corpus's file listing: digest"):
        prep.prepare(f"files:{corpus_dir}/*", "train", tmp_path / "files", workers=1, log=None)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(prep.PrepareMismatch, match="not empty and holds no plan.json"):
        prep.prepare("embedded", "train", tmp_path / "other", workers=1, log=None)
    # On the command line: one line on stderr, exit status 2.
    assert cli.main(["prepare", "--corpus=embedded", f"--out={out}", "--max_tokens=5", "--workers=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out}: already prepared with max_tokens=1000 (not 5)") and err.count("\n") == 1


def test_the_command_line_prepares_and_reopens(tmp_path, capsys):
    args = ["prepare", "--corpus=embedded", "--split=validation", f"--out={tmp_path / 'v'}", "--workers=1"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "[prepare] shard 1/1 (100%)" in out and f"{len(expected('embedded', 'validation')):,} tokens ready" in out
    assert cli.main(args) == 0 and "[prepare] shard" not in capsys.readouterr().out  # done already
    assert cli.main(["prepare", f"--corpus=files:{tmp_path}/none*.txt", f"--out={tmp_path / 'n'}"]) == 2
    assert "no file matches the glob" in capsys.readouterr().err


def test_an_unfinished_directory_is_not_opened(tmp_path):
    with pytest.raises(FileNotFoundError, match="no manifest.json: not a prepared token directory"):
        TokenStore(tmp_path)


def test_a_prepared_tfds_split_in_example_ranges(tmp_path):
    from tests.tasks.test_text_data import make_tfds

    make_tfds(tmp_path / "tfds")
    spec, kw = "tfds:tiny_books#book_text", dict(data_dir=tmp_path / "tfds")
    store = prep.prepare(spec, "train", tmp_path / "out", workers=1, shard_bytes=1, record_tokens=4, log=None, **kw)
    assert len(json.loads((tmp_path / "out" / shards.PLAN).read_text())["pieces"]) == 3  # one example each
    assert store.read(0, len(store)).tolist() == expected(spec, **kw).tolist()
