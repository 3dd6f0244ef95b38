"""File locks between skygreen's processes: one exclusive lock, and a look at whether it is held.

Every lock skygreen takes on a file goes through here: a run's relaunch lock, its deadline
watcher's lock, a simulated GPU board's state. The exclusive lock is `filelock.FileLock`
(`flock` on POSIX): the kernel drops it when its holder dies, however it dies, so a stale lock
never keeps anyone out, and the lock file stays in place so every taker locks the same inode.

`is_locked` looks without taking: a shared `flock` given back at once. Any number of
lookers can look at the same time, and while one looks an exclusive taker cannot get in, so a
taker that must not mistake a looker for a holder waits a moment (`wait_s`) rather than trying
once. `filelock` has no shared lock on the same primitive, which is why the look is its own
few lines here, beside the lock it looks at.

`filelock` is imported on first use (about 45 ms), off the CLI's start-up path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE_MODE = 0o644
POLL_INTERVAL_S = 0.01
"""How often a waiting taker tries again (filelock polls a non-blocking `flock`): short, because
ranks sharing a simulated board take its lock on every energy read."""


@contextlib.contextmanager
def exclusive_lock(path: Path, *, wait_s: float | None = None) -> Iterator[bool]:
    """Hold the exclusive lock on `path` for the block.

    Args:
        path: The lock file; it and its folder are made when missing, and left in place.
        wait_s: How long to keep trying: None waits as long as it takes, 0 tries once.

    Yields:
        True while the lock is held; False when another process (or another lock object in
        this one) still held it when `wait_s` ran out. The block runs either way, so the caller
        decides what a lock it did not get means.
    """
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, timeout=-1 if wait_s is None else max(wait_s, 0.0), mode=LOCK_FILE_MODE)
    try:
        lock.acquire(poll_interval=POLL_INTERVAL_S)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextlib.contextmanager
def held_while_alive(path: Path) -> Iterator[None]:
    """Hold the exclusive lock on `path` for the block, waiting for it, with `flock` alone:
    for a process that may start before `filelock` is installed (setup's prefetch on a fresh
    image). Others see it held with `is_locked` until the block ends or the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, LOCK_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def is_locked(path: Path) -> bool:
    """Whether a process (this one included) holds the exclusive lock on `path` now.

    Looks with a shared lock given back at once; a missing file is not held. A taker started
    during the look is kept out for that moment only, so it should wait for the lock rather than
    try once.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
