"""The device benchmark's harness (ssmgate/bench/device.py) on CPU, with the Pallas kernels in
interpret mode at toy sizes; the real run is launch/device_bench.sh on a GPU/TPU machine."""
import pytest

from ssmgate.bench import device

TINY = (1, 20, 2, 16, 16, 1, 4)  # b, t, h, p, n, g, r: two chunks of 16, the second ragged


def test_checks_pass_on_the_interpreted_kernel(monkeypatch):
    monkeypatch.setattr(device, "CHECK_SHAPE", TINY)
    lines = []
    checks = device.check_correctness(lines.append)
    assert checks and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    for core in device.DEVICE_ALGORITHMS:
        got = {(c["dtype"], c["check"]) for c in checks if c["core"] == core}
        assert {("float32", "y"), ("float32", "state"), ("bfloat16", "y"), ("float32", "grad_x"),
                ("float32", "grad_dt"), ("float32", "grad_B")} <= got
    assert len(lines) == len(checks) and all(line.startswith("check ok") for line in lines)


def test_rows_and_markdown(monkeypatch):
    monkeypatch.setattr(device, "DEVICE_ALGORITHMS", {"rotation": device.DEVICE_ALGORITHMS["rotation"]})
    rows = device.bench_rows(TINY, 16, peak=1e9, bandwidth=1e9, reps=1, max_seconds=1.0, log=lambda s: None)
    assert {(r["core"], r["algorithm"], r["mode"]) for r in rows} == {
        (c, a, m) for c, algs in device.DEVICE_ALGORITHMS.items() for a in algs for m in ("fwd", "fwd+bwd")}
    for r in rows:
        assert "error" not in r, r
        assert r["seconds"] > 0 and 0 < r["roofline_fraction"] and r["bound"] in ("FLOP", "bytes")
        if r["algorithm"] == "chunked":
            assert r["vs_chunked"] == 1.0
    result = {"date": "2026-12-02", "device_kind": "cpu", "backend": "cpu", "jax": "x", "bf16_flops": 1e9,
              "bandwidth": 1e9, "command": "c", "shape": dict(zip("b t h p n g r".split(), TINY)),
              "checks": [{"core": "rotation", "dtype": "float32", "check": "y", "rel_err": 1e-7, "tol": 1e-4,
                          "ok": True}], "rows": rows + [dict(rows[0], error="boom")]}
    md = device.markdown(result)
    assert md.count("| pallas |") == 2 and "failed: boom" in md and "| rotation | float32 | y | 1.0e-07 |" in md


def test_refuses_a_backend_this_machine_does_not_have():
    with pytest.raises(SystemExit, match="--backend=gpu, but JAX's default backend is 'cpu'"):
        device.run("gpu", TINY, 16, 1, 1.0, "c", log=lambda s: None)
