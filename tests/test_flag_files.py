"""The flag files of experiments/ as text (no JAX, no absl): the cpu and quick files build on their
paper file instead of copying it, set nothing to the value it already has, and their comments keep
the reasoning but no dated logs or wall times (those are in docs/reproduction.md); every claim that
a file is included by others is true, and every included file exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "experiments"
FLAG_FILES = sorted(EXPERIMENTS.rglob("*.flags"))
SCALED = sorted(p for p in EXPERIMENTS.glob("p*/*/*.flags") if p.parent.name in ("cpu", "quick"))

DATE = re.compile(r"\b(?:19|20)\d\d-\d\d-\d\d\b")
WALL_TIME = re.compile(r"\bwall[- ]?times?\b", re.IGNORECASE)
DURATION = re.compile(r"\b\d[\d,]*(?:\.\d+)?\s*(?:s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)\b", re.IGNORECASE)
INCLUDED_CLAIM = re.compile(r"\binclude[sd]?\b[^.;]*\bthis (?:one|file)\b|\bthis (?:one|file) is included\b",
                            re.IGNORECASE)


def lines(path: Path) -> list[tuple[str, str]]:
    """(name, value) of the file's own --name=value lines, in order."""
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("--"):
            name, _, value = line[2:].partition("=")
            out.append((name, value))
    return out


def included(value: str) -> Path:
    return REPO / value


def direct_includes(path: Path) -> list[Path]:
    return [included(v) for k, v in lines(path) if k == "flagfile"]


def expand(path: Path, _stack: tuple = ()) -> dict[str, str]:
    """The flags a file sets, its --flagfile= lines expanded in place (later lines override)."""
    assert path not in _stack, f"include cycle: {' -> '.join(str(p) for p in _stack + (path,))}"
    out = {}
    for name, value in lines(path):
        if name == "flagfile":
            target = included(value)
            assert target.is_file(), f"{path.relative_to(REPO)}: --flagfile={value} does not exist"
            out.update(expand(target, _stack + (path,)))
        else:
            out[name] = value
    return out


def all_includes(path: Path) -> set[Path]:
    out = set()
    for target in direct_includes(path):
        out |= {target} | all_includes(target)
    return out


def comment_blocks(path: Path) -> list[str]:
    """Runs of consecutive comment lines, joined into one text (a wrapped sentence stays whole)."""
    blocks, current = [], []
    for line in path.read_text().splitlines() + [""]:
        if line.strip().startswith("#"):
            current.append(line.strip().lstrip("#").strip())
        elif current:
            blocks.append(" ".join(current))
            current = []
    return blocks


def paper_file(path: Path) -> Path:
    return path.parent.parent / path.name


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_scaled_files_are_found():
    assert len(SCALED) >= 30 and all(paper_file(p).is_file() for p in SCALED)


@pytest.mark.parametrize("path", SCALED, ids=rel)
def test_scaled_file_builds_on_its_paper_file(path):
    paper = paper_file(path)
    if paper in all_includes(path):
        first = lines(path)[0]
        assert first == ("flagfile", rel(paper)), f"{rel(path)} should begin with --flagfile={rel(paper)}"
        return
    bases = [p for p in direct_includes(paper) if p.parent == paper.parent]
    if bases:  # a second seed: the paper file is its seed-0 file plus a few lines; so is this one
        same_scale = path.parent / bases[0].name
        assert same_scale in direct_includes(path), f"{rel(path)} includes neither {rel(paper)} nor {rel(same_scale)}"
        mine, base = expand(path), expand(bases[0])
        added = {k: v for k, v in expand(paper).items() if base.get(k) != v}   # what the paper file adds to its base
        differs = {k: (v, mine.get(k)) for k, v in added.items() if mine.get(k) != v}
        assert not differs, f"{rel(path)} does not set what {rel(paper)} adds to its seed-0 file: {differs}"
        return
    raise AssertionError(f"{rel(path)} does not include {rel(paper)} (a flag it must not inherit is reset by "
                         "its empty or default value: --preset=, --lm_token_cache_dir=, --lm_max_valid_tokens=0)")


@pytest.mark.parametrize("path", SCALED, ids=rel)
def test_no_line_repeats_a_value_it_already_has(path):
    state, repeated = {}, []
    for name, value in lines(path):
        if name == "flagfile":
            state.update(expand(included(value)))
        elif state.get(name) == value:
            repeated.append(f"--{name}={value}")
        else:
            state[name] = value
    assert not repeated, f"{rel(path)} sets what it already has from the lines before: {repeated}"


def _logs(text: str) -> list[str]:
    found = DATE.findall(text) + WALL_TIME.findall(text)
    for sentence in re.split(r"(?<=[.;])\s+", text):
        if "budget" not in sentence.lower():  # a time budget is a reason, not a measurement
            found += [m.group(0) for m in DURATION.finditer(sentence)]
    return found


def test_the_log_patterns_find_logs():
    assert _logs("Wall time on 2 CPU cores: 1,441 s alone (24 minutes).") == ["Wall time", "1,441 s", "24 minutes"]
    assert _logs("in the committed run (2026-12-03) delta = -6 escaped at step 5,600") == ["2026-12-03"]
    assert _logs("to fit make reproduce in its budget of 30 minutes; 8 heads x 16, 3 seeds, 16 x 256 bytes") == []


@pytest.mark.parametrize("path", FLAG_FILES, ids=rel)
def test_comments_carry_no_dates_or_wall_times(path):
    found = [log for block in comment_blocks(path) for log in _logs(block)]
    assert not found, f"{rel(path)}: dated logs or wall times in comments (they belong in docs/reproduction.md): {found}"


@pytest.mark.parametrize("path", FLAG_FILES, ids=rel)
def test_a_file_said_to_be_included_is_included(path):
    expand(path)  # every file it includes exists (and no include cycle)
    claims = [m.group(0) for block in comment_blocks(path) for m in INCLUDED_CLAIM.finditer(block)]
    if claims:
        by = [rel(p) for p in FLAG_FILES if path in direct_includes(p)]
        assert by, f"{rel(path)} says {claims[0]!r}, but no flag file includes it"


def test_a_file_said_to_be_included_is_found():
    """The claim pattern matches the sentences it is meant for."""
    for text in ("The KV experiment files include this one (--flagfile) and set their program",
                 "Mod 3 includes this file (its own curriculum)", "this file is included by the KV files"):
        assert INCLUDED_CLAIM.search(text), text
    assert not INCLUDED_CLAIM.search("Needs the data named in the included file.")
