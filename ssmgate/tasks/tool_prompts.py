"""Tool-calling prompts built from BFCL's function documents (P1 §5; issue #8's CPU scale).

A prompt lists the pool's tools as one-line signatures, best first, then the question:

    Tools:
    calculate_triangle_area(base:int, height:int, unit?:str)
    geometry.area_triangle(base:int, height:int)
    Q: Find the area of a triangle with a base of 10 units and height of 5 units.
    A: [calculate_triangle_area(base=10, height=5)]<EOS>

The target is the BFCL call form with the first acceptable value of every parameter that may not
be omitted (`ssmgate.tasks.bfcl_checker` parses it back). Signatures replace BFCL's JSON schemas to
keep byte-level prompts short enough for a CPU (72 tools in about 3K bytes instead of 30K); they
keep what a call needs: the name, the parameter names, their types and which are optional.

Functions are split into training and held-out ones by a stable hash of the name (all examples of
one name fall on the same side), so test questions ask for tools never seen as an answer in
fine-tuning; they still appear as distractors in training pools, as in any retrieval setting.
Tokens come from any `ssmgate.tasks.tokenizers` tokenizer (bytes by default; PAD is the
tokenizer's pad id, or EOS where it has none). Sequences are left-padded with PAD, so the question and answer always sit at the end (a recurrent
model's state sees the same suffix whatever the pool size), and the loss is on the answer's bytes
and the EOS only. A training batch is padded to its longest row rounded up to a multiple of
`quantum` (at most seq_len), so small pools do not pay for the largest; each distinct width
compiles the training step once.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import numpy as np

from ssmgate.tasks import tool_pools
from ssmgate.tasks.bfcl import BfclExample
from ssmgate.tasks.synthetic_lm import LMBatch
from ssmgate.tasks.tokenizers import ByteTokenizer

TYPES = {"integer": "int", "float": "float", "string": "str", "boolean": "bool", "array": "list", "dict": "dict",
         "tuple": "tuple", "any": "any"}
BYTES = ByteTokenizer()


def signature(doc: dict) -> str:
    """`name(p:type, q?:type)`: the parameters in document order, optional ones marked `?`."""
    params = doc.get("parameters", {})
    required = set(params.get("required", []))
    parts = [f"{name}{'' if name in required else '?'}:{TYPES.get(spec.get('type'), spec.get('type'))}"
             for name, spec in params.get("properties", {}).items()]
    return f"{doc['name']}({', '.join(parts)})"


def render_prompt(question: str, docs: Sequence[dict]) -> str:
    return "Tools:\n" + "".join(signature(d) + "\n" for d in docs) + f"Q: {question}\nA: "


def answer_args(example: BfclExample) -> dict:
    """The target's arguments: each parameter's first acceptable value; parameters that may be
    omitted ("" among their values) are omitted."""
    return {p: values[0] for p, values in example.answer[example.name].items() if "" not in values}


def render_call(name: str, args: dict) -> str:
    return f"[{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")]"


def is_held_out(name: str, test_percent: int) -> bool:
    """Whether a function is held out for testing: a stable hash of its name (0..99) < test_percent."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % 100 < test_percent


def split(examples: Sequence[BfclExample], test_percent: int) -> tuple[list, list]:
    """(training examples, held-out examples) by function name."""
    if not 0 < test_percent < 100:
        raise ValueError(f"test_percent={test_percent}: expected 1..99")
    test = [e for e in examples if is_held_out(e.name, test_percent)]
    return [e for e in examples if not is_held_out(e.name, test_percent)], test


def pool_docs(index: tool_pools.ToolIndex, example: BfclExample, names: Sequence[str]) -> list[dict]:
    """The documents shown for a pool: the example's own for its tool, the shared pool's for the rest."""
    return [example.function if n == example.name else index.docs[n] for n in names]


@dataclasses.dataclass
class ToolData:
    index: tool_pools.ToolIndex       # the shared pool: every function of BFCL python simple
    train: list                       # examples whose function is not held out
    test: list
    k_max: int                        # training pools are k ~ U{1..k_max}, built by the main setting
    seq_len: int                      # the longest model input of a training row (tokens)
    quantum: int = 256                # training rows are padded to a multiple of this
    tokenizer: object = BYTES         # ssmgate.tasks.tokenizers.Tokenizer

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text), np.int32)

    def longest(self, k: int) -> int:
        """An upper bound on the bytes of prompt + answer + EOS with a pool of k tools (and on the
        tokens of a tokenizer whose every token covers at least one byte)."""
        lines = sorted((len(signature(d).encode()) + 1 for d in self.index.docs.values()), reverse=True)
        own = max(len(signature(e.function).encode()) + 1 for e in self.train + self.test)
        tail = max(len(render_prompt(e.question, []).encode()) + len(render_call(e.name, answer_args(e)).encode())
                   for e in self.train + self.test)
        return sum(lines[:k]) + own + tail + 1

    def validate(self) -> "ToolData":
        if self.quantum < 1:
            raise ValueError(f"quantum={self.quantum}: expected >= 1")
        if not 1 <= self.k_max <= len(self.index):
            raise ValueError(f"k_max={self.k_max}: expected 1..{len(self.index)}")
        need = self.longest(self.k_max)
        if self.seq_len + 1 < need:
            raise ValueError(f"seq_len={self.seq_len}: a prompt with {self.k_max} tools and its answer can take "
                             f"{need} bytes; expected seq_len >= {need - 1}")
        return self


def encode_example(data: ToolData, prompt: str, answer: str, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (length,), weights (length,)): PAD..., prompt, answer, EOS; weight 1 on the answer's
    tokens and the EOS (as targets: the weight of token j scores its prediction from j - 1)."""
    p = data.encode(prompt)
    a = np.concatenate([data.encode(answer), [data.tokenizer.eos_id]]).astype(np.int32)
    n = len(p) + len(a)
    if n > length:
        raise ValueError(f"an example of {n} tokens does not fit a row of {length}")
    tokens = np.full(length, data.pad_id, np.int32)
    tokens[length - n:] = np.concatenate([p, a])
    weights = np.zeros(length, np.float32)
    weights[length - len(a):] = 1.0
    return tokens, weights


def sft_batch(data: ToolData, batch: int, seed: int, step: int) -> LMBatch:
    """Training batch of `step`: random training examples, pool sizes k ~ U{1..k_max}, main-setting
    pools; a function of (seed, step) only. Inputs, targets and mask are (batch, width) with width
    a multiple of `quantum` (or seq_len)."""
    rng = np.random.default_rng([seed, step])
    texts = []
    for _ in range(batch):
        ex = data.train[int(rng.integers(len(data.train)))]
        k = int(rng.integers(1, data.k_max + 1))
        names = tool_pools.main_pool(data.index, ex.question, ex.name, k, rng)
        texts.append((render_prompt(ex.question, pool_docs(data.index, ex, names)),
                      render_call(ex.name, answer_args(ex))))
    longest = max(len(data.encode(p)) + len(data.encode(a)) + 1 for p, a in texts)  # a row: width + 1 tokens
    width = min(-(-(longest - 1) // data.quantum) * data.quantum, data.seq_len)
    rows, weights = zip(*(encode_example(data, p, a, width + 1) for p, a in texts))
    rows, weights = np.stack(rows), np.stack(weights)
    return LMBatch(rows[:, :-1], rows[:, 1:], weights[:, 1:])


def eval_prompts(data: ToolData, examples: Sequence[BfclExample], pools: Sequence[Sequence[str]]) -> np.ndarray:
    """Left-padded prompts (n, L) of the examples with the given pools, L = the longest of them."""
    encoded = [data.encode(render_prompt(e.question, pool_docs(data.index, e, names)))
               for e, names in zip(examples, pools)]
    length = max(len(p) for p in encoded)
    out = np.full((len(encoded), length), data.pad_id, np.int32)
    for i, p in enumerate(encoded):
        out[i, length - len(p):] = p
    return out
