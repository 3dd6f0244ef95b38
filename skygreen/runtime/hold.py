"""A gate that holds a run at chosen steps, so whatever kills a run (a test, the demo) never races it.

On a loaded machine a short run can finish before a test's kill lands. With
`SKYGREEN_TEST_HOLD_AT_STEPS=120,240` the runtime, on reaching step 120, commits a checkpoint
and then waits there until it is killed, sent SIGTERM, or released: a test that waits for the
run's status to read step 120 knows exactly where the run is when it acts. With
`SKYGREEN_TEST_HOLD_RELEASE=DIR`, the file `DIR/120` releases the hold at step 120.
`SKYGREEN_TEST_HOLD_UNCOMMITTED_AT_STEPS=150` holds the same way at step 150 without a commit
first: a kill there loses the steps trained since the last checkpoint, which the next life
trains again (its ledger's `redone_steps`). Set by
tests and by `skygreen demo` (its simulated preemption lands at a known step); `skygreen up`
never renders either variable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from skygreen.task.settings import decode

HOLD_ENV = "SKYGREEN_TEST_HOLD_AT_STEPS"
HOLD_UNCOMMITTED_ENV = "SKYGREEN_TEST_HOLD_UNCOMMITTED_AT_STEPS"
RELEASE_ENV = "SKYGREEN_TEST_HOLD_RELEASE"
POLL_S = 0.05

log = logging.getLogger("skygreen.runtime")


def hold_steps(environ: Mapping[str, str], name: str = HOLD_ENV) -> frozenset[int]:
    """The steps named by the variable `name` (comma-separated), empty when unset."""
    raw = environ.get(name, "").strip()
    if not raw:
        return frozenset()
    return frozenset(decode(raw, tuple[int, ...], name))


def hold(step: int, *, stopped: Callable[[], bool], environ: Mapping[str, str]) -> None:
    """Wait at `step` until `stopped()` (a SIGTERM arrived) or its release file exists."""
    release_dir = environ.get(RELEASE_ENV)
    release = Path(release_dir) / str(step) if release_dir else None
    log.warning("held at step %d (%s); waiting to be killed, stopped or released", step, HOLD_ENV)
    while not stopped() and not (release is not None and release.exists()):
        time.sleep(POLL_S)
