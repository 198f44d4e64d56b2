"""What a rerun's `--steps` means for a run that has checkpoints, read from the run's own record
(RUN_DIR/flags.txt) and not from the command alone.

The learning-rate schedule is as long as `--schedule_steps`, which is `--steps` unless set, and a
checkpoint's optimizer state was trained on that schedule. So, when `--schedule_steps` is not given:

- more `--steps` than the record extends the run on the schedule it trained with (the record's
  `--schedule_steps`, else its `--steps`);
- the record's own `--steps` with a `--schedule_steps` of its own is a run extended before: the same
  command resumes it on that schedule (a requeue after a stop, or a rerun of a finished extension);
- fewer `--steps` than the record is refused: the run is set to go further, and a shorter command
  would rewrite its record and evaluate its last step again.

Both accepted cases end up in flags.txt (`--steps` and `--schedule_steps`), which is what lets the
next rerun read them back.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ssmgate.config_error import ConfigError


def parse_flags(text: str) -> dict:
    """A flags.txt text as {'--name': 'value'}."""
    return dict(line.split("=", 1) if "=" in line else (line, "") for line in text.splitlines() if line)


def flag_changes(old: str, new: str, renamed: dict | None = None) -> str:
    """'--lr: 0.005 -> 0.01, ...' between two flags.txt texts; `renamed` ({old name: name now}) reads a record
    written before a flag was renamed under the flag's name now."""
    now = {f"--{o}": f"--{n}" for o, n in (renamed or {}).items()}
    a, b = {now.get(k, k): v for k, v in parse_flags(old).items()}, parse_flags(new)
    return ", ".join(f"{k}: {a.get(k, '<unset>')} -> {b.get(k, '<unset>')}" for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k)) or "none"


@dataclasses.dataclass(frozen=True)
class Schedule:
    steps: int           # --schedule_steps to train on
    extends_from: int    # the --steps of the record
    resumed: bool        # True: the record is already this extension (the same command again)


def schedule_of_rerun(record: str, record_path: str, steps: Optional[int]) -> Optional[Schedule]:
    """The schedule a rerun with `steps` continues on (None: not an extension, the flags decide),
    given the run's flags.txt text `record`; raises ConfigError for fewer steps than the record."""
    before = parse_flags(record)
    old_steps = int(before.get("--steps", "0") or 0)
    old_schedule = int(before.get("--schedule_steps", "0") or 0)
    if steps is None or old_steps < 1:
        return None
    if steps < old_steps:
        raise ConfigError(f"--steps={steps} is fewer than the {old_steps} steps this run is set to ({record_path}: "
                          f"--steps={old_steps}" + (f", --schedule_steps={old_schedule}" if old_schedule else "")
                          + f"); expected --steps={old_steps} (the command that set it) or more, or a new --run_dir")
    if steps > old_steps:
        return Schedule(old_schedule or old_steps, old_steps, resumed=False)
    if old_schedule and old_schedule != old_steps:
        return Schedule(old_schedule, old_steps, resumed=True)
    return None
