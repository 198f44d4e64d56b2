"""Text-data layer of the LM pipeline: corpora (embedded, PG-19 folder, prepared TFDS), tokenizers
and packing into rows reproducible by (seed, step)."""
import sys
import types

import numpy as np
import pytest

from ssmgate.tasks import text_corpus as tc
from ssmgate.tasks import text_packing as tp
from ssmgate.tasks import tokenizers as tk

# ---------------------------------------------------------------------------------------------------
# Embedded corpus


def test_embedded_splits_are_disjoint_sorted_cover_and_pinned():
    from pydoc_data.topics import topics

    by_split = {s: tc.embedded_topics(s) for s in tc.SPLITS}
    names = [t for s in tc.SPLITS for t in by_split[s]]
    assert sorted(names) == sorted(topics) and len(set(names)) == len(names)  # a partition of the topics
    assert all(by_split[s] == sorted(by_split[s]) and by_split[s] for s in tc.SPLITS)
    assert len(by_split["train"]) >= 0.8 * len(topics)
    # The split is a pure function of the topic name: pinned so a change of hash is noticed (by name,
    # so another CPython's topic list, which may add or drop topics, still passes).
    for split, pinned in (("validation", ["binary", "context-managers", "identifiers", "shifting", "typesmapping",
                                          "typesmodules"]),
                          ("test", ["bltin-code-objects", "formatstrings", "numeric-types", "operator-summary"]),
                          ("train", ["assert", "async", "atom-identifiers"])):
        assert [tc.split_of_topic(t) for t in pinned] == [split] * len(pinned)
    for s in tc.SPLITS:
        docs = tc.embedded_corpus(s)
        assert docs == [topics[t] for t in by_split[s]] and docs == tc.embedded_corpus(s)
        assert all(isinstance(d, str) and d for d in docs)


def test_unknown_split_is_named():
    with pytest.raises(ValueError, match="'valid'"):
        tc.embedded_corpus("valid")
    with pytest.raises(ValueError, match="'dev'"):
        tc.pg19_folder(".", "dev")


# ---------------------------------------------------------------------------------------------------
# PG-19 folder

BOOKS = {"train": {10: "  Ten, the novel.\n", 2: "Deux — ünïcode 🙂\n"}, "validation": {7: "Seven."}, "test": {3: "Three"}}
META = ("10,The Tenth Book by A. Author,1890,http://www.gutenberg.org/ebooks/10\n"
        "2,Deux Livres by B,1901,http://www.gutenberg.org/ebooks/2\n"
        "7,Seven,1850,http://www.gutenberg.org/ebooks/7\n"
        "3,Three, Unquoted Comma,1777,http://www.gutenberg.org/ebooks/3\n")


def make_pg19(root, books=BOOKS, meta=META):
    root.mkdir()
    (root / "metadata.csv").write_text(meta, encoding="utf-8")
    for split, docs in books.items():
        (root / split).mkdir()
        for book_id, text in docs.items():
            (root / split / f"{book_id}.txt").write_text(text, encoding="utf-8")
    return root


def test_pg19_folder_reads_books_sorted_by_numeric_id(tmp_path):
    root = make_pg19(tmp_path / "pg19")
    train = list(tc.pg19_folder(root, "train"))
    assert [b.book_id for b in train] == [2, 10]  # numeric order, not "10" < "2"
    assert train[0] == tc.Book(2, "Deux Livres by B", "1901", "http://www.gutenberg.org/ebooks/2", "Deux — ünïcode 🙂")
    assert train[1].text == "Ten, the novel."  # stripped, as the TFDS pg19 builder does
    (test_book,) = tc.pg19_folder(root, "test")
    assert (test_book.title, test_book.publication_date) == ("Three, Unquoted Comma", "1777")


def test_pg19_metadata_header_row_accepted(tmp_path):
    root = make_pg19(tmp_path / "pg19", meta="_id,short_book_title,publication_date,url\n" + META)
    assert [b.title for b in tc.pg19_folder(root, "validation")] == ["Seven"]


def test_pg19_layout_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        tc.pg19_folder(tmp_path / "nowhere", "train")
    root = make_pg19(tmp_path / "no_meta")
    (root / "metadata.csv").unlink()
    with pytest.raises(FileNotFoundError, match="metadata.csv"):
        tc.pg19_folder(root, "train")
    partial = make_pg19(tmp_path / "partial", books={"test": BOOKS["test"]})  # test/ only: no train/
    assert [b.book_id for b in tc.pg19_folder(partial, "test")] == [3]  # listed-but-absent not checkable
    with pytest.raises(FileNotFoundError, match=r"partial/train.*splits present: \['test'\]"):
        tc.pg19_folder(partial, "train")
    absent = make_pg19(tmp_path / "absent", meta=META + "99,Lost Book,1900,http://x/99\n")
    with pytest.raises(FileNotFoundError, match=r"book 99 .*absent.*absent/train/99\.txt"):
        tc.pg19_folder(absent, "test")
    stray = make_pg19(tmp_path / "stray")
    (stray / "test" / "55.txt").write_text("no metadata")
    with pytest.raises(ValueError, match=r"stray/test/55\.txt: book 55 is not listed"):
        tc.pg19_folder(stray, "test")
    bad_meta = make_pg19(tmp_path / "bad_meta", meta=META + "8,Too Few Fields\n")
    with pytest.raises(ValueError, match=r"metadata.csv:5: expected 4 fields"):
        tc.pg19_folder(bad_meta, "train")


# ---------------------------------------------------------------------------------------------------
# Prepared TFDS dataset (array_record, no TensorFlow)

TFDS_TEXTS = {"train": ["alpha", "βeta 🙂", "gamma"], "test": ["delta"]}


def make_tfds(data_dir):
    import tensorflow_datasets as tfds

    with tfds.core.registered.skip_registration():  # read back from files, as a dataset prepared elsewhere
        class TinyBooks(tfds.core.GeneratorBasedBuilder):
            # A one-part module name keeps tfds from probing this test package for checksum files,
            # a probe that imports `importlib_resources` (absent on Python >= 3.9 installs).
            __module__ = "tiny_books"
            VERSION = tfds.core.Version("1.0.0")

            def _info(self):
                return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                    {"book_text": tfds.features.Text(), "book_id": np.int32}))

            def _split_generators(self, dl_manager):
                return {split: self._generate_examples(texts) for split, texts in TFDS_TEXTS.items()}

            def _generate_examples(self, texts):
                for i, text in enumerate(texts):
                    yield i, {"book_text": text, "book_id": i}

    TinyBooks(data_dir=str(data_dir), file_format="array_record").download_and_prepare()


def test_tfds_text_reads_prepared_array_record_dataset(tmp_path):
    make_tfds(tmp_path / "tfds")
    train = list(tc.tfds_text("tiny_books", "train", data_dir=tmp_path / "tfds"))
    assert sorted(train) == sorted(TFDS_TEXTS["train"]) and all(isinstance(t, str) for t in train)
    assert list(tc.tfds_text("tiny_books", "train", data_dir=tmp_path / "tfds")) == train  # same order each read
    assert list(tc.tfds_text("tiny_books", "test", data_dir=tmp_path / "tfds")) == ["delta"]
    assert len(list(tc.tfds_text("tiny_books", "train[1:]", data_dir=tmp_path / "tfds"))) == 2
    with pytest.raises(ValueError, match=r"text_key='text'.*\['book_id', 'book_text'\]"):
        tc.tfds_text("tiny_books", "train", data_dir=tmp_path / "tfds", text_key="text")


def test_tfds_text_not_prepared_says_where_and_downloads_nothing(tmp_path):
    empty = tmp_path / "empty"
    for name in ("tiny_books", "pg19"):  # unregistered and registered builders alike
        with pytest.raises(FileNotFoundError, match=rf"{name}.*{empty}.*nothing is downloaded"):
            tc.tfds_text(name, "test", data_dir=empty)
    assert not empty.exists()


# ---------------------------------------------------------------------------------------------------
# Tokenizers

TEXTS = ["", "hello", "a\x00b\n\tc", "naïve café — 日本語 🙂", "\U0010ffff"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trip(text):
    tok = tk.ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.shape == (len(text.encode("utf-8")),)
    assert ids.size == 0 or (ids.min() >= 0 and ids.max() < 256)
    assert tok.decode(ids) == text


def test_byte_tokenizer_specials_and_bad_ids():
    tok = tk.ByteTokenizer()
    assert (tok.vocab_size, tok.eos_id, tok.pad_id) == (258, 256, 257)
    assert tok.decode([104, 256, 105, 257]) == "hi"  # specials dropped
    assert tok.decode([0xE6, 0x97]) == "\ufffd"  # a truncated UTF-8 sequence, as a model may sample
    with pytest.raises(ValueError, match="258"):
        tok.decode([1, 258])
    with pytest.raises(ValueError, match="-1"):
        tok.decode(np.array([-1]))


def test_load_tokenizer_dispatch_and_errors(tmp_path):
    assert isinstance(tk.load_tokenizer(None), tk.ByteTokenizer)
    assert isinstance(tk.load_tokenizer("byte"), tk.ByteTokenizer)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        tk.load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "vocab.txt").write_text("x")
    with pytest.raises(ValueError, match=r"'\.txt'"):
        tk.load_tokenizer(tmp_path / "vocab.txt")


@pytest.mark.parametrize("filename, module", [("tokenizer.json", "tokenizers"), ("tok.model", "sentencepiece")])
def test_trained_tokenizer_without_its_package_names_pip_package(tmp_path, monkeypatch, filename, module):
    (tmp_path / filename).write_text("{}")
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail, installed or not
    with pytest.raises(ImportError, match=rf"pip install {module}"):
        tk.load_tokenizer(tmp_path / filename)


def test_hf_adapter_finds_eos_from_tokenizer_config(tmp_path, monkeypatch):
    vocab = {"a": 0, "b": 1, "</s>": 2, "<|end_of_text|>": 3}

    class FakeTokenizer:  # the slice of the `tokenizers` API the adapter uses
        @staticmethod
        def from_file(path):
            return FakeTokenizer()

        def get_vocab_size(self, with_added_tokens):
            return len(vocab)

        def token_to_id(self, token):
            return vocab.get(token)

        def encode(self, text, add_special_tokens):
            assert add_special_tokens is False
            return types.SimpleNamespace(ids=[vocab[c] for c in text])

    monkeypatch.setitem(sys.modules, "tokenizers", types.SimpleNamespace(Tokenizer=FakeTokenizer))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert tk.load_tokenizer(tmp_path / "tokenizer.json").eos_id == 3  # first known candidate
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": {"content": "</s>"}}')
    tok = tk.load_tokenizer(tmp_path / "tokenizer.json")
    assert (tok.eos_id, tok.vocab_size, tok.encode("ab").tolist()) == (2, 4, [0, 1])
    with pytest.raises(ValueError, match="'<eot>'"):
        tk.load_tokenizer(tmp_path / "tokenizer.json", eos_token="<eot>")


# ---------------------------------------------------------------------------------------------------
# Packing


def test_token_stream_puts_eos_after_every_document():
    tok = tk.ByteTokenizer()
    stream = tp.token_stream(["ab", "", "é"], tok)
    assert stream.dtype == np.int32
    assert stream.tolist() == [97, 98, 256, 256, 0xC3, 0xA9, 256]
    assert tp.token_stream(["ab", "", "é"], tok, max_tokens=4).tolist() == [97, 98, 256, 256]


def test_token_stream_cache_is_reused_and_checked(tmp_path):
    tok = tk.ByteTokenizer()
    path = tmp_path / "cache" / "stream.npy"
    made = tp.token_stream(["abc", "de"], tok, cache_path=path)

    def must_not_read():
        raise AssertionError("the cache should have been used")
        yield

    cached = tp.token_stream(must_not_read(), tok, cache_path=path)
    assert isinstance(cached, np.memmap) and cached.tolist() == made.tolist()
    with pytest.raises(ValueError, match="max_tokens=3"):
        tp.token_stream(["abc"], tok, max_tokens=3, cache_path=path)
    other = types.SimpleNamespace(name="hf:x", vocab_size=258, eos_id=256, encode=tok.encode)
    with pytest.raises(ValueError, match="hf:x"):
        tp.token_stream(["abc"], other, cache_path=path)


def test_too_short_stream_is_an_error():
    assert tp.n_rows(np.arange(9, dtype=np.int32), 8) == 1
    with pytest.raises(ValueError, match=r"8 tokens; seq_len=8 needs at least seq_len \+ 1 = 9"):
        tp.batch_at(np.arange(8, dtype=np.int32), 8, 2, 0, 0)
    with pytest.raises(ValueError, match="stream"):
        tp.n_rows(np.zeros((3, 4), np.int32), 2)


SEQ_LEN = 4
STREAM = np.arange(10 * SEQ_LEN + 3, dtype=np.int32)  # 10 rows; token value = its position


def row_ids(batch):
    return (np.asarray(batch.inputs)[:, 0] // SEQ_LEN).tolist()


def test_batch_is_a_function_of_seed_and_step():
    a = tp.batch_at(STREAM, SEQ_LEN, 3, seed=7, step=5)
    tp._epoch_order.cache_clear()  # a fresh process (a resumed run) sees the same batch
    b = tp.batch_at(STREAM, SEQ_LEN, 3, seed=7, step=5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert row_ids(tp.batch_at(STREAM, SEQ_LEN, 3, seed=7, step=6)) != row_ids(a)
    orders = {tuple(row_ids(tp.batch_at(STREAM, SEQ_LEN, 10, seed=s, step=0))) for s in range(5)}
    assert len(orders) > 1  # the seed changes the order


def test_batch_rows_are_shifted_stream_slices():
    batch = tp.batch_at(STREAM, SEQ_LEN, 4, seed=0, step=2)
    assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (4, SEQ_LEN)
    assert (batch.inputs.dtype, batch.targets.dtype, batch.mask.dtype) == (np.int32, np.int32, np.float32)
    np.testing.assert_array_equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    np.testing.assert_array_equal(batch.targets[:, -1], batch.inputs[:, -1] + 1)  # consecutive stream tokens
    assert np.all(batch.inputs % SEQ_LEN == np.arange(SEQ_LEN)) and np.all(batch.mask == 1)


def test_every_row_used_once_per_epoch_with_wraparound():
    n, batch, steps = 10, 3, 10  # 30 positions = 3 epochs; steps 3 and 6 straddle epoch boundaries
    seen = [r for k in range(steps) for r in row_ids(tp.batch_at(STREAM, SEQ_LEN, batch, seed=1, step=k))]
    epochs = [seen[e * n:(e + 1) * n] for e in range(3)]
    assert all(sorted(ep) == list(range(n)) for ep in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]  # a new permutation each epoch
    big = tp.batch_at(STREAM, SEQ_LEN, 25, seed=1, step=0)  # batch > rows: epochs 0, 1 and half of 2
    assert row_ids(big) == seen[:25]
    # Pinned: the order is part of a run's definition (a resumed run must see the same batches).
    assert seen[:15] == [8, 4, 7, 0, 1, 2, 5, 9, 6, 3, 7, 2, 4, 6, 1]


def test_eval_rows_cover_every_target_once_in_order():
    rows = tp.eval_rows(STREAM, SEQ_LEN)
    assert rows.inputs.shape == (10, SEQ_LEN) and np.all(rows.mask == 1)
    np.testing.assert_array_equal(rows.targets.reshape(-1), STREAM[1:1 + 10 * SEQ_LEN])
    np.testing.assert_array_equal(rows.inputs.reshape(-1), STREAM[:10 * SEQ_LEN])
    batches = list(tp.eval_batches(STREAM, SEQ_LEN, 4))
    assert len(batches) == 3 and all(b.inputs.shape == (4, SEQ_LEN) for b in batches)
    assert batches[-1].mask.sum(axis=1).tolist() == [SEQ_LEN, SEQ_LEN, 0, 0]  # padding rows unscored
    scored = np.concatenate([b.targets[b.mask > 0] for b in batches])
    np.testing.assert_array_equal(scored, STREAM[1:1 + 10 * SEQ_LEN])


def test_embedded_corpus_to_batches_end_to_end():
    tok = tk.load_tokenizer(None)
    docs = tc.embedded_corpus("validation")
    stream = tp.token_stream(docs, tok)
    assert len(stream) == sum(len(d.encode("utf-8")) + 1 for d in docs)
    assert int((stream == tok.eos_id).sum()) == len(docs)
    first_eos = int(np.argmax(stream == tok.eos_id))
    assert tok.decode(stream[:first_eos]) == docs[0]
    batch = tp.batch_at(stream, 128, 8, seed=0, step=3)
    assert batch.inputs.shape == (8, 128) and int(batch.inputs.max()) < tok.vocab_size


def test_the_pg19_folder_builder_prepares_what_the_folder_reader_reads(tmp_path):
    from ssmgate.tasks import pg19_builder

    root = make_pg19(tmp_path / "pg19")
    spec = pg19_builder.prepare(root, tmp_path / "tfds")
    assert spec == "tfds:pg19_folder#book_text"
    for split in tc.SPLITS:
        direct = sorted(b.text for b in tc.pg19_folder(root, split))
        assert sorted(tc.open_corpus(spec, split, data_dir=tmp_path / "tfds")) == direct
    with pytest.raises(ValueError, match="root=<the local PG-19 folder> is needed"):
        pg19_builder.Pg19Folder(data_dir=str(tmp_path / "other"), file_format="array_record").download_and_prepare()
