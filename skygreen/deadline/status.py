"""The deadline part of `skygreen status`: progress against the deadline, the policy's current
decision, and whether the watcher that acts on it is running; for a run with several places,
where it is and every move it made, with the policy's reason (`skygreen.places.journey`).

Progress and the decision are the watcher's latest poll (`watch.json` in the run's folder):
status does not decide anything itself, it shows what the watcher last saw and did. Time left
is counted on the watcher's clock now.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from skygreen.deadline.live import DeadlineTerms
from skygreen.deadline.watch_state import load_state, watcher_running
from skygreen.launch.registry import RunRecord
from skygreen.places.journey import journey_view


def deadline_status(record: RunRecord, *, run_dir: Path, now_s: float) -> dict[str, Any] | None:
    """The `deadline` object of `skygreen status --json`; None for a run without a deadline."""
    if record.deadline is None:
        return None
    terms = DeadlineTerms.from_json(record.deadline)
    state = load_state(run_dir)
    latest = state.latest
    running = watcher_running(run_dir)
    view: dict[str, Any] = {
        "policy": terms.policy,
        "deadline_h": terms.deadline_h,
        "deadline_at": datetime.fromtimestamp(terms.deadline_at_s, tz=timezone.utc).isoformat(timespec="seconds"),
        "elapsed_h": max((now_s - terms.started_at_s) / 3600.0, 0.0),
        "left_h": (terms.deadline_at_s - now_s) / 3600.0,
        "changeover_h": terms.changeover_h,
        "compute_h": latest.compute_h if latest else terms.compute_h,
        "progress_h": latest.progress_h if latest else None,
        "uniform_progress_h": latest.uniform_progress_h if latest else None,
        "slack_h": latest.slack_h if latest else None,
        "decision": latest.mode if latest else None,
        "current": latest.current if latest else None,
        "reason": latest.reason if latest else None,
        "decided_at_h": latest.elapsed_h if latest else None,
        "spot_available": latest.spot_available if latest else None,
        "switches": state.switches,
        "watcher": {
            "running": running,
            "pid": state.pid if running else None,
            "last_poll_ago_s": None if state.heartbeat_at_s is None else max(now_s - state.heartbeat_at_s, 0.0),
            "ended": state.ended,
            "outcome": state.outcome,
            "ended_at_h": state.ended_at_h,
        },
    }
    journey = journey_view(run_dir)  # a run with several places: where it is and why it moved
    if journey:  # the nomad holds a run with several places, whatever single-place policy it was given
        view["policy"] = "nomad"
    view["place"] = journey["place"] if journey else None
    view["place_mode"] = journey["place_mode"] if journey else None
    view["moving_to"] = journey["moving_to"] if journey else None
    view["moves"] = journey["moves"] if journey else []
    return view
