"""The SSD ceiling benchmark (ssmgate/bench/ceiling.py) at a toy size."""
import re
import subprocess
import sys

import pytest

from ssmgate.bench import ceiling, cores

TOY = (1, 40, 4, 8, 16, 2, 2)  # b, t, h, p, n, g, r: t not a multiple of the chunk


@pytest.mark.parametrize("stage", list(ceiling.STAGES))
def test_every_layout_of_a_stage_is_the_same_contraction(stage):
    """Same summed and kept letters, operands shaped as their letters say, for every layout."""
    b, t, h, p, n, g, _ = TOY
    signatures = set()
    for _, shapes, spec in ceiling.STAGES[stage]:
        ins, out = spec.split("->")
        operands = ins.split(",")
        sizes = dict(b=b, c=3, q=16, s=16, h=h, g=g, j=h // g, p=p, n=n)
        assert [tuple(sizes[ch] for ch in op) for op in operands] == shapes(b, 3, 16, h, g, h // g, p, n)
        summed = set("".join(operands)) - set(out)
        signatures.add((frozenset(summed), frozenset(out)))
    assert len(signatures) == 1, signatures


def test_flops_match_the_chunked_count():
    """The three stages are the chunked form's FLOPs minus its C Bᵀ (counted by the cores benchmark)."""
    b, t, h, p, n, g, r = TOY
    q = 20  # divides t: the benchmark counts unpadded tokens
    stages = sum(ceiling.stage_flops(s, b, t, h, g, p, n, q) for s in ceiling.STAGES)
    assert stages + 2 * b * t * q * n * g == pytest.approx(cores.flop_count("scalar_decay", "chunked", q, *TOY))


def test_measure_and_markdown():
    lines = []
    result = ceiling.measure(TOY, [16], reps=1, log=lines.append)
    (chunk,) = result["chunks"]
    assert [s["stage"] for s in chunk["stages"]] == list(ceiling.STAGES)
    for s in chunk["stages"]:
        assert s["seconds"] == min(x["seconds"] for x in s["layouts"]) > 0
    assert chunk["bound_s"] == pytest.approx(sum(s["seconds"] for s in chunk["stages"]))
    assert chunk["max_speedup_vs_sequential"] == pytest.approx(result["sequential_fwd_s"] / chunk["bound_s"])
    md = ceiling.markdown(result)
    assert re.search(r"^\| 16 \| .* ms \| [0-9.]+× \|$", md, re.M), md
    assert any("at most" in line for line in lines)


def test_bad_shape_names_the_flag():
    proc = subprocess.run([sys.executable, "-m", "ssmgate.bench", "ssd_ceiling", "--shape=1,2,3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--shape takes 7 positive integers" in proc.stderr + proc.stdout
