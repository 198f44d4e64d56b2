"""`python -m ssmgate.data prepare --corpus=CORPUS --split=train --tokenizer=byte --out=DIR [--max_tokens=N] [--workers=N]`

Tokenizes a corpus once into token shards (`ssmgate.data.prepare`). Run again with the same
arguments to finish a prepare that was killed; a finished one is only checked and opened.
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    from ssmgate.tasks.text_corpus import CORPUS_FORMS, SPLITS

    parser = argparse.ArgumentParser(prog="python -m ssmgate.data", description=__doc__.split("\n\n")[1])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("prepare", help="tokenize a corpus into token shards")
    p.add_argument("--corpus", required=True, help=f"the corpus: {CORPUS_FORMS}")
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--tokenizer", default="byte", help="'byte', or a HF tokenizer.json / SentencePiece .model file")
    p.add_argument("--out", required=True, help="the folder of the shards (created; resumed if a prepare started it)")
    p.add_argument("--max_tokens", type=int, default=None, help="cut the token stream here (default: all of it)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: every core)")
    p.add_argument("--tfds_data_dir", default=None, help="data_dir of prepared TFDS datasets (tfds: corpora)")
    p.add_argument("--text_key", default="book_text", help="text feature of tfds: corpora that name none")
    p.add_argument("--shard_mb", type=float, default=64.0, help="text per shard at most, in MiB")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Imported here, not at the top: spawned workers re-import this module and need none of it.
    from ssmgate.data.prepare import prepare
    from ssmgate.storage_error import StorageError, cause

    try:
        store = prepare(args.corpus, args.split, args.out, tokenizer=args.tokenizer, max_tokens=args.max_tokens,
                        workers=args.workers, data_dir=args.tfds_data_dir, text_key=args.text_key,
                        shard_bytes=max(1, int(args.shard_mb * (1 << 20))))
    except StorageError as e:  # a full disk, no permission, a shard that does not read back: names the file
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # making --out on a read-only filesystem, ...
        print(f"error: {e.filename or args.out}: {cause(e)}", file=sys.stderr)
        return 1
    print(f"{store.directory}: {len(store):,} tokens ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
