"""BFCL "python simple" (P1 §5, protocol §5.1): 400 questions, each with one function document and the
acceptable arguments of its call, read from the data files of the public `bfcl-eval` package.

`make venv` installs that package without its dependencies (`pip install --no-deps`; its own
pins would clash with ours and only its JSON is needed), so the data is on every machine that ran
set-up and nothing is downloaded at run time. The package is never imported: its folder is found by
`importlib.util.find_spec`, which does not execute it. `data_dir` (or $SSMGATE_BFCL_DIR) points
elsewhere: any folder holding `BFCL_v4_simple_python.json` and `possible_answer/` with the same file.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from pathlib import Path

QUESTIONS = "BFCL_v4_simple_python.json"
ANSWERS = f"possible_answer/{QUESTIONS}"
EXPECTED_COUNT = 400   # protocol §5.1: "400 examples in BFCL v3 - verify locally"; v4 has the same 400


@dataclasses.dataclass(frozen=True)
class BfclExample:
    id: str
    question: str        # the user's request
    function: dict       # its one function document: name, description, parameters (JSON schema-like)
    answer: dict         # {function name: {parameter: [acceptable values]}}; "" = may be omitted

    @property
    def name(self) -> str:
        return self.function["name"]


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The folder of the BFCL data files: `override`, else $SSMGATE_BFCL_DIR, else the installed
    bfcl-eval package's `data/`."""
    where = override or os.environ.get("SSMGATE_BFCL_DIR")
    if where:
        return Path(where)
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the BFCL data needs the bfcl-eval package: run `make venv` (it installs "
                                "bfcl-eval==2026.3.23 with --no-deps), or set $SSMGATE_BFCL_DIR to a folder holding "
                                f"{QUESTIONS} and {ANSWERS}")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _read_lines(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: BFCL file not found (expected {QUESTIONS} and {ANSWERS} under the data folder)")
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i + 1}: not a JSON line ({e})") from None
    return out


def load_simple_python(where: str | os.PathLike | None = None) -> list[BfclExample]:
    """The 400 examples in file order, each checked: one user turn, one function, one answer for it."""
    root = data_dir(where)
    questions, answers = _read_lines(root / QUESTIONS), _read_lines(root / ANSWERS)
    if len(questions) != EXPECTED_COUNT or len(answers) != EXPECTED_COUNT:
        raise ValueError(f"{root}: {len(questions)} questions and {len(answers)} answers; expected {EXPECTED_COUNT} "
                         "of each (BFCL python simple)")
    examples = []
    for q, a in zip(questions, answers):
        if q["id"] != a["id"]:
            raise ValueError(f"{root}: question {q['id']} is paired with answer {a['id']}; the files are out of order")
        turns = q["question"]
        if len(turns) != 1 or len(turns[0]) != 1 or turns[0][0]["role"] != "user":
            raise ValueError(f"{q['id']}: expected one user message, got {turns}")
        if len(q["function"]) != 1 or len(a["ground_truth"]) != 1:
            raise ValueError(f"{q['id']}: expected one function and one answer, got {len(q['function'])} and "
                             f"{len(a['ground_truth'])}")
        example = BfclExample(q["id"], turns[0][0]["content"], q["function"][0], a["ground_truth"][0])
        if set(example.answer) != {example.name}:
            raise ValueError(f"{q['id']}: the answer calls {sorted(example.answer)}, the document is {example.name!r}")
        examples.append(example)
    return examples
