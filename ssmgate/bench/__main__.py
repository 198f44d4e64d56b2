"""`python -m ssmgate.bench cores|sweep|fig1_sweeps [flags]`: dispatches to the named benchmark.

cores: the recurrent cores' algorithms; sweep: vmapped training sweeps of language models and
training throughput (ssmgate.bench.train); fig1_sweeps: the P1 Figure 1 grids as one program.
"""
import sys

from absl import app

from ssmgate.bench import cores, sweeps, train

BENCHMARKS = {"cores": cores.main, "sweep": train.main, "fig1_sweeps": sweeps.main}


def _dispatch(argv):
    if len(argv) < 2 or argv[1] not in BENCHMARKS:
        names = ", ".join(sorted(BENCHMARKS))
        raise app.UsageError(f"usage: python -m ssmgate.bench NAME [flags]; NAME is one of: {names}")
    return BENCHMARKS[argv[1]](argv[1:])


if __name__ == "__main__":
    app.run(_dispatch, argv=sys.argv)
