"""Faults in prepared token shards: a shard cut short or with one flipped bit is found by the next
`prepare` (sizes and CRC-32s in the manifest) and tokenized again, giving the same stream; a
reader names the file and the record it cannot read, also from grain's prefetch thread; a full disk
while preparing is one line, and the same command then finishes. The `files:` corpus refuses a
symbolic link to nothing and keeps a file's CRLF line ends."""
import json
import os

import numpy as np
import pytest

from ssmgate.data import __main__ as cli, prepare as prep, shards
from ssmgate.data.loader import Loader
from ssmgate.data.store import ShardReadError, TokenStore
from ssmgate.tasks import text_files

SMALL = dict(workers=1, shard_bytes=600, record_tokens=64, log=None)  # several shards of several records


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(4):
        (root / f"doc{i}.txt").write_text(f"document {i}: " + "some words of text, " * (20 + 7 * i))
    return f"files:{root}/*.txt"


def prepared(corpus, out):
    store = prep.prepare(corpus, "train", out, **SMALL)
    return store.read(0, len(store))


def manifest(out):
    return json.loads((out / shards.MANIFEST).read_text())


def test_a_damaged_shard_is_found_and_tokenized_again_the_others_kept(corpus, tmp_path):
    out = tmp_path / "out"
    stream = prepared(corpus, out)
    entries = manifest(out)["shards"]
    assert len(entries) >= 3 and all(e["bytes"] == os.path.getsize(out / e["name"]) for e in entries)
    cut, flipped = out / entries[1]["name"], out / entries[2]["name"]
    os.truncate(cut, entries[1]["bytes"] // 2)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 3] ^= 0x20
    flipped.write_bytes(bytes(data))
    flipped_crc = shards.checksum(flipped)["crc32"]
    with pytest.raises(ShardReadError, match=rf"{cut}: {entries[1]['bytes'] // 2:,} bytes, {entries[1]['bytes']:,} "
                                             r"when it was prepared; `python -m ssmgate.data prepare` with the"):
        TokenStore(out)
    kept = {e["name"]: os.stat(out / e["name"]).st_mtime_ns for e in entries}
    logged = []
    again = prep.prepare(corpus, "train", out, **dict(SMALL, log=logged.append))
    np.testing.assert_array_equal(again.read(0, len(again)), stream)
    redone = [line for line in logged if "tokenizing it again" in line]
    assert redone == [f"[prepare] {cut}: {entries[1]['bytes'] // 2:,} bytes, {entries[1]['bytes']:,} when it was "
                      "prepared; tokenizing it again", f"[prepare] {flipped}: CRC-32 {flipped_crc}, "
                      f"{entries[2]['crc32']} when it was prepared; tokenizing it again"]
    assert [n for n, t in kept.items() if os.stat(out / n).st_mtime_ns != t] == [cut.name, flipped.name]
    assert manifest(out)["shards"] == entries


def test_a_shard_that_does_not_read_back_is_named_with_its_record_also_through_the_loader(corpus, tmp_path):
    out = tmp_path / "out"
    prepared(corpus, out)
    victim = out / manifest(out)["shards"][0]["name"]
    data = bytearray(victim.read_bytes())
    data[100] ^= 0x10  # inside the first chunk's header: ArrayRecord's own hash fails, the size is unchanged
    victim.write_bytes(bytes(data))
    store = TokenStore(out)
    with pytest.raises(ShardReadError, match=rf"^{victim}: cannot read record 0 \(tokens 0..63 of this shard\) "
                                             r"\(Corrupted Riegeli/records file: chunk header hash mismatch"):
        store.read(0, 10)
    loader = Loader(store, seq_len=16, batch=4, seed=0)  # grain reads on its prefetch thread
    with pytest.raises(ShardReadError, match=rf"^{victim}: cannot read record"):
        for step in range(len(store) // 64):
            loader(step)


def test_a_manifest_from_before_checksums_is_checked_by_reading_and_then_gets_them(corpus, tmp_path):
    out = tmp_path / "out"
    stream = prepared(corpus, out)
    old = manifest(out)
    for path in [out / shards.MANIFEST, *out.glob("*.done.json")]:
        record = json.loads(path.read_text())
        for entry in record.get("shards", [record]):
            entry.pop("bytes"), entry.pop("crc32")
        path.write_text(json.dumps(record))
    again = prep.prepare(corpus, "train", out, **SMALL)
    np.testing.assert_array_equal(again.read(0, len(again)), stream)
    assert manifest(out) == old


def test_a_full_disk_while_preparing_is_one_line_and_the_same_command_finishes(corpus, tmp_path, monkeypatch,
                                                                              capsys):
    out = tmp_path / "out"
    want = prepared(corpus, tmp_path / "ref")
    real = shards.ArrayRecordWriter
    opened = []

    class FullAtThirdShard:  # ArrayRecord's writer reports the OS error as text in a RuntimeError
        def __init__(self, path, options):
            opened.append(path)
            self.w = real(path, options)

        def write(self, data):
            if len(opened) == 3:
                raise RuntimeError(f"write() failed: No space left on device; writing {opened[-1]}; at byte 0")
            self.w.write(data)

        def close(self):
            self.w.close()
    monkeypatch.setattr(shards, "ArrayRecordWriter", FullAtThirdShard)
    args = ["prepare", f"--corpus={corpus}", f"--out={out}", "--workers=1", f"--shard_mb={600 / (1 << 20)}"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write the shard {out}/shard-00002.array_record: No "
                                               "space left on device (ENOSPC); the shards finished before are intact")
    assert sorted(p.name for p in out.glob("*.done.json")) == ["shard-00000.done.json", "shard-00001.done.json"]
    monkeypatch.setattr(shards, "ArrayRecordWriter", real)
    assert cli.main(args) == 0
    capsys.readouterr()
    store = TokenStore(out)
    assert len(store) == len(want)  # the reference used records of 64 tokens, this one the default: same tokens
    np.testing.assert_array_equal(store.read(0, len(store)), want)


def test_prepare_into_an_existing_file_is_one_line(tmp_path, corpus, capsys):
    (tmp_path / "a_file").write_text("x")
    assert cli.main(["prepare", f"--corpus={corpus}", f"--out={tmp_path / 'a_file'}", "--workers=1"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'a_file'}: a file, not a folder; expected a new folder "
                                       "or one that a prepare started\n")


def test_files_refuses_a_dangling_symlink_and_keeps_crlf(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"line one\r\nline two\r\n")
    os.symlink(tmp_path / "gone.txt", tmp_path / "b.txt")
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/b.txt is a symbolic link to {tmp_path}/gone.txt, which "
                                                r"does not exist \(1 such match\(es\)"):
        text_files.list_files(f"{tmp_path}/*.txt", "train")
    (tmp_path / "b.txt").unlink()
    assert list(text_files.files_corpus(f"{tmp_path}/*.txt", "train")) == ["line one\r\nline two\r\n"]
