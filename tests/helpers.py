"""Small helpers the test modules share: polling for a condition, running the CLI in-process, the
environment of a user with a home of their own."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from skygreen.cli import main

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout_s: float = 240, poll_s: float = 0.3) -> T:
    """The first truthy value of `predicate()`, polled every `poll_s`; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def cli(capsys: Any, *args: str) -> tuple[int, str, str]:
    """`skygreen ARGS` in this process: (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def user_env(home: Path, *, drop: tuple[str, ...] = ("SKYGREEN_",), **extra: str) -> dict[str, str]:
    """The environment a `skygreen` subprocess gets: this process's without any variable starting
    with one of `drop` (each test sets the skygreen settings it means), HOME and XDG_DATA_HOME in
    `home`, one OpenMP thread (two cores, several processes), then `extra`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    environ.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local" / "share"), OMP_NUM_THREADS="1")
    environ.update(extra)
    return environ


def end_processes_of(home: Path) -> list[int]:
    """SIGKILL every process a test started in its private `home` (each inherits that HOME from
    `user_env`); returns their pids. Never a pid read from a run's files: once that process has
    ended the number may name another test's process (pids wrap at 32768 here, and the suite
    starts thousands), and two pytest-xdist workers run tests side by side."""
    from skygreen.launch.local_launcher import marked_pids

    pids = [pid for pid in marked_pids("HOME", str(home)) if pid != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def fake_cloud_env(home: Path, fake_dir: Path) -> dict[str, str]:
    """`user_env` of a user whose cloud is `skygreen.testing.FakeLauncher` (its jobs kept in
    `fake_dir`) and whose S3 is the test's moto server (this process's `AWS_*` variables, set by
    the `s3_bucket` fixture)."""
    environ = user_env(home, SKYGREEN_LAUNCHER="skygreen.testing:FakeLauncher")
    environ.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    environ["SKYGREEN_FAKE_LAUNCHER_DIR"] = str(fake_dir)
    return environ


def cloud_task(folder: Path, bucket: str) -> Path:
    """A small cloud task (one L4) checkpointing to `s3://BUCKET/runs`, written into `folder`."""
    path = folder / "cloud.yaml"
    path.write_text(
        f"name: cloud\nskygreen: {{gpus: [L4], checkpoint: {{bucket: s3://{bucket}/runs}}}}\nrun: python train.py\n"
    )
    return path
