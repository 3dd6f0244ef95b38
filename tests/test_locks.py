"""The one file-lock helper: an exclusive lock between processes, and a look that takes nothing.

The holder here is a real second process, gated by a line it prints once it holds the lock,
so no test races it; it is killed with SIGKILL to show the kernel drops the lock of a process
that dies without a word.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.locks import exclusive_lock, is_locked

HOLDER = """
import sys, time
from pathlib import Path
from skygreen.locks import exclusive_lock
with exclusive_lock(Path(sys.argv[1]), wait_s=0) as taken:
    print("held" if taken else "refused", flush=True)
    if taken:
        sys.stdin.readline()  # hold until told, or killed
"""


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock on `tmp_path/x.lock`; yields (path, process)."""
    path = tmp_path / "run" / "x.lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield path, proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=60)


def test_a_lock_held_elsewhere_is_refused_and_seen(holder):
    path, _ = holder
    assert is_locked(path) and is_locked(path)  # looking takes nothing
    with exclusive_lock(path, wait_s=0) as taken:
        assert taken is False
    with exclusive_lock(path, wait_s=0.2) as taken:
        assert taken is False


def test_the_kernel_drops_the_lock_of_a_process_killed_outright(holder):
    path, proc = holder
    proc.kill()
    proc.wait(timeout=60)
    assert path.exists() and not is_locked(path)
    with exclusive_lock(path, wait_s=0) as taken:
        assert taken is True
        assert is_locked(path)  # the look sees this process's own hold too
    assert not is_locked(path)


def test_a_waiting_taker_gets_the_lock_when_the_holder_lets_go(holder):
    path, proc = holder
    assert proc.stdin is not None
    proc.stdin.write("go\n")  # the holder leaves its block; this taker waits for as long as it takes
    proc.stdin.flush()
    with exclusive_lock(path) as taken:
        assert taken is True
    assert proc.wait(timeout=60) == 0


def test_a_lock_in_a_missing_folder_is_made_and_a_missing_file_is_not_held(tmp_path: Path):
    path = tmp_path / "a" / "b" / "launch.lock"
    assert not is_locked(path)
    with exclusive_lock(path, wait_s=0) as taken:
        assert taken and path.exists()
    with exclusive_lock(path, wait_s=0) as again:
        assert again  # released at the end of the block
