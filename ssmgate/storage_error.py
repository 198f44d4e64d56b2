"""The one error type of a file a run could not write or read: a full disk (ENOSPC), a read-only
filesystem (EROFS), no permission (EACCES), a corrupted data file. Its message is one line that
names the path, the cause and what is intact; `ssmgate.main` prints it and exits with status 1.
"""
from __future__ import annotations

import errno
import os
import re


class StorageError(OSError):
    """A file of the run could not be written or read; the message names the path, the cause and
    what is intact."""


_NAMED = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EIO)
_CODE = re.compile(r"os_error_code='?(\d+)")  # how tensorstore (orbax's writer) reports the OS error


def _chain(e: BaseException):
    """`e`, its causes and contexts, and the members of exception groups, depth first."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [x.__cause__, x.__context__, *getattr(x, "exceptions", ())]


def cause(e: BaseException) -> str:
    """The OS reason behind `e`, e.g. 'No space left on device (ENOSPC)', found in its chain of
    causes (an OSError's errno, or the code tensorstore writes into its message); else the
    first line of `e`, with its type."""
    for x in _chain(e):
        code = x.errno if isinstance(x, OSError) and isinstance(x.errno, int) else None
        found = _CODE.search(str(x))
        code = code if code is not None else (int(found[1]) if found else None)
        if code:
            return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"
    for code in _NAMED:  # C++ writers (ArrayRecord's) give the OS text without its number
        if any(os.strerror(code) in str(x) for x in _chain(e)):
            return f"{os.strerror(code)} ({errno.errorcode[code]})"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:300]}"
