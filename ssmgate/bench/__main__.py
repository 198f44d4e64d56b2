"""`python -m ssmgate.bench cores|device_check|sweep|fig1_sweeps|ssd_ceiling|data|nan_check|tpu_estimate [flags]`: dispatches to the named benchmark.

cores: the recurrent cores' algorithms (with --backend=gpu|tpu the Pallas device benchmark);
device_check: the budgeted accelerator check of issue #39 against upstream's Triton kernels
(ssmgate.bench.device_check, launch/device_check.sh);
sweep: vmapped training sweeps of language models and training throughput (ssmgate.bench.train);
fig1_sweeps: the P1 Figure 1 grids as one program; ssd_ceiling: the least time the chunked form's
matmuls take on this machine (ssmgate.bench.ceiling); data: the sharded text pipeline's tokenization,
loader throughput and memory (ssmgate.bench.data); nan_check: what the training loop's non-finite
check costs a sweep (ssmgate.bench.nan_check); tpu_estimate: the compiler's estimates for TPU
generations, kernel vs chunked, compiled on any machine with libtpu (ssmgate.bench.tpu_estimate).
Only the named benchmark's module is imported (its flags must exist before absl parses them), so `cores` needs no training stack: it runs on an
accelerator machine's own JAX install.
"""
import importlib
import sys

from absl import app

BENCHMARKS = {"cores": "ssmgate.bench.cores", "device_check": "ssmgate.bench.device_check", "sweep": "ssmgate.bench.train", "fig1_sweeps": "ssmgate.bench.sweeps",
              "ssd_ceiling": "ssmgate.bench.ceiling", "data": "ssmgate.bench.data",
              "nan_check": "ssmgate.bench.nan_check", "tpu_estimate": "ssmgate.bench.tpu_estimate"}


def _usage() -> str:
    return f"usage: python -m ssmgate.bench NAME [flags]; NAME is one of: {', '.join(sorted(BENCHMARKS))}"


def main(argv) -> None:
    if len(argv) < 2 or argv[1] not in BENCHMARKS:
        raise SystemExit(_usage())
    module = importlib.import_module(BENCHMARKS[argv[1]])
    app.run(lambda args: module.main(args[1:]), argv=argv)


if __name__ == "__main__":
    main(sys.argv)
