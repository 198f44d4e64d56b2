"""`python -m ssmgate.bench cores|sweeps [flags]`: dispatches to the named benchmark."""
import sys

from absl import app

from ssmgate.bench import cores, sweeps

BENCHMARKS = {"cores": cores.main, "sweeps": sweeps.main}


def _dispatch(argv):
    if len(argv) < 2 or argv[1] not in BENCHMARKS:
        names = ", ".join(sorted(BENCHMARKS))
        raise app.UsageError(f"usage: python -m ssmgate.bench NAME [flags]; NAME is one of: {names}")
    return BENCHMARKS[argv[1]](argv[1:])


if __name__ == "__main__":
    app.run(_dispatch, argv=sys.argv)
