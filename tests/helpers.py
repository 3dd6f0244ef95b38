"""Small helpers the test modules share: polling for a condition, running the CLI in-process."""

from __future__ import annotations

import time
from collections.abc import Callable
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
