"""UTC timestamps as skygreen writes them: ISO 8601 with a `Z`, and back to epoch seconds.

Run records (`skygreen.launch.registry`) stamp to the second; manifests stamp to the
microsecond, since several checkpoints can commit within a second.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now_iso(*, microseconds: bool = False) -> str:
    """Now in UTC, e.g. `2026-12-01T06:30:00Z` (or `...:00.123456Z`)."""
    pattern = "%Y-%m-%dT%H:%M:%S.%fZ" if microseconds else "%Y-%m-%dT%H:%M:%SZ"
    return datetime.now(timezone.utc).strftime(pattern)


def parse_iso_s(text: str) -> float:
    """Seconds since the epoch of a UTC time as written by `utc_now_iso`."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
