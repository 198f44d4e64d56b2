"""Measured results kept line by line in a JSONL file, keyed by what was measured and by the
weights' digest: an evaluation killed half way resumes without measuring anything twice, and a
file written for other weights is ignored."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from ssmgate.train.run_dir import to_jsonable


class CellStore:
    def __init__(self, path: str | os.PathLike, digest: str):
        self.path, self.digest = Path(path), digest
        self.cells: dict[str, object] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if rec.get("digest") == digest:
                    self.cells[rec["key"]] = rec["value"]

    def get(self, key: str, measure: Callable[[], object]):
        """The stored value of `key`, or measure() stored (flushed before it is returned)."""
        if key not in self.cells:
            value = to_jsonable(measure())
            with open(self.path, "a") as f:
                f.write(json.dumps({"digest": self.digest, "key": key, "value": value}) + "\n")
            self.cells[key] = value
        return self.cells[key]
