"""`python -m ssmgate.bench tpu_estimate`'s pieces: the compiler's estimates for a TPU generation at a
small shape (the kernel's custom calls and bytes against the chunked form's), and a one-line error
for a generation it does not know."""
import pytest

from ssmgate import platform_env
from ssmgate.bench import tpu_estimate

pytestmark = pytest.mark.skipif(not platform_env.libtpu_installed(), reason="needs libtpu (make venv installs it)")


def test_unknown_generation_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown TPU generation 'v3'; expected one of \['v4', 'v5e', 'v5p', 'v6e'\]"):
        tpu_estimate.tpu_device("v3")


@pytest.mark.filterwarnings("ignore:ssmgate.cores. no measured")
def test_kernel_and_chunked_estimates():
    shape = (1, 128, 4, 64, 128, 1, 32)
    kernel = tpu_estimate.estimate("v5e", "scalar_decay", "pallas", 64, shape)
    chunked = tpu_estimate.estimate("v5e", "scalar_decay", "chunked", 64, shape)
    assert [r["mosaic_kernels"] for r in kernel] == [1, 2] and [r["mosaic_kernels"] for r in chunked] == [0, 0]
    assert [r["direction"] for r in kernel] == ["forward", "forward+backward"]
    for k, c in zip(kernel, chunked):
        assert 0 < k["hbm_bytes"] < c["hbm_bytes"], (k, c)     # the chunked form's intermediates go through HBM
        assert c["xla_flops"] > k["xla_flops"]                  # the kernel's matmuls are invisible to XLA
    assert "| v5e | scalar_decay | pallas/64 | forward | 1 |" in tpu_estimate.markdown(
        {"libtpu": "x", "shape": shape, "rows": kernel})
