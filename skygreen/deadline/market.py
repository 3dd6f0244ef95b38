"""Spot availability replayed from a trace, for a local run held to a deadline.

A local run has no spot market. With `SKYGREEN_TEST_SPOT_TRACE=FILE` (any trace
`skygreen simulate` reads, e.g. one of the real AWS V100 or GCP H100 traces, or a scripted one),
the deadline watcher reads spot availability from the trace instead, its first tick at the
run's start on the watcher's clock (`skygreen.deadline.clock`): tests and demos move a local
run through a real market's outages. As in the simulator, a tick has spot when all the gang's
nodes are available, and after the trace ends spot is unavailable. The market only answers
"is spot available now"; preempting the run when it is not is the cloud's act (a test's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skygreen.plan.replay import SpotTrace

TRACE_ENV = "SKYGREEN_TEST_SPOT_TRACE"


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceMarket:
    """A trace laid over a run's time: tick i covers [start + i x gap, start + (i+1) x gap)."""

    trace: SpotTrace
    started_at_s: float
    nodes: int = 1

    def available(self, now_s: float) -> bool:
        """Whether all `nodes` of the gang have spot at `now_s` (Unix seconds)."""
        tick = int((now_s - self.started_at_s) // self.trace.gap_s)
        if tick < 0 or tick >= len(self.trace.counts):
            return False
        return self.trace.counts[tick] >= self.nodes


def single_trace(environ: Mapping[str, str]) -> str | None:
    """The trace `SKYGREEN_TEST_SPOT_TRACE` names, unless it is a multi-region market (the nomad
    watcher reads that one itself, `skygreen.places.watcher`); None when unset."""
    path = environ.get(TRACE_ENV)
    if not path:
        return None
    from skygreen.places.traces import is_market

    return None if is_market(Path(path)) else path
