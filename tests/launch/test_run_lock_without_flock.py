"""The run lock on cluster filesystems without flock (Lustre mounted without it: ENOSYS; NFSv3
without lockd: ENOLCK), simulated by an fcntl.flock that raises those: the lock falls back to an
O_EXCL lock file with the holder's pid, host and SLURM job, refuses a second holder by name, and
takes over a file whose holder is provably gone (a dead pid here, an earlier start of this SLURM job)."""
import errno
import fcntl
import json
import os
import subprocess
import sys

import pytest

from ssmgate.train.run_dir import RunDir
from ssmgate.train.run_lock import EXCL_NAME, RunDirBusy, RunLock


@pytest.fixture(params=[errno.ENOSYS, errno.ENOLCK], ids=["lustre_ENOSYS", "nfs3_ENOLCK"])
def no_flock(request, monkeypatch):
    def flock(fd, op):
        raise OSError(request.param, os.strerror(request.param))
    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return request.param


def write_holder(path, **holder):
    path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "since": "2026-01-01 00:00:00", "slurm_job": None,
                                **holder}))


def test_without_flock_the_lock_is_an_exclusive_file_that_names_its_holder(tmp_path, no_flock, capsys):
    rd = RunDir(tmp_path)
    with RunLock(rd):
        holder = json.loads((tmp_path / EXCL_NAME).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunDirBusy, match=rf"in use by pid {os.getpid()} on .* \(lock file .*{EXCL_NAME}; this "
                                             rf"filesystem has no flock\); wait for that run to end, or delete"):
            with RunLock(rd):
                pass
    assert not (tmp_path / EXCL_NAME).exists()  # released
    assert f"has no flock ({errno.errorcode[no_flock]}): locking it with" in capsys.readouterr().out


def test_a_lock_file_left_by_a_dead_process_or_an_earlier_start_of_the_job_is_taken_over(tmp_path, no_flock,
                                                                                           monkeypatch, capsys):
    rd = RunDir(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_holder(tmp_path / EXCL_NAME, pid=int(dead.stdout), host=os.uname().nodename)
    with RunLock(rd):
        assert json.loads((tmp_path / EXCL_NAME).read_text())["pid"] == os.getpid()
    assert "its process is gone" in capsys.readouterr().out
    write_holder(tmp_path / EXCL_NAME, slurm_job="4242")  # another node, killed hard; SLURM requeued the job
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with RunLock(rd):
        assert json.loads((tmp_path / EXCL_NAME).read_text())["slurm_job"] == "4242"
    assert "it was an earlier start of this SLURM job 4242" in capsys.readouterr().out
    write_holder(tmp_path / EXCL_NAME, slurm_job="17")  # another job on another host: cannot tell, so refused
    with pytest.raises(RunDirBusy, match=r"in use by pid 1 on elsewhere since .*delete .* if it is gone"):
        with RunLock(rd):
            pass
    assert (tmp_path / EXCL_NAME).exists()
