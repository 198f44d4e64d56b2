"""Sweep grids written in flag files: comma-separated numbers and `logspace:start:stop:num` items
(base-10 exponents, endpoints included), e.g. `logspace:0:4:9,1e6`."""
from __future__ import annotations

import numpy as np


def parse_grid(flag: str, text: str) -> tuple[float, ...]:
    values: list[float] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if item.startswith("logspace:"):
            parts = item.split(":")[1:]
            try:
                start, stop, num = float(parts[0]), float(parts[1]), int(parts[2])
                if len(parts) != 3 or num < 1:
                    raise ValueError
            except (ValueError, IndexError):
                raise ValueError(f"--{flag}: cannot read {item!r}; expected logspace:START:STOP:NUM "
                                 f"(base-10 exponents, NUM >= 1)") from None
            values.extend(float(v) for v in np.logspace(start, stop, num))
        else:
            try:
                values.append(float(item))
            except ValueError:
                raise ValueError(f"--{flag}: cannot read {item!r}; expected a number or "
                                 f"logspace:START:STOP:NUM") from None
    return tuple(values)


def parse_ints(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated integers ('' = none)."""
    values = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        try:
            values.append(int(item))
        except ValueError:
            raise ValueError(f"--{flag}={text}: cannot read {item!r}; expected comma-separated integers") from None
    return tuple(values)
