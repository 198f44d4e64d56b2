"""Small corpora for the data tests: a `files:` folder of text and JSON-lines files."""
import json

import pytest

TEXTS = {"a.txt": "Alpha document.\nSecond line, ünïcode 🙂\n", "c.txt": "", "e.txt": "  kept as is  "}
JSONL = {"b.jsonl": ["first json doc", "second — with a\nnewline", "third " * 40],
         "d.jsonl": [f"line {i} " + "x" * (i * 7 % 50) for i in range(60)]}


def write_corpus(root, texts=TEXTS, jsonl=JSONL, key="text"):
    root.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (root / name).write_text(text, encoding="utf-8")
    for name, docs in jsonl.items():
        lines = [json.dumps({key: d, "id": i}) for i, d in enumerate(docs)]
        lines.insert(1, "   ")  # a blank line is skipped
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def documents_in_order(texts=TEXTS, jsonl=JSONL):
    docs = []
    for name in sorted([*texts, *jsonl]):
        docs += [texts[name]] if name in texts else jsonl[name]
    return docs


@pytest.fixture
def corpus_dir(tmp_path):
    return write_corpus(tmp_path / "corpus")
