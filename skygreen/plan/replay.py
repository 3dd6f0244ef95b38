"""Replay a checkpointed run over a real spot trace, to check the cost model's spot overhead.

The planner prices spot offers with an expected-value model (`skygreen.plan.cost.estimate`): a
preemption rate per running hour, a restart time, and half a checkpoint interval of lost work
per preemption. This module plays the same run against a recorded sequence of spot lifetimes
instead, so the model's assumptions (the default rates above all) can be measured against
real preemptions (`../shared/spot-traces`; `benchmarks/bench_spot_model.py`).

A trace is a list of 0/1 ticks `gap_s` apart, 1 = the spot instance is alive (the
spot-traces convention). Only alive time is billed: while the trace shows 0 the job waits
(or, with SkyPilot, moves elsewhere), which costs time but no instance-hours.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skygreen.timestamps import parse_iso_s


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceStats:
    """How long a trace was alive and how often it was preempted, to set against the model's rate."""

    alive_hours: float
    preemptions: int
    """Alive -> dead transitions (the last alive run, cut by the end of the trace, is not one)."""

    @property
    def preemptions_per_alive_hour(self) -> float:
        """The observed rate, per hour alive like `checkpoint.interval.PREEMPTION_RATE_PER_HOUR`;
        0.0 for a trace never alive."""
        return self.preemptions / self.alive_hours if self.alive_hours else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayResult:
    """What one replayed run took: the alive time it used and the lifetimes that ended under it."""

    billed_s: float
    """Alive time used: restarts, compute (including work later lost), saves."""
    preemptions: int


def alive_runs_s(ticks: Sequence[int], gap_s: float) -> list[float]:
    """Lengths in seconds of the runs of alive ticks, in order."""
    runs, current = [], 0
    for alive in ticks:
        if alive:
            current += 1
        elif current:
            runs.append(current * gap_s)
            current = 0
    if current:
        runs.append(current * gap_s)
    return runs


def trace_stats(ticks: Sequence[int], gap_s: float) -> TraceStats:
    """Alive hours and preemptions of ticks `gap_s` seconds apart (any nonzero tick is alive)."""
    preemptions = sum(1 for before, after in itertools.pairwise(ticks) if before and not after)
    return TraceStats(alive_hours=sum(1 for t in ticks if t) * gap_s / 3600.0, preemptions=preemptions)


def replay_run(
    lifetimes_s: Sequence[float],
    *,
    work_s: float,
    interval_s: float,
    save_s: float,
    restart_s: float,
    first: int = 0,
) -> ReplayResult:
    """Run `work_s` of compute over successive spot lifetimes, starting with lifetime `first`
    (wrapping around), checkpointing after every `interval_s` of compute at `save_s` each.

    Each lifetime after the first begins with `restart_s` of provisioning and resume; when a
    lifetime ends, the work since the last committed checkpoint is lost.
    """
    if work_s <= 0 or interval_s <= 0 or not lifetimes_s:
        raise ValueError("work_s and interval_s must be > 0 and the trace must have an alive run")
    committed_s, billed_s = 0.0, 0.0
    for k in range(first, first + 100_000 * len(lifetimes_s)):
        lifetime_s = lifetimes_s[k % len(lifetimes_s)]
        used_s = min(restart_s, lifetime_s) if k > first else 0.0
        progress_s = committed_s
        while used_s < lifetime_s:
            chunk_s = min(interval_s, work_s - progress_s)
            if used_s + chunk_s > lifetime_s:
                break
            used_s += chunk_s
            progress_s += chunk_s
            if progress_s >= work_s:
                return ReplayResult(billed_s=billed_s + used_s, preemptions=k - first)
            if used_s + save_s > lifetime_s:
                break
            used_s += save_s
            committed_s = progress_s
        billed_s += lifetime_s
    raise ValueError("the run makes no progress on this trace (lifetimes shorter than a restart plus an interval)")


# ---------------------------------------------------------------- reading trace files
#
# Every availability format under `../shared/spot-traces` reads into one `SpotTrace`:
# - spot-traces JSON (`{"metadata": {"gap_seconds": G, ["nodes": N]}, "data": [...], ["prices": [...]]}`),
#   availability and preemption files alike, 1-node (0/1) and N-node (0..N) counts;
# - the derived GCP H100 capacity CSV (`scheduled_at_utc, run_id, <zone columns of 0..16>`), one zone;
# - the SkyNomad timestamped CSVs (`date,availability`).
# All use 1 (or a count) = spot available; nothing here inverts anything.

_INSTANCE_BY_NAME: Mapping[tuple[str, str], tuple[str, str | None, int]] = {
    ("aws", "v100_1"): ("p3.2xlarge", "V100", 1),
    ("aws", "v100_8"): ("p3.16xlarge", "V100", 8),
    ("aws", "k80_1"): ("p2.xlarge", "K80", 1),
    ("aws", "k80_8"): ("p2.8xlarge", "K80", 8),
    ("aws", "intel_64"): ("r5.16xlarge", None, 0),
    ("gcp", "c3-88"): ("c3-highcpu-88", None, 0),
    ("gcp", "h100_1"): ("a3-highgpu-1g", "H100", 1),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SpotTrace:
    """Spot capacity over time in one zone: `counts[i]` instances were available (or alive) at
    `i x gap_s` seconds after the start."""

    name: str
    gap_s: float
    counts: tuple[int, ...]
    nodes: int | None = None
    """`metadata.nodes` when the file has it."""
    spot_prices_usd_per_hour: tuple[float, ...] | None = None
    cloud: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    """What was probed, when the file's name or path says so (e.g. p3.2xlarge)."""
    accelerator: str | None = None
    accelerator_count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            raise ValueError(f"{self.name}: the trace has no ticks")
        if not (self.gap_s > 0 and math.isfinite(self.gap_s)):
            raise ValueError(f"{self.name}: gap_seconds must be > 0, got {self.gap_s}")

    @property
    def span_h(self) -> float:
        """Hours the trace covers: its number of ticks times `gap_s`."""
        return len(self.counts) * self.gap_s / 3600.0

    @property
    def region(self) -> str | None:
        """The zone's region: us-east-1a -> us-east-1, us-central1-a -> us-central1."""
        if self.zone is None:
            return None
        if self.cloud == "gcp":
            return self.zone.rsplit("-", 1)[0]
        return self.zone[:-1] if self.zone[-1:].isalpha() else self.zone

    def available(self, nodes: int = 1) -> list[int]:
        """1 where all `nodes` of a gang were available (the polarization rule), else 0."""
        return [1 if c >= nodes else 0 for c in self.counts]


def trace_zones(path: str | Path) -> tuple[str, ...]:
    """The zones a multi-zone CSV holds (empty for single-zone files)."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        return ()
    with open(path, newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), [])
    return tuple(h for h in header if h not in ("scheduled_at_utc", "run_id", "date", "availability"))


def load_trace(path: str | Path, *, zone: str | None = None) -> SpotTrace:
    """Read one zone's trace from any of the formats above; `ValueError` says what is wrong."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        return _load_json_trace(path)
    if path.suffix.lower() == ".csv":
        return _load_csv_trace(path, zone)
    raise ValueError(f"{path}: unknown trace format (expected a spot-traces .json or a capacity .csv)")


def _describe(path: Path, stem: str) -> dict:
    """Cloud, zone and instance from names such as `aws-02-15-2023/us-east-1a_v100_1.json`."""
    cloud = next((c for c in ("aws", "gcp", "azure") if any(p.startswith(c) for p in path.parts)), None)
    zone, _, kind = stem.partition("_")
    if cloud is None and any(k == kind for c, k in _INSTANCE_BY_NAME if c == "aws"):
        cloud = "aws"  # the SkyNomad copies of the AWS probes keep the file names, not the cloud
    info: dict = {"cloud": cloud, "zone": zone or None}
    known = _INSTANCE_BY_NAME.get((cloud or "", kind))
    if known:
        info["instance_type"], info["accelerator"], info["accelerator_count"] = known
    return info


def _load_json_trace(path: Path) -> SpotTrace:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        meta = raw.get("metadata", {})
        counts = tuple(int(v) for v in raw["data"])
        gap_s = float(meta["gap_seconds"])
        prices = tuple(float(p) for p in raw["prices"]) if raw.get("prices") else None
        nodes = int(meta["nodes"]) if meta.get("nodes") is not None else None
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a spot-traces JSON file ({e.__class__.__name__}: {e})") from None
    if any(c < 0 for c in counts):
        raise ValueError(f"{path}: negative instance counts")
    return SpotTrace(
        name=str(path),
        gap_s=gap_s,
        counts=counts,
        nodes=nodes,
        spot_prices_usd_per_hour=prices,
        **_describe(path, path.stem),
    )


def _load_csv_trace(path: Path, zone: str | None) -> SpotTrace:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: the CSV has no rows")
    header = list(rows[0])
    if header == ["date", "availability"]:  # SkyNomad per-zone CSV
        times = [parse_iso_s(r["date"]) for r in rows]
        counts = tuple(int(float(r["availability"])) for r in rows)
        return SpotTrace(name=str(path), gap_s=_median_gap_s(times, path), counts=counts, **_describe(path, path.stem))
    zones = trace_zones(path)
    if zone is None or zone not in zones:
        raise ValueError(f"{path}: name one of its zones ({', '.join(zones)}); got {zone!r}")
    times = [parse_iso_s(r["scheduled_at_utc"]) for r in rows]
    counts = tuple(int(r[zone]) for r in rows)
    cloud = "gcp" if "gcp" in path.name else None
    gpu = "h100_1" if "a3-highgpu-1g" in path.name else ""
    return SpotTrace(
        name=f"{path}:{zone}",
        gap_s=_median_gap_s(times, path),
        counts=counts,
        **{**_describe(Path(cloud or ""), f"{zone}_{gpu}"), "cloud": cloud},
    )


def _median_gap_s(times: Sequence[float], path: Path) -> float:
    """Probe rounds are scheduled every gap seconds; a missed round stays one tick (the last
    state held), as the SkyNomad converter does."""
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    if not gaps or gaps[len(gaps) // 2] <= 0:
        raise ValueError(f"{path}: cannot tell the probe interval from the timestamps")
    return gaps[len(gaps) // 2]
