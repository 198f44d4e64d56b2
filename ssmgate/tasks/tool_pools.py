"""Tool pools for BFCL (P1 §5, protocol §5.1 and 5.4): BM25 retrieval over the shared pool of function
documents, the main setting's top-k with injection of the correct tool, and the weak retriever.

- The shared pool is every example's function, deduplicated by name (the first document of a name
  is the pool's; 30 of BFCL's 400 names recur, some with different parameters, so a prompt shows
  the example's own document for its correct tool).
- A tool's BM25 document is its name, description and parameter names and descriptions as
  lower-cased word tokens (names split at dots and underscores); BM25 with k1 = 1.5, b = 0.75
  (library `bm25s`, Lucene's idf). Ties are broken by pool order, so rankings are deterministic.
- Main setting: the top k tools, best first (the most relevant first, farthest from the query). If
  the correct tool is not among them, the k-th is dropped and the correct one inserted at a
  uniform position among the k (protocol §5.1 [REC]); the pool keeps size k.
- Weak retriever: a Plackett–Luce ranking of all tools with scores beta * BM25, drawn by the
  Gumbel-top-k trick; the pool is its top k in that order, with no injection. beta -> 0 is a
  uniformly random pool, large beta the BM25 order.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

K1, B = 1.5, 0.75


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens; '_' and '.' separate words, so names match the words of a query."""
    return re.findall(r"[a-z0-9]+", text.lower())


def tool_text(doc: dict) -> str:
    """The BM25 document of one function: name, description, parameter names and descriptions."""
    parts = [doc["name"], doc.get("description", "")]
    for name, prop in doc.get("parameters", {}).get("properties", {}).items():
        parts += [name, prop.get("description", "") if isinstance(prop, dict) else ""]
    return " ".join(parts)


class ToolIndex:
    """BM25 over a shared pool of function documents (deduplicated by name, first one kept)."""

    def __init__(self, docs: Sequence[dict]):
        import logging

        import bm25s  # the retriever library; imported here so the rest of ssmgate does not need it

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # its INFO line per index is noise in a run's log

        self.docs: dict[str, dict] = {}
        for doc in docs:
            self.docs.setdefault(doc["name"], doc)
        self.names = list(self.docs)
        self.position = {name: i for i, name in enumerate(self.names)}
        self._bm25 = bm25s.BM25(k1=K1, b=B)
        self._bm25.index([tokens(tool_text(d)) for d in self.docs.values()], show_progress=False)

    def __len__(self) -> int:
        return len(self.names)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every pool tool for `query` (float64, pool order)."""
        words = [w for w in tokens(query) if w in self._bm25.vocab_dict]  # bm25s rejects unknown words
        if not words:
            return np.zeros(len(self.names))
        return np.asarray(self._bm25.get_scores(words), np.float64)

    def ranking(self, query: str) -> np.ndarray:
        """Pool indices, most relevant first; equal scores in pool order."""
        return np.lexsort((np.arange(len(self.names)), -self.scores(query)))

    def check(self, name: str) -> int:
        if name not in self.position:
            raise KeyError(f"tool {name!r} is not in the shared pool of {len(self.names)} tools")
        return self.position[name]


def _check_k(k: int, n: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: expected a pool size in [1, {n}] (the shared pool has {n} tools)")


def main_pool(index: ToolIndex, query: str, correct: str, k: int, rng: np.random.Generator) -> list[str]:
    """protocol §5.1: the top k tools best first, the correct one injected at a uniform position (in
    place of the k-th) when BM25 missed it."""
    _check_k(k, len(index))
    target = index.check(correct)
    top = [int(i) for i in index.ranking(query)[:k]]
    if target not in top:
        top = top[:k - 1]
        top.insert(int(rng.integers(0, k)), target)
    return [index.names[i] for i in top]


def gumbel_top_k(scores: np.ndarray, k: int, beta: float, rng: np.random.Generator) -> np.ndarray:
    """The first k of a Plackett–Luce ranking with weights exp(beta * scores): indices, in order."""
    if not beta >= 0.0:
        raise ValueError(f"beta={beta}: expected a strength >= 0")
    keys = beta * np.asarray(scores, np.float64) + rng.gumbel(size=len(scores))
    return np.argsort(-keys, kind="stable")[:k]


def weak_pool(index: ToolIndex, query: str, k: int, beta: float, rng: np.random.Generator) -> list[str]:
    """protocol §5.4: the top k of a PL ranking of all tools with scores beta * BM25; no injection."""
    _check_k(k, len(index))
    return [index.names[i] for i in gumbel_top_k(index.scores(query), k, beta, rng)]


def weak_recall(index: ToolIndex, queries: Sequence[str], correct: Sequence[str], k: int, beta: float,
                samples: int, seed: int = 0) -> float:
    """Monte-Carlo recall@k of the weak retriever: the fraction of (query, draw) pairs whose pool
    holds the correct tool, over `samples` draws per query."""
    _check_k(k, len(index))
    rng = np.random.default_rng(seed)
    hits = 0
    for query, name in zip(queries, correct):
        target, s = index.check(name), index.scores(query)
        hits += sum(target in gumbel_top_k(s, k, beta, rng) for _ in range(samples))
    return hits / (samples * len(queries))


def bm25_recall(index: ToolIndex, queries: Sequence[str], correct: Sequence[str], k: int) -> float:
    """How often plain BM25's top k holds the correct tool (before any injection)."""
    _check_k(k, len(index))
    return float(np.mean([index.check(n) in index.ranking(q)[:k] for q, n in zip(queries, correct)]))
