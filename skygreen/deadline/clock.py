"""The deadline watcher's clock: the wall clock, or a file a test moves by hand.

Deadlines are hours away, so an end-to-end test of `skygreen up --deadline` and
`skygreen watch` cannot wait for them. With `SKYGREEN_TEST_CLOCK_FILE=PATH`, "now" is the Unix
time written in PATH (a number of seconds), read at every call, so a test moves `up`, the
watcher and `status` through hours in one step while training runs in real time. Only the
deadline's own arithmetic reads this clock; the runtime and the ledger keep the real one.
`skygreen up` never renders the variable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from skygreen.errors import InputError

CLOCK_ENV = "SKYGREEN_TEST_CLOCK_FILE"


def now_s(environ: Mapping[str, str] | None = None) -> float:
    """Unix seconds: the test clock's when `SKYGREEN_TEST_CLOCK_FILE` is set, else the wall clock."""
    path = (os.environ if environ is None else environ).get(CLOCK_ENV)
    if not path:
        return time.time()
    try:
        return float(Path(path).read_text(encoding="utf-8").strip())
    except (OSError, ValueError) as e:
        raise InputError(
            f"{CLOCK_ENV}={path}: cannot read a number of seconds from it ({e})\n  fix: write Unix seconds there, or unset it"
        ) from e
