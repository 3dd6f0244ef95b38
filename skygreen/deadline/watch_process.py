"""Start a run's deadline watcher in the background, as `skygreen up --deadline` does.

The watcher is the plain `skygreen watch RUN` command, detached from the terminal (its own
session, so closing the shell that ran `up` leaves it running), with its output appended to
`<run dir>/watch.log`. It inherits this environment, so it sees the same data folder, bucket
credentials and launcher as `up`. Starting it twice is harmless: the second one finds the run
watched and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from skygreen.deadline.watch_state import LOG_FILE

POLL_ENV = "SKYGREEN_WATCH_POLL"
"""How often the background watcher polls (a duration: `60s`, `5m`); default 60s."""


def start_watcher(run_id: str, *, registry_dir: Path) -> int:
    """Start `skygreen watch RUN` detached; returns its pid."""
    registry_dir.mkdir(parents=True, exist_ok=True)
    poll = os.environ.get(POLL_ENV) or "60s"
    with (registry_dir / LOG_FILE).open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "skygreen.cli", "watch", run_id, "--poll", poll],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    return child.pid
