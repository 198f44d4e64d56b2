"""Markdown cells and tables of the reproduction report's sections."""
from __future__ import annotations


def cell(x, digits=3):
    """One table cell: None as a dash, booleans as yes / **no**, floats with `digits` significant
    digits below 1 (and from 1e4 on), `digits` decimals (trailing zeros dropped) in between."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "**no**"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if abs(x) >= 1e4 or abs(x) < 1:  # significant digits: 0.00316, 0.177, 6.54e+04
            return f"{x:.{digits}g}"
        return f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def table(header, rows) -> str:
    """A markdown table; non-string cells go through `cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) if not isinstance(v, str) else v for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


class Checks(dict):
    """check name -> passed, as summary.json stores them, plus each check's claim and the source of
    its threshold (`notes`) for the report's table."""

    def __init__(self):
        super().__init__()
        self.notes: dict[str, tuple[str, str]] = {}

    def add(self, name: str, passed, claim: str, source: str) -> None:
        self[name] = bool(passed)
        self.notes[name] = (claim, source)


def checks_table(checks: dict) -> str:
    notes = getattr(checks, "notes", {})
    rows = [[k, *notes.get(k, ("", "")), v] for k, v in checks.items()]
    return table(["check", "claim", "threshold from", "pass"], rows)


def report_tail(checks: dict, missing, changes: dict) -> list[str]:
    """The closing lines of a report section: its checks, the runs without a summary and, per run,
    what this scale changes from the paper's flag files."""
    md = []
    if checks:
        md += ["Checks:", "", checks_table(checks)]
    if missing:
        md += [f"Runs without a summary (failed or not run): {', '.join(missing)}.", ""]
    changed = [f"- {run}: " + "; ".join(c) for run, c in changes.items() if c]
    if changed:
        md += ["What this scale changes from the paper's flag files:", "", *changed, ""]
    return md


def replace_checks_table(section: str, checks: dict) -> str:
    """`section` with its checks table (the first table whose header starts with '| check |')
    replaced by one of `checks`; unchanged if it has none."""
    lines = section.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("| check |")), None)
    if start is None:
        return section
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + checks_table(checks).rstrip("\n").split("\n") + lines[end:])
