"""The repository is self-contained: code, flag files and docs cite the protocol pages under
docs/protocol/ ("protocol §N.M", a heading there) or the papers, never a document outside the
repository, and the docs/ pages they name exist."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = (".py", ".md", ".flags", ".cfg", ".toml", ".sh", ".txt")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / f for f in out.splitlines() if f.endswith(TEXT) or f in ("Makefile", ".ci/run")]


def protocol_sections() -> set[str]:
    """Section numbers of docs/protocol's headings: '# §1 ...' -> '1', '## 1.5 ...' -> '1.5'."""
    found = set()
    for page in (REPO / "docs" / "protocol").glob("*.md"):
        found |= set(re.findall(r"^#+ §?(\d+(?:\.\d+)*)\b", page.read_text(), re.MULTILINE))
    return found


def cited_sections(text: str) -> list[str]:
    """'protocol §2.3', 'protocol §2.3-2.4', 'protocol §1.2/1.3', 'protocol §6.2, §6.3' -> their numbers."""
    out = []
    for m in re.finditer(r"protocol §(\d+(?:\.\d+)*)((?:\s?[-/,–]\s?§?\d+(?:\.\d+)*)*)", text):
        out.append(m.group(1))
        out += re.findall(r"\d+(?:\.\d+)*", m.group(2))
    return out


def test_no_reference_to_a_document_outside_the_repository():
    outside = re.compile(r"\bSPEC(\.md)?\b(?!_)|\bDESIGN(\.md)?\b")
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:100]}" for p in tracked_text_files()
            if p.name != "test_docs_refs.py"
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if outside.search(line)]
    assert hits == []


def test_every_cited_protocol_section_is_a_heading_of_docs_protocol():
    sections = protocol_sections()
    assert {"1.5", "3.4", "6.2", "9.1"} <= sections  # the pages are there and numbered
    missing = sorted({f"{p.relative_to(REPO)}: §{n}" for p in tracked_text_files()
                      for n in cited_sections(p.read_text(errors="replace")) if n not in sections})
    assert missing == []


def test_docs_pages_and_modules_named_in_the_repository_exist():
    pattern = r"\bdocs/[\w/.-]+\.md|\bssmgate/[\w/]+\.py"
    named = {m for p in tracked_text_files() for m in re.findall(pattern, p.read_text(errors="replace"))}
    example = "ssmgate/programs/copy_demo/"  # docs/extending.md's worked example, written by its reader
    assert sorted(n for n in named if not (REPO / n).exists() and not n.startswith(example)) == []


def test_the_citation_parser_finds_ranges_and_lists():
    assert cited_sections("(protocol §2.3-2.4; protocol §1.2/1.3, §6.2)") == ["2.3", "2.4", "1.2", "1.3", "6.2"]
