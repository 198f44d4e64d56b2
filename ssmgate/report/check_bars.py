"""The thresholds of the reproduction checks, each with its source.

Each experiment package owns its bars (`ssmgate/programs/<name>/claims.py`, `BARS`); a check reads
its threshold from there, never from a literal of its own, and tests/programs/test_check_bars.py pins
every value: loosening a bar is a visible change of that file and of the test. Sources: "P1" is *On
the Importance of Gating*, "P2" *Understanding Mamba-3 through oscillatory dynamics*; "acceptance" is
the table of what each figure must show to count as reproduced (docs/reproduction.md#thresholds),
"scaled-down" a bar for the reduced CPU runs, where the protocol states one, "ours" a bar this project
chose where the papers give none.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Bar:
    value: float
    source: str


class Bars(dict):
    """name -> Bar, with the two reads a check makes."""

    def bar(self, name: str) -> float:
        return self[name].value

    def source(self, *names: str) -> str:
        """The sources of these bars, once each, in order."""
        return "; ".join(dict.fromkeys(self[n].source for n in names))


def merged(parts: Iterable[tuple[str, Mapping[str, Bar]]]) -> Bars:
    """The bars of several experiments as one table, in their order; a name two of them use is an error."""
    out, owner = Bars(), {}
    for experiment, bars in parts:
        for name, b in bars.items():
            if name in owner:
                raise ValueError(f"bar {name!r} is defined by both {owner[name]} and {experiment}")
            out[name], owner[name] = b, experiment
    return out


def markdown_table(bars: Mapping[str, Bar]) -> str:
    """The table of docs/reproduction.md#thresholds (a test keeps the docs equal to it)."""
    lines = ["| bar | value | source |", "|---|---|---|"]
    lines += [f"| `{name}` | {b.value:g} | {b.source} |" for name, b in bars.items()]
    return "\n".join(lines) + "\n"
