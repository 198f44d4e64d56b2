"""The data benchmark (ssmgate/bench/data.py) at a toy size: every part measured, temp data removed."""
import tempfile
from pathlib import Path

from ssmgate.bench import data as bench
from ssmgate.tasks import text_corpus


def test_the_synthetic_corpus_is_a_files_corpus(tmp_path):
    n = bench.make_corpus(tmp_path / "c", 0.3)
    docs = list(text_corpus.open_corpus(f"files:{tmp_path / 'c'}/*", "train"))
    assert 0.3 * bench.MB <= n <= 0.3 * bench.MB + 100_000 and sum(map(len, docs)) == n
    assert {p.suffix for p in (tmp_path / "c").iterdir()} == {".jsonl", ".txt"}


def test_a_toy_run_measures_every_part_and_cleans_up(tmp_path):
    r = bench.measure(0.2, 0.4, steps=10, batch=4, seq_len=32, workdir=str(tmp_path), log=lambda s: None)
    assert [t["tokens"] for t in r["tokenize"]] == [r["tokenize"][0]["tokens"]] * len(r["tokenize"])
    assert all(t["mb_per_s"] > 0 for t in r["tokenize"])
    assert [(row["corpus"], row["processes"]) for row in r["loader"]] == [("small", 1), ("small", 2), ("big", 1),
                                                                          ("big", 2)]
    assert all(row["tokens_per_s"] > 0 and row["x_p2_cpu"] > 0 for row in r["loader"])
    assert r["memory"]["big"]["peak_mb"] >= r["memory"]["big"]["rss_before_mb"] > 0
    assert r["memory"]["growth_mb"] == r["memory"]["big"]["peak_mb"] - r["memory"]["small"]["peak_mb"]
    assert list(tmp_path.iterdir()) == []  # corpora and shards deleted
    md = bench.markdown({**r, "date": "today", "cpu": "cpu", "cores": 2, "command": "python -m ssmgate.bench data"})
    assert "**Tokenization**" in md and "| corpus | process |" in md and "Peak RSS growth" in md
