"""What a deadline watcher remembers between polls, in the run's folder, and whether one runs.

`<run dir>/watch.json` holds the spot availability the watcher has seen, its recent decisions,
the job it cancelled to switch capacity (until the relaunch), and a heartbeat; the user's
`skygreen cancel` leaves its own marker beside it (`USER_CANCEL_FILE`). Everything else it needs is re-read every poll (the record, the ledger, the job's
state), so a watcher that dies and restarts picks up where the last one stood.

One watcher per run: it holds the exclusive lock (`skygreen.locks`) on `<run dir>/watch.lock`
for its whole life; the kernel drops the lock when the process dies, however it dies, so a
stale lock cannot keep a restart out and `skygreen status` can ask whether one is running.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from skygreen.deadline.live import Availability, Decision
from skygreen.deadline.policy import Mode
from skygreen.files import write_atomic
from skygreen.locks import exclusive_lock, is_locked

STATE_FILE = "watch.json"
LOCK_FILE = "watch.lock"
LOG_FILE = "watch.log"
USER_CANCEL_FILE = "cancelled-by-user"
"""Written by the user's `skygreen cancel` of a run with a deadline: its watcher stops, even when
the run was already stopped between two of the watcher's switches."""
KEEP_DECISIONS = 200
"""Decisions kept in the file (the latest); a poll a minute keeps the last few hours."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchState:
    """The watcher's memory of one run."""

    availability: Availability = field(default_factory=Availability)
    decisions: tuple[Decision, ...] = ()
    cancelled_job: str | None = None
    """The job the watcher cancelled to switch capacity, until it relaunches the run (the cancel
    and the relaunch count as one switch); None when no switch is half done."""
    relaunched_job: str | None = None
    """The job of the watcher's latest relaunch, and when it made it (its clock): a spot job
    still provisioning within one changeover of its launch is not yet an outage."""
    relaunched_at_s: float | None = None
    switches: int = 0
    """Capacity changes the watcher made (each cancel-and-relaunch, and each relaunch of a stopped run)."""
    pid: int | None = None
    heartbeat_at_s: float | None = None
    """The watcher's clock at its latest poll."""
    ended: str | None = None
    """Why the watcher stopped for good (the run completed, failed, or was cancelled by the user)."""
    outcome: str | None = None
    """`ended` in a few words for the table of runs: `deadline met`, `missed by 0.50 h`, `failed`,
    `stopped at budget`, `cancelled`."""
    ended_at_h: float | None = None
    """Hours from the run's start, on the watcher's clock, when the run ended (a completed run: from its ledger)."""

    @property
    def latest(self) -> Decision | None:
        """The most recent decision, None before the first."""
        return self.decisions[-1] if self.decisions else None

    def with_decision(self, decision: Decision) -> WatchState:
        """This state with one more decision (the oldest dropped beyond `KEEP_DECISIONS`)."""
        return replace(self, decisions=(*self.decisions, decision)[-KEEP_DECISIONS:])

    def to_json(self) -> dict[str, Any]:
        """The `watch.json` object."""
        return {
            "availability": [list(change) for change in self.availability.changes],
            "decisions": [d.to_json() for d in self.decisions],
            "cancelled_job": self.cancelled_job,
            "relaunched_job": self.relaunched_job,
            "relaunched_at_s": self.relaunched_at_s,
            "switches": self.switches,
            "pid": self.pid,
            "heartbeat_at_s": self.heartbeat_at_s,
            "ended": self.ended,
            "outcome": self.outcome,
            "ended_at_h": self.ended_at_h,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WatchState:
        """Back from `to_json`."""
        changes = tuple((float(at), bool(up)) for at, up in data.get("availability") or ())
        return cls(
            availability=Availability(changes=changes),
            decisions=tuple(Decision.from_json(d) for d in data.get("decisions") or ()),
            cancelled_job=data.get("cancelled_job"),
            relaunched_job=data.get("relaunched_job"),
            relaunched_at_s=_number(data.get("relaunched_at_s"), float),
            switches=int(data.get("switches") or 0),
            pid=_number(data.get("pid"), int),
            heartbeat_at_s=_number(data.get("heartbeat_at_s"), float),
            ended=data.get("ended"),
            outcome=data.get("outcome"),
            ended_at_h=_number(data.get("ended_at_h"), float),
        )


def _number(value: Any, kind: type[int] | type[float]) -> Any:
    """`value` as `kind`, None kept; anything else raises ValueError or TypeError."""
    return None if value is None else kind(value)


def load_state(run_dir: Path) -> WatchState:
    """The saved state; a fresh one when there is none or it cannot be read (the watcher
    then learns availability again, which costs nothing but the history)."""
    try:
        return WatchState.from_json(json.loads((run_dir / STATE_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # AttributeError: JSON, not an object
        return WatchState()


def save_state(run_dir: Path, state: WatchState) -> None:
    """Write the state atomically (a reader never sees half a file)."""
    write_atomic(run_dir / STATE_FILE, json.dumps(state.to_json(), indent=1) + "\n")


LOCK_WAIT_S = 2.0
"""How long a starting watcher tries for the lock: `skygreen status` takes it (shared) for a
moment to see whether a watcher runs, and a watcher started at that moment must not take the
status for a second watcher and leave the run unguarded."""


@contextlib.contextmanager
def watcher_lock(run_dir: Path, *, wait_s: float = LOCK_WAIT_S) -> Iterator[bool]:
    """Hold the run's watcher lock (exclusive) for the block, trying for `wait_s`; yields False
    when another process still holds it then (a watcher holds it as long as it runs)."""
    with exclusive_lock(run_dir / LOCK_FILE, wait_s=wait_s) as taken:
        yield taken


def watcher_running(run_dir: Path) -> bool:
    """Whether a watcher holds the run's lock now. Looks with a shared lock, given back at once:
    any number of lookers at a time, and a watcher starting meanwhile waits for it (`LOCK_WAIT_S`)."""
    return is_locked(run_dir / LOCK_FILE)


def switching_to_spot(run_dir: Path, job_id: str | None) -> bool | None:
    """The capacity the watcher is moving the run to, when it cancelled `job_id` (the run's latest
    job) and has not relaunched it yet: True for spot (or waiting for spot), False for on-demand;
    None when no switch of that job is half done. A relaunch in between (the user's `resume`)
    goes there, so the watcher does not have to undo it with one more changeover."""
    state = load_state(run_dir)
    latest = state.latest
    if job_id is None or state.cancelled_job != job_id or latest is None:
        return None
    return latest.mode != Mode.ON_DEMAND.value


def mark_user_cancel(run_dir: Path) -> None:
    """Record that the user cancelled the run (its watcher ends at its next poll)."""
    write_atomic(run_dir / USER_CANCEL_FILE, "cancelled by the user\n")


def user_cancelled(run_dir: Path) -> bool:
    """Whether the user cancelled the run since it was last launched by the user."""
    return (run_dir / USER_CANCEL_FILE).exists()


def clear_user_cancel(run_dir: Path) -> None:
    """Forget a user's cancel: the user relaunched the run (`skygreen resume`)."""
    (run_dir / USER_CANCEL_FILE).unlink(missing_ok=True)
