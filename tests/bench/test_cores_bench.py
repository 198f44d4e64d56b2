"""The core benchmark runs end to end on a tiny size and writes what it promises."""
import pytest

from ssmgate.bench import cores as bench

TINY = (1, 16, 2, 4, 4, 1, 1)  # b, t, h, p, n, g, r
CHUNKS = {core: [8] for core in bench.registry.benchmarked()}


@pytest.mark.parametrize("core", ["scalar_decay", "rotation", "damped"])
def test_bench_rows(core):
    rows = bench.bench_core(core, TINY, peak=1e9, chunk_sizes=CHUNKS, reps=1, max_seconds=1.0, log=lambda s: None)
    algorithms = [r["algorithm"] for r in rows]
    expected = list(bench.cpu_algorithms(core))
    assert sorted(set(algorithms)) == sorted(expected)
    assert len(rows) == 2 * len(expected)  # fwd and fwd+bwd each
    for row in rows:
        assert row["rel_err"] < 1e-5, row
        assert row["seconds"] > 0 and row["flops"] > 0
        if row["algorithm"] == "sequential":
            assert row["speedup_vs_sequential"] == 1.0
        assert bench.format_row(row).startswith(core)


def test_flop_count_chunked_formula():
    b, t, h, p, n, g, r, q = 2, 128, 4, 8, 16, 1, 2, 32
    got = bench.flop_count("scalar_decay", "chunked", q, b, t, h, p, n, g, r)
    assert got == 2 * b * t * (q * n * g + q * h * p + 2 * h * p * n)
    # rotation pays per-head C B^T on its 2r rotated channels
    rot = bench.flop_count("rotation", "chunked", q, b, t, h, p, n, g, r)
    assert rot - got == 2 * b * t * q * (2 * r * h + (n - 2 * r) * g - n * g)
    # damped without pairs is the scalar-decay SSD; its pairs' transports grow with q^2 per chunk
    assert bench.flop_count("damped", "chunked", q, b, t, h, p, n, g, 0) == got
    dmp = [bench.flop_count("damped", "chunked", c, b, t, h, p, n, g, r) for c in (8, 16, 32)]
    assert dmp[0] < dmp[1] < dmp[2] and dmp[2] - dmp[1] > dmp[1] - dmp[0]


def test_markdown_and_docs_block(tmp_path):
    rows = bench.bench_core("scalar_decay", TINY, peak=1e9, chunk_sizes=CHUNKS, reps=1, max_seconds=1.0,
                            log=lambda s: None)
    result = {"device": "cpu:0", "cpu": "test", "cores": 2, "jax": "x", "matmul_peak_flops": 1e9,
              "command": "python -m ssmgate.bench cores", "rows": rows,
              "shape": dict(zip("b t h p n g r".split(), TINY))}
    md = bench.markdown_tables(result)
    assert md.count("\n| scalar_decay |") == len(rows)
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- bench:cores -->\nold\n<!-- /bench:cores -->\noutro\n")
    bench.update_docs(str(doc), md)
    text = doc.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("outro\n") and md in text
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no '<!-- bench:cores -->'"):
        bench.update_docs(str(doc), md)


def test_auto_table_measures_every_width_and_length_class(monkeypatch):
    """One entry per (width class, length class), each at its own measured shape, whose choices are
    the minima of its timings and which `auto.choose` reads back."""
    from ssmgate.cores import auto
    monkeypatch.setattr(bench, "AUTO_CLASSES", ((8, 8), (None, 16)))
    monkeypatch.setattr(bench, "AUTO_WIDTHS", ((8, (2, 1, 2, 4)), (None, None)))
    table = bench.measure_auto_table(["scalar_decay"], TINY, CHUNKS, reps=1, max_seconds=1.0, log=lambda s: None)
    entries = table["scalar_decay"]
    assert [(e["max_state"], e["max_t"]) for e in entries] == [(8, 8), (8, None), (None, 8), (None, None)]
    assert [e["measured_shape"] for e in entries] == [{"b": 2, "h": 1, "p": 2, "n": 4}] * 2 + \
        [{"b": 1, "h": 2, "p": 4, "n": 4}] * 2
    for e in entries:
        for kind, column in (("forward", "fwd_seconds"), ("train", "train_seconds")):
            best = min(e["timings"], key=lambda x: x[column])
            assert e[kind] == {"algorithm": best["algorithm"], "chunk_size": best["chunk_size"]}
    monkeypatch.setattr(auto, "load_table", lambda: {"cpu": table})
    want = lambda e: ((e["forward"]["algorithm"], e["forward"]["chunk_size"]),
                      (e["train"]["algorithm"], e["train"]["chunk_size"]))
    assert auto.choose("scalar_decay", 5, 8, backend="cpu") == want(entries[0])
    assert auto.choose("scalar_decay", 9, 16, backend="cpu") == want(entries[3])
    md = bench.markdown_tables({"device": "cpu:0", "cpu": "test", "cores": 2, "jax": "x", "matmul_peak_flops": 1e9,
                                "command": "c", "rows": [], "shape": dict(zip("b t h p n g r".split(), TINY)),
                                "auto_table": table})
    assert "| scalar_decay | 8 | 8 | 2, 1, 2, 4, 8 |" in md and "| scalar_decay | ∞ | ∞ | 1, 2, 4, 4, 16 |" in md
