"""`python -m ssmgate.main` for many argument lists in one child process.

Each run of the entry point in its own interpreter pays Python's and JAX's start-up (about 3 s of
the 4-7 s a dry run takes on 2 cores). `run_many` starts one child that runs absl's `app.run` on
ssmgate.main's `main` once per argument list, with the flags reset in between, and returns for
each what a separate process would have given: the exit status, stdout and stderr (an uncaught
exception's traceback included). Use it for dry runs and start-up flag checks; runs that train,
are killed or need their own devices keep their own processes.

`patches` (one per argument list, or None) injects a fault into one run: Python code run in the
child before that run with `mp`, a pytest.MonkeyPatch undone after it (e.g. an os.write that
raises ENOSPC, or a stop request at step 6 as a SIGTERM would make one).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import contextlib, io, json, sys, traceback
import pytest
from absl import app, flags
import ssmgate.main

results = []
for argv, patch in json.loads(sys.stdin.read()):
    flags.FLAGS.unparse_flags()   # app.run re-parses on a rerun; values of the previous run must not leak
    out, err = io.StringIO(), io.StringIO()
    code = 0
    mp = pytest.MonkeyPatch()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if patch:
                exec(patch, {"mp": mp})
            app.run(ssmgate.main.main, argv=["ssmgate.main", *argv], flags_parser=ssmgate.main.parse_flags)
        except SystemExit as e:
            code = 0 if e.code is None else (e.code if isinstance(e.code, int) else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            mp.undo()
    results.append([code, out.getvalue(), err.getvalue()])
sys.stdout.write("\n=== results ===\n" + json.dumps(results))
"""


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_many(arg_lists: Sequence[Sequence[str]], env: dict | None = None, cwd: Path = REPO,
             patches: Sequence[str | None] | None = None) -> list[Result]:
    """One Result per argument list, in order."""
    patches = [None] * len(arg_lists) if patches is None else list(patches)
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps([[list(a), p] for a, p in
                                                                            zip(arg_lists, patches)]),
                          cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode != 0 or "\n=== results ===\n" not in proc.stdout:
        raise RuntimeError(f"the child running ssmgate.main failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    results = json.loads(proc.stdout.split("\n=== results ===\n")[-1])
    return [Result(*r) for r in results]


def dry_run_flag_files(paths: Sequence[Path]) -> dict[str, Result]:
    """`--dry_run` of each flag file (absolute or relative to the repository), keyed by str(path). The
    files share children by the --cpu_devices they set (none is a group too): the device count is
    fixed when JAX starts, so a child serves one count."""
    from ssmgate.reproduce import read_flags  # expands the files a flag file includes
    groups: dict[str | None, list] = {}
    for p in paths:
        groups.setdefault(read_flags(REPO / p).get("cpu_devices"), []).append(p)
    out = {}
    for group in groups.values():
        out.update(zip(map(str, group), run_many([[f"--flagfile={p}", "--dry_run"] for p in group])))
    return out
