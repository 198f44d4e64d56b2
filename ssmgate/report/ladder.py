"""The scale ladder: for every claim row that does not reproduce at the largest scale given, what each
scale measured (the row's "ours" and status), so that a reader can tell a trend with scale from an error.
`python -m ssmgate.ladder` prints it (docs/reproduction.md#scale-ladder carries the table).
"""
from __future__ import annotations

from typing import Sequence

from ssmgate.report import claims as claimlib
from ssmgate.report.format import table


def rows(summaries: dict[str, dict], claims: Sequence[claimlib.Claim]) -> list[list[str]]:
    """[claim key, then per scale 'ours (status)'] for every row not reproduced at the last scale."""
    judged = {scale: claimlib.rows(s, claims) for scale, s in summaries.items()}
    largest = judged[list(summaries)[-1]]
    out = []
    for c in claims:
        if largest[c.key]["status"] == "reproduced":
            continue
        out.append([c.key, *[f"{r[c.key]['ours'] or '–'} ({r[c.key]['status']})" for r in judged.values()]])
    return out


def markdown(summaries: dict[str, dict], claims: Sequence[claimlib.Claim]) -> str:
    return table(["artefact", *[f"ours ({scale})" for scale in summaries]], rows(summaries, claims))
