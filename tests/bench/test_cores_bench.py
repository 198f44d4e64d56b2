"""The core benchmark runs end to end on a tiny size and writes what it promises."""
import pytest

from ssmgate.bench import cores as bench

TINY = (1, 16, 2, 4, 4, 1, 1)  # b, t, h, p, n, g, r


@pytest.mark.parametrize("core", ["scalar_decay", "rotation", "damped"])
def test_bench_rows(core):
    rows = bench.bench_core(core, TINY, peak=1e9, chunk_sizes=[8], reps=1, max_seconds=1.0, log=lambda s: None)
    algorithms = [r["algorithm"] for r in rows]
    expected = list(bench.ALGORITHMS[core]) + ["auto"]
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


def test_markdown_and_docs_block(tmp_path):
    rows = bench.bench_core("scalar_decay", TINY, peak=1e9, chunk_sizes=[8], reps=1, max_seconds=1.0,
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
