"""Tokenizers for the language-model pipeline: a built-in byte tokenizer and adapters for trained ones.

`ByteTokenizer` (the default) needs nothing and has a fixed vocabulary: the 256 UTF-8 byte values,
then EOS and PAD, so any text round-trips exactly and a run on the embedded corpus is reproducible on
any machine. protocol §7.1 trains with the Llama-3.1 tokenizer; `load_tokenizer` opens such a trained
tokenizer from a HF `tokenizer.json` (package `tokenizers`) or a SentencePiece `.model` (package
`sentencepiece`). Those packages are optional, imported only when a file of theirs is loaded, and not
dependencies of ssmgate: a missing one raises an ImportError that names the pip package.

Every tokenizer offers `name`, `vocab_size`, `eos_id`, `pad_id` (None if it has none),
`encode(str) -> int32 array` without any special token (the packer adds EOS itself, protocol §7.3) and
`decode(ids) -> str`, which drops special tokens.
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Protocol

import numpy as np


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int
    pad_id: int | None

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids) -> str: ...


def _as_ids(ids, vocab_size: int) -> np.ndarray:
    """`ids` as a 1-D integer array, each in [0, vocab_size)."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"ids: expected a 1-D sequence of integers, got shape {arr.shape} dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        bad = arr[(arr < 0) | (arr >= vocab_size)][0]
        raise ValueError(f"ids: token id {int(bad)} outside the vocabulary [0, {vocab_size})")
    return arr.astype(np.int64)


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then EOS = 256 and PAD = 257.

    `decode(encode(s)) == s` for every str `s` (one that UTF-8 can encode, i.e. without lone
    surrogates). `decode` drops EOS and PAD and turns byte sequences that are not UTF-8 (a model's
    samples can hold them) into U+FFFD rather than failing.
    """

    name = "byte"
    EOS = 256
    PAD = 257
    vocab_size = 258
    eos_id = EOS
    pad_id = PAD

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids) -> str:
        arr = _as_ids(ids, self.vocab_size)
        return arr[arr < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


def _require(module: str, pip_name: str, path: Path) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"loading the tokenizer {path} needs the Python package {pip_name!r}, which is not "
                          f"installed (it is optional in ssmgate): pip install {pip_name}") from e


# Names the common trained tokenizers give their end-of-document token (Llama 3, GPT-2, Llama 2 / T5,
# Gemma), tried in this order when neither `eos_token` nor tokenizer_config.json names it.
_EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")


def _configured_eos(path: Path) -> str | None:
    """`eos_token` of the tokenizer_config.json beside `path` (a str or {"content": str}), if any."""
    config = path.with_name("tokenizer_config.json")
    if not config.is_file():
        return None
    eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos


class HFTokenizer:
    """A HF `tokenizers` tokenizer.json. EOS: `eos_token` if given, else the one named by a
    tokenizer_config.json beside the file, else the first of `_EOS_CANDIDATES` in the vocabulary."""

    def __init__(self, path: str | os.PathLike, eos_token: str | None = None):
        path = Path(path)
        self._tok = _require("tokenizers", "tokenizers", path).Tokenizer.from_file(str(path))
        self.name = f"hf:{path}"
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._find_eos(path, eos_token)
        self.pad_id = None

    def _find_eos(self, path: Path, eos_token: str | None) -> int:
        wanted = [eos_token] if eos_token is not None else [_configured_eos(path) or "", *_EOS_CANDIDATES]
        for token in wanted:
            token_id = self._tok.token_to_id(token) if token else None
            if token_id is not None:
                return int(token_id)
        raise ValueError(f"{path}: no end-of-document token found (tried {[t for t in wanted if t]}); "
                         "pass eos_token= to load_tokenizer")

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

    def decode(self, ids) -> str:
        return self._tok.decode(_as_ids(ids, self.vocab_size).tolist(), skip_special_tokens=True)


class SentencePieceTokenizer:
    """A SentencePiece .model. EOS: `eos_token` if given, else the model's own EOS piece. SentencePiece
    normalizes text (e.g. NFKC, whitespace), so decode(encode(s)) may differ from s."""

    def __init__(self, path: str | os.PathLike, eos_token: str | None = None):
        path = Path(path)
        self._sp = _require("sentencepiece", "sentencepiece", path).SentencePieceProcessor(model_file=str(path))
        self.name = f"spm:{path}"
        self.vocab_size = int(self._sp.get_piece_size())
        if eos_token is not None:
            eos_id = int(self._sp.piece_to_id(eos_token))
            if self._sp.id_to_piece(eos_id) != eos_token:
                raise ValueError(f"eos_token={eos_token!r}: not a piece of {path}")
        else:
            eos_id = int(self._sp.eos_id())
            if eos_id < 0:
                raise ValueError(f"{path}: the model has no EOS piece; pass eos_token= to load_tokenizer")
        self.eos_id = eos_id
        pad_id = int(self._sp.pad_id())
        self.pad_id = pad_id if pad_id >= 0 else None

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._sp.encode(text, out_type=int), dtype=np.int32)

    def decode(self, ids) -> str:
        return self._sp.decode(_as_ids(ids, self.vocab_size).tolist())


def load_tokenizer(path: str | os.PathLike | None, *, eos_token: str | None = None) -> Tokenizer:
    """None or "byte": `ByteTokenizer`; a `*.json` file: HF tokenizers; a `*.model` file: SentencePiece."""
    if path is None or path == "byte":
        return ByteTokenizer()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: tokenizer file not found (expected a tokenizer.json, a SentencePiece "
                                ".model, or None for the byte tokenizer)")
    if path.suffix == ".json":
        return HFTokenizer(path, eos_token)
    if path.suffix == ".model":
        return SentencePieceTokenizer(path, eos_token)
    raise ValueError(f"{path}: unknown tokenizer file type {path.suffix!r}; expected .json (HF tokenizers) "
                     "or .model (SentencePiece)")
