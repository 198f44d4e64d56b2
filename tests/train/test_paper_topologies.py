"""Every paper-scale flag file whose header names a slice (`# aot: --topology=... [flags]`) compiles
there and fits, by `python -m ssmgate.aot` (slow: minutes a file on 2 cores): a training step, or an
official checkpoint's intervention forwards where its config.json is here. docs/benchmarks.md
"Training steps compiled for TPU slices" has what each measured."""
import subprocess
import sys
from pathlib import Path

import pytest

from ssmgate import platform_env
from ssmgate.interventions import convert_mamba3

REPO = Path(__file__).resolve().parents[2]
HEADER = "# aot: "


def aot_args(path: Path) -> list[str] | None:
    """The flags of a file's `# aot:` header line (the text before a parenthesis), or None."""
    for line in path.read_text().splitlines():
        if line.startswith(HEADER):
            return line[len(HEADER):].split("(")[0].split()
        if not line.startswith("#"):
            return None
    return None


FILES = sorted(p for p in (REPO / "experiments").rglob("*.flags") if aot_args(p))


def test_headers_name_a_topology():
    assert FILES, "no paper-scale flag file names a slice"
    for path in FILES:
        args = aot_args(path)
        assert any(a.startswith("--topology=") for a in args), (path, args)
        assert "cpu" not in path.parts and "quick" not in path.parts, path


@pytest.mark.slow
@pytest.mark.skipif(not platform_env.libtpu_installed(), reason="needs libtpu (make venv installs it)")
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_paper_flag_file_compiles_and_fits_on_its_slice(path):
    official = next((line.split("=", 1)[1] for line in path.read_text().splitlines()
                     if line.startswith("--lm_init_official=")), None)
    if official is not None and convert_mamba3.read_config(REPO / official) is None:
        pytest.skip(f"the forward pass has the shape of the checkpoint's config.json: no checkpoint at {official}")
    p = subprocess.run([sys.executable, "-m", "ssmgate.aot", f"--flagfile={path}", *aot_args(path)],
                       capture_output=True, text=True, cwd=REPO, timeout=1800)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    assert "fits" in p.stdout
