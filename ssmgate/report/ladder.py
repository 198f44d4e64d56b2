"""The scale ladder: for every claim row that does not reproduce at the largest scale given, what each
scale measured (the row's "ours" and status), so that a reader can tell a trend with scale from an error.

    python -m ssmgate.report.ladder quick=runs/reproduce/summary.json cpu=docs/reproduction/summary.json

prints the markdown table that docs/reproduction.md#scale-ladder carries. Scales are given smallest first;
each file is a summary.json written by ssmgate.reproduce (its "claims" rows are recomputed from its
experiments' checks, so an older file is judged by today's claim table).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ssmgate.report import claims
from ssmgate.report.format import table


def rows(summaries: dict[str, dict]) -> list[list[str]]:
    """[claim key, then per scale 'ours (status)'] for every row not reproduced at the last scale."""
    judged = {scale: claims.rows(s) for scale, s in summaries.items()}
    largest = judged[list(summaries)[-1]]
    out = []
    for c in claims.CLAIMS:
        if largest[c.key]["status"] == "reproduced":
            continue
        out.append([c.key, *[f"{r[c.key]['ours'] or '–'} ({r[c.key]['status']})" for r in judged.values()]])
    return out


def markdown(summaries: dict[str, dict]) -> str:
    return table(["artefact", *[f"ours ({scale})" for scale in summaries]], rows(summaries))


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
    print(markdown(summaries), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
