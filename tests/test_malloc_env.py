import os
import sys

import pytest

from ssmgate import malloc_env

OURS = "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"


def test_tunables_are_added_unless_the_user_named_them_and_removed_exactly():
    assert malloc_env.with_tunables("") == OURS
    assert malloc_env.with_tunables("glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2") == (
        "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2:glibc.malloc.mmap_max=0"
        ":glibc.malloc.trim_threshold=68719476736")
    assert malloc_env.with_tunables(OURS) == OURS
    assert malloc_env.without_tunables(malloc_env.with_tunables("glibc.malloc.hugetlb=0")) == "glibc.malloc.hugetlb=0"
    assert malloc_env.without_tunables("") == ""


@pytest.mark.parametrize("argv, module", [
    (["python", "-m", "ssmgate.main", "--flagfile=x"], "ssmgate.main"),
    (["python", "-u", "-X", "importtime", "-W", "ignore", "-m", "ssmgate.bench", "cores"], "ssmgate.bench"),
    (["python", "-u", "-mssmgate.reproduce"], "ssmgate.reproduce"),
    (["python", "-c", "import ssmgate", "-m", "ssmgate.main"], None),
    (["python", "script.py", "-m", "ssmgate.main"], None),
    (["python", "-m"], None),
])
def test_entry_module(argv, module):
    assert malloc_env.entry_module(argv) == module


def test_only_the_entry_points_re_execute_and_only_once():
    argv = ["python", "-m", "ssmgate.main", "--dry_run"]
    env = malloc_env.reexec_env(argv, {"PATH": "/bin"}, "glibc")
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": OURS}
    assert malloc_env.reexec_env(argv, env, "glibc") is None               # after the re-execution
    assert malloc_env.reexec_env(argv, {"SSMGATE_MALLOC_TUNING": "0"}, "glibc") is None
    assert malloc_env.reexec_env(argv, {}, "") is None                      # not glibc (musl, macOS)
    assert malloc_env.reexec_env(["python", "-m", "pytest"], {}, "glibc") is None


def test_reexec_if_needed_replaces_the_process_with_the_same_command_line(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: calls.append((path, argv, env)))
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "ssmgate.reproduce", "--scale=quick"])
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SSMGATE_MALLOC_TUNING", raising=False)
    monkeypatch.setattr(malloc_env.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(sys, "platform", "linux")
    malloc_env.reexec_if_needed()
    assert len(calls) == 1
    path, argv, env = calls[0]
    assert path == sys.executable and argv == ["python", "-m", "ssmgate.reproduce", "--scale=quick"]
    assert env["GLIBC_TUNABLES"] == OURS
