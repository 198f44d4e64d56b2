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


def report_tail(checks: dict, missing, changes: dict) -> list[str]:
    """The closing lines of a report section: its checks, the runs without a summary and, per run,
    what this scale changes from the paper's flag files."""
    md = []
    if checks:
        md += ["Checks:", "", table(["check", "pass"], [[k, v] for k, v in checks.items()])]
    if missing:
        md += [f"Runs without a summary (failed or not run): {', '.join(missing)}.", ""]
    changed = [f"- {run}: " + "; ".join(c) for run, c in changes.items() if c]
    if changed:
        md += ["What this scale changes from the paper's flag files:", "", *changed, ""]
    return md
