"""One shard's tokenization, the job of one prepare worker. Imports no JAX: the prepare's worker
processes start fresh (spawn) and should start fast."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ssmgate.data import pieces, shards
from ssmgate.tasks.tokenizers import Tokenizer, load_tokenizer


@functools.lru_cache(maxsize=2)
def _tokenizer(spec: str) -> Tokenizer:
    return load_tokenizer(spec)


def tokenize_piece(out: str, index: int, piece: list, tokenizer: str, max_tokens: int | None,
                   dtype: str, record_tokens: int) -> dict:
    """Tokenizes the documents of `piece` (each followed by EOS) into shard `index` of `out`, then
    writes its done-marker; returns the marker. With `max_tokens` it stops after the document that
    reaches that many tokens: no later token of this shard can be inside the stream's first
    max_tokens."""
    tok = _tokenizer(tokenizer)
    eos = np.array([tok.eos_id], np.int64)
    out_dir = Path(out)
    writer = shards.ShardWriter(out_dir / shards.shard_name(index), np.dtype(dtype), record_tokens)
    n_docs, cut = 0, False
    try:
        for doc in pieces.documents(piece):
            if max_tokens is not None and writer.tokens >= max_tokens:
                cut = True
                break
            writer.add(np.concatenate([np.asarray(tok.encode(doc), np.int64), eos]))
            n_docs += 1
        writer.close()
    except BaseException:
        writer.abort()
        raise
    done = {"index": index, "tokens": writer.tokens, "records": writer.records, "documents": n_docs,
            "stopped_at_max_tokens": cut, **shards.checksum(writer.path)}
    shards.write_json(out_dir / shards.done_name(index), done)
    return done


def tokenize_job(args: tuple) -> dict:
    """`tokenize_piece(*args)`, for Pool.imap_unordered."""
    return tokenize_piece(*args)
