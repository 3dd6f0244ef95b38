"""The test session's guard against leftover processes: no process a test started may outlive it.

The session marks its own environment (`SESSION_MARK_ENV`, not a `SKYGREEN_` name, so
`helpers.user_env` keeps it); every subprocess a test starts inherits the mark, and so do theirs,
torchrun's workers in sessions of their own included. At the end, a marked process still alive
was left behind by some test: the session fails, names it, and ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import MutableMapping
from pathlib import Path

from skygreen.launch.local_launcher import marked_pids

SESSION_MARK_ENV = "TEST_SESSION_MARK"
GRACE_S = 30.0
"""How long processes already on their way out (a SIGTERM sent at a test's end) get to end."""


def mark_session(environ: MutableMapping[str, str]) -> str:
    """Give this session's environment its mark (unique on this machine); returns it.

    A pytest-xdist worker inherits the controller's mark and adds its own name to it: each
    worker's guard then sees only the processes its own tests started, never the ones another
    worker's tests are still running.
    """
    mark = environ.get(SESSION_MARK_ENV) or f"pytest-{os.getpid()}-{time.time_ns()}"
    worker = environ.get("PYTEST_XDIST_WORKER")
    if worker and not mark.endswith(f"-{worker}"):
        mark = f"{mark}-{worker}"
    environ[SESSION_MARK_ENV] = mark
    return mark


def leftovers(mark: str, *, grace_s: float = GRACE_S) -> list[str]:
    """The marked processes still alive after `grace_s` (polled, so usually no wait at all), each
    as `pid N: command line`; they are then killed, so that none outlives the session either."""
    deadline = time.monotonic() + grace_s
    while True:
        pids = [pid for pid in marked_pids(SESSION_MARK_ENV, mark) if pid != os.getpid() and not _sessions_own(pid)]
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    found = [f"pid {pid}: {_command(pid)}" for pid in pids]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return found


SESSION_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""The helpers `multiprocessing` starts for the test process itself (torch's DataLoader, a
`Queue`): each ends when the session's process does, so none is a test's leftover."""


def _sessions_own(pid: int) -> bool:
    """A `multiprocessing` helper of the session's own process (`SESSION_HELPERS`)."""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return ppid == os.getpid() and any(helper in _command(pid) for helper in SESSION_HELPERS)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"
