"""The scale ladder of the claim table (ssmgate.report.ladder) from summary.json files:

    python -m ssmgate.ladder quick=runs/reproduce/summary.json cpu=docs/reproduction/summary.json

prints the markdown table that docs/reproduction.md#scale-ladder carries. Scales are given smallest first;
each file is a summary.json written by ssmgate.reproduce (its "claims" rows are recomputed from its
experiments' checks, so an older file is judged by today's claim table).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ssmgate.programs import registry
from ssmgate.report import ladder


def main(argv: list[str]) -> int:
    summaries = {}
    for arg in argv:
        scale, sep, path = arg.partition("=")
        if not sep or not Path(path).is_file():
            print(f"expected SCALE=PATH to a summary.json, got {arg!r}", file=sys.stderr)
            return 2
        summaries[scale] = json.loads(Path(path).read_text())
    if not summaries:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(ladder.markdown(summaries, registry.claim_rows()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
