"""Sharded text data: corpora tokenized once into token shards, read per process by a grain loader.

- `files`: the `files:<glob>[#<key>]` corpus (plain-text and JSON-lines files).
- `pieces`: a corpus listed and cut into pieces that workers tokenize on their own.
- `shards`: the on-disk format (ArrayRecord token shards, plan, done-markers, manifest).
- `shard_worker`: one shard's tokenization. `prepare`: all of them, parallel and resumable
  (`python -m ssmgate.data prepare ...`).
- `store`: random access to a prepared token stream. `loader`: the training batches of step k, a
  function of (seed, k), each process reading only its share (`docs/data.md`).

Submodules are imported where used: `text_corpus.open_corpus` imports `files` lazily, and this
package imports nothing on its own.
"""
