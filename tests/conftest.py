"""Session-wide set-up: XLA compilation dominates this suite on a 2-core CPU, so the tests compile
for speed of compilation, not of execution.

- `--xla_backend_optimization_level=0` (LLVM -O0): a third less wall time, the same results within
  every tolerance of the suite (the tests' arrays are small, so slower code costs little).
- A persistent compilation cache, one fresh folder per process (per xdist worker: no two writers
  share a folder), removed at exit: programs rebuilt by later tests, and the subprocesses the
  program tests start, reuse executables compiled earlier instead of compiling them again.

- The CPU platform where libtpu is installed (the test environment) and no accelerator is attached
  (ssmgate/platform_env.py): JAX does not try, and fail, to start a TPU client in every process.
  The TPU compile tests name their topology and load libtpu for it themselves.

All are set here, before jax starts, and only where the caller has not set them already
(`XLA_FLAGS` with an optimization level, `JAX_COMPILATION_CACHE_DIR`, `JAX_PLATFORMS`).
"""
import atexit
import os
import shutil
import tempfile

from ssmgate import platform_env  # imports no JAX
from ssmgate.xla_env import with_flag

platform_env.apply_default()
os.environ["XLA_FLAGS"] = with_flag(os.environ.get("XLA_FLAGS", ""), "xla_backend_optimization_level", "0")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix=f"ssmgate-jax-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
