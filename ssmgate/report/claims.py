"""The claim table that opens the reproduction report: one row per figure and table of both papers.

Each row states the claim in one line, the paper's number, ours (from the summary entry) and a status
computed from the checks the row names, never from prose:
  reproduced      every named check that ran passes;
  partly          some pass, some fail;
  not reproduced  every named check that ran fails;
  not attempted   no named check ran at this scale (or the row has none: what the report shows
                  there, if anything, is not checked), with the reason.
A row's checks are regular expressions over the check names of its experiment's `checks`. The rows
live with their experiments (`ssmgate/programs/<name>/claims.py`, `CLAIMS`), in the order of the
registry; ssmgate.reproduce collects them and passes them here. The helpers below read an entry.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional, Sequence

from ssmgate.report.format import table

STATUSES = ("reproduced", "partly", "not reproduced", "not attempted")


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str                   # stable id, e.g. "P1 Fig 2b"
    claim: str
    paper: str                 # the paper's number(s)
    experiment: str            # the experiment that owns the row, whose summary entry it reads
    checks: tuple[str, ...] = ()
    ours: Optional[Callable[[dict], object]] = None
    unchecked: str = ""        # why a row without checks has none


def at(entry: dict, *path):
    """entry[path[0]][path[1]]..., None where a key is missing."""
    for p in path:
        if not isinstance(entry, dict) or p not in entry:
            return None
        entry = entry[p]
    return entry


def largest(d: Optional[dict]):
    """The value at the largest integer key (a pool size, a window)."""
    return None if not d else d[max(d, key=int)]


def strongest(d: Optional[dict]):
    """The value at the largest float key (the strongest gate offset)."""
    return None if not d else d[max(d, key=float)]


def by_offset(d: Optional[dict]) -> list:
    return sorted((d or {}).items(), key=lambda kv: float(kv[0]))


def status(claim: Claim, summary: dict) -> tuple[str, str]:
    """(status, why) of one row from the checks of its experiment's entry."""
    entry = summary.get(claim.experiment)
    if not claim.checks:
        return "not attempted", claim.unchecked
    if not entry:
        return "not attempted", "not run at this scale"
    names = [n for n in entry.get("checks", {}) if any(re.search(p, n) for p in claim.checks)]
    if not names:
        return "not attempted", "its checks did not run at this scale"
    failed = [n for n in names if not entry["checks"][n]]
    if not failed:
        return "reproduced", f"{len(names)} of {len(names)} checks pass"
    why = "fails " + ", ".join(f"`{n}`" for n in failed)
    return ("not reproduced" if len(failed) == len(names) else "partly"), why


def rows(summary: dict, claims: Sequence[Claim]) -> dict:
    """{claim key: {"status", "why", "ours", "checks"}} for summary.json."""
    out = {}
    for c in claims:
        st, why = status(c, summary)
        entry = summary.get(c.experiment) or {}
        ours = None
        if c.ours is not None and entry:
            try:
                ours = str(c.ours(entry))
            except (KeyError, TypeError, ValueError):  # a partial entry (a run missing): no number
                ours = None
        out[c.key] = {"status": st, "why": why, "ours": ours,
                      "checks": sorted(n for n in entry.get("checks", {}) if any(re.search(p, n) for p in c.checks))}
    return out


def markdown(summary: dict, scale: str, claims: Sequence[Claim], reference: Optional[dict] = None) -> str:
    """The claim table; `reference` (the committed cpu-scale summary) adds its statuses beside ours."""
    table_rows = rows(summary, claims)
    ref_rows = rows(reference, claims) if reference else None
    header = ["artefact", "claim", "paper", f"ours ({scale})", "status", "why"]
    if ref_rows:
        header.insert(5, "cpu-scale status (committed)")
    body = []
    for c in claims:
        r = table_rows[c.key]
        row = [c.key, c.claim, c.paper, r["ours"] or "–", f"**{r['status']}**", r["why"] or "–"]
        if ref_rows:
            row.insert(5, ref_rows[c.key]["status"])
        body.append(row)
    counts = {s: sum(r["status"] == s for r in table_rows.values()) for s in STATUSES}
    lines = ["## What reproduced", "",
             f"{counts['reproduced']} reproduced, {counts['partly']} partly, {counts['not reproduced']} not "
             f"reproduced, {counts['not attempted']} not attempted (of {len(claims)} figures and tables). A status "
             "comes from the checks named in each section below (thresholds and their sources: "
             "docs/reproduction.md#thresholds), never from prose.", "", table(header, body)]
    return "\n".join(lines) + "\n"
