"""A team's spend: every run this machine knows and every run found in shared buckets, priced
from their ledgers, in one table (`skygreen cost --all`).

Teams share buckets, so a run launched on another machine is found by its ledger
(`<bucket>/<run_id>/ledger/...`) even though this machine's registry never heard of it; a run
found both ways counts once (run ids are unique: task, launch second and a random suffix).
Runs still going count up to their last ledger update. Each run is priced by
`pricing.run_cost`, the function behind `cost RUN`, so the totals here and there agree.

Composition: the registry and the buckets say which runs exist, `skygreen.ledger` reads and
prices them, and the pure `summarise` groups the priced runs.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skygreen.checkpoint.store import OpenStore
from skygreen.errors import SpecError, StoreError
from skygreen.launch.launcher import settled_state
from skygreen.launch.registry import Registry, RunRecord
from skygreen.ledger.pricing import RunCost, SegmentCost, run_cost
from skygreen.ledger.records import Segment, is_segment_key

GROUPINGS: tuple[str, ...] = ("task", "cloud", "gpu", "user")
UNKNOWN = "unknown"
THIS_MACHINE = "this machine"
_RUN_STAMP = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{4}\Z")
_RUN_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}\Z")


# ---------------------------------------------------------------- input


def read_grouping(value: str | None) -> str | None:
    """`--by`'s value, lower-cased; None when not given.

    Raises:
        SpecError: a value other than task, cloud, gpu or user (exit 2), naming the choices.
    """
    if value is None:
        return None
    by = value.strip().lower()
    if by not in GROUPINGS:
        raise SpecError("--by", "unknown grouping", value=value, allowed=" | ".join(GROUPINGS),
                        hint="e.g. --by user")  # fmt: skip
    return by


def read_since_s(value: str | None) -> float | None:
    """`--since`'s value in seconds (`30d`, `12h`, `2w`, read by `fields.read_duration_s`); None when not given.

    Raises:
        SpecError: not a positive duration with a unit (exit 2).
    """
    if value is None:
        return None
    from skygreen.task.readers import read_duration_s

    try:
        return read_duration_s(value, "--since")
    except SpecError as e:
        raise SpecError("--since", e.problem, value=value, allowed="90s | 5m | 12h | 30d | 2w",
                        hint="give a window with its unit, e.g. --since 30d") from None  # fmt: skip


def read_buckets(urls: Iterable[str]) -> tuple[str, ...]:
    """The `--bucket` URLs, checked by the one bucket parser, each once, in the order given.

    Raises:
        SpecError: a URL the parser refuses (unknown scheme, a look-alike such as `s3//team`), or
            a local directory that does not exist (a typo must not read as "no runs"), naming
            `--bucket`, the value and the fix.
    """
    from skygreen.checkpoint.bucket_url import parse_url

    out: list[str] = []
    for url in urls:
        try:
            parsed = parse_url(url, field="--bucket")
        except SpecError as e:
            if e.hint:
                raise
            raise SpecError("--bucket", e.problem, value=url, allowed=e.allowed,
                            hint="give the shared bucket as s3://BUCKET/PREFIX or gs://BUCKET/PREFIX") from None  # fmt: skip
        if parsed.scheme == "file" and not Path(parsed.bucket).expanduser().is_dir():
            raise SpecError("--bucket", "no such directory on this machine", value=url,
                            hint="give the folder that holds the runs' folders, or s3://BUCKET/PREFIX")  # fmt: skip
        cleaned = url.strip().rstrip("/")
        if cleaned not in out:
            out.append(cleaned)
    return tuple(out)


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, kw_only=True, slots=True)
class SpentRun:
    """One run's spend and where it was found."""

    run_id: str
    task: str
    user: str
    state: str
    """The registry's last known state here (SUCCEEDED once the ledger says training is done,
    `launcher.settled_state`); for a bucket-only run, its last segment's end."""
    found_in: tuple[str, ...]
    """`this machine` and/or the bucket URLs that hold its ledger."""
    cost: RunCost

    @property
    def last_at(self) -> float:
        """The run's last ledger time (its end, or last update while it runs)."""
        return max(sc.segment.last_at for sc in self.cost.segments)

    @property
    def running(self) -> bool:
        """Whether its latest segment has not ended (still going, or killed without a later one)."""
        return self.cost.segments[-1].segment.ended_at is None

    def to_json(self) -> dict[str, Any]:
        """The run as JSON values: who, what, where found, and its dollars, energy and CO2e."""
        c = self.cost
        return {
            "run_id": self.run_id,
            "task": self.task,
            "user": self.user,
            "state": self.state,
            "running": self.running,
            "found_in": list(self.found_in),
            "clouds": sorted({sc.segment.place.cloud for sc in c.segments}),
            "gpus": sorted({_gpu(sc.segment) for sc in c.segments}),
            "node_hours": c.node_hours,
            "total_usd": round(c.total_usd, 6),
            "compute_usd": round(c.compute_usd, 6),
            "controller_usd": round(c.controller_usd, 6),
            "transfer_usd": round(c.transfer_usd, 6),
            "storage_usd": round(c.storage_usd, 6),
            "requests_usd": round(c.requests_usd, 6),
            "measured": {name: basis == "measured" for name, _, basis in c.parts},
            "energy_kwh": c.energy_kwh,
            "co2e_kg": c.co2e_kg,
            "unpriced_segments": c.unpriced_segments,
            "last_at": self.last_at,
        }


def task_of_run_id(run_id: str) -> str:
    """The task name a run id starts with (`tiny-20261201-120000-ab12` -> `tiny`), for runs known
    only from a bucket; the whole id when it does not have the `new_run_id` form."""
    return _RUN_STAMP.sub("", run_id) or run_id


def _gpu(segment: Segment) -> str:
    return segment.place.gpu or "CPU"


def _user(record: RunRecord | None, segments: Sequence[Segment]) -> str:
    if record is not None and record.user:
        return record.user
    return next((s.user for s in reversed(segments) if s.user), None) or UNKNOWN


# ---------------------------------------------------------------- the whole team


@dataclass(frozen=True, kw_only=True, slots=True)
class SpendGroup:
    """The runs (or parts of runs) of one task, cloud, GPU or user, summed."""

    name: str
    runs: int
    running: int
    node_hours: float
    total_usd: float
    energy_kwh: float | None
    co2e_kg: float | None

    def to_json(self) -> dict[str, Any]:
        """The group as JSON values, dollars rounded to 6 decimals."""
        return {
            "name": self.name,
            "runs": self.runs,
            "running": self.running,
            "node_hours": self.node_hours,
            "total_usd": round(self.total_usd, 6),
            "energy_kwh": self.energy_kwh,
            "co2e_kg": self.co2e_kg,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class TeamSpend:
    """What `skygreen cost --all` shows: the runs, their groups under `--by`, and the total."""

    runs: tuple[SpentRun, ...]
    by: str | None
    groups: tuple[SpendGroup, ...]
    total: SpendGroup
    since_s: float | None
    buckets: tuple[str, ...]
    without_ledger: tuple[str, ...] = ()
    """Runs this machine launched that have no ledger yet (not training yet): no spend counted."""
    notices: tuple[str, ...] = field(default_factory=tuple)
    unreadable: tuple[Unreadable, ...] = ()
    """Buckets that could not be read: the runs in them are not in the total."""

    @property
    def complete(self) -> bool:
        """Whether every bucket answered, so the total is the whole spend; else the command exits 1."""
        return not self.unreadable

    def to_json(self) -> dict[str, Any]:
        """The JSON behind `skygreen cost --all --json`."""
        return {
            "since_s": self.since_s,
            "by": self.by,
            "buckets": list(self.buckets),
            "complete": self.complete,
            "total": self.total.to_json(),
            "groups": [g.to_json() for g in self.groups],
            "runs": [r.to_json() for r in self.runs],
            "without_ledger": list(self.without_ledger),
            "unreadable": [u.to_json() for u in self.unreadable],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Unreadable:
    """A bucket `cost --all` could not read: which, why (the store's first line), the runs of this
    machine that live there (their spend is left out), and what to do."""

    bucket: str
    reason: str
    runs: tuple[str, ...] = ()

    @property
    def fix(self) -> str:
        """The line that says what to do about it."""
        return (
            f"check that {self.bucket} exists and that this machine's credentials may list and read it "
            "(`aws s3 ls` / `gcloud storage ls` on the URL), then run the command again; or leave the bucket out"
        )

    def to_json(self) -> dict[str, Any]:
        """The bucket, the reason, the runs left out and the fix."""
        return {"bucket": self.bucket, "reason": self.reason, "runs": list(self.runs), "fix": self.fix}


def summarise(
    runs: Sequence[SpentRun],
    *,
    by: str | None,
    since_s: float | None = None,
    buckets: Sequence[str] = (),
    without_ledger: Sequence[str] = (),
    unreadable: Sequence[Unreadable] = (),
) -> TeamSpend:
    """Group the runs `by` task, cloud, GPU or user (None: no groups), most spent first, and sum them all.

    By task or user a run belongs to one group. By cloud or GPU a run that moved is split: each
    segment's compute, node hours and energy go to its own cloud or GPU, the controller and
    storage to the run's first segment's; the run counts in each group it touched.
    """
    parts: dict[str, list[tuple[SpentRun, float, float, float | None, float | None]]] = {}
    for run in runs:
        for name, node_h, usd, kwh, co2 in _parts(run, by or "task"):
            parts.setdefault(name, []).append((run, node_h, usd, kwh, co2))
    groups = [_group(name, rows) for name, rows in parts.items()] if by else []
    groups.sort(key=lambda g: (-g.total_usd, g.name))
    total = _group("total", [(r, r.cost.node_hours, r.cost.total_usd, r.cost.energy_kwh, r.cost.co2e_kg) for r in runs])
    return TeamSpend(runs=tuple(sorted(runs, key=lambda r: -r.last_at)), by=by, groups=tuple(groups), total=total,
                     since_s=since_s, buckets=tuple(buckets), without_ledger=tuple(without_ledger),
                     unreadable=tuple(unreadable))  # fmt: skip


def _parts(run: SpentRun, by: str) -> list[tuple[str, float, float, float | None, float | None]]:
    c = run.cost
    if by in ("task", "user"):
        name = run.task if by == "task" else run.user
        return [(name, c.node_hours, c.total_usd, c.energy_kwh, c.co2e_kg)]
    key: Callable[[SegmentCost], str] = (lambda sc: sc.segment.place.cloud) if by == "cloud" else (
        lambda sc: _gpu(sc.segment))  # fmt: skip
    out = []
    for i, sc in enumerate(c.segments):
        shared = (c.total_usd - c.compute_usd) if i == 0 else 0.0  # controller and data, once per run
        out.append((key(sc), sc.segment.node_hours, sc.cost_usd + shared, sc.energy_kwh, sc.co2e_kg))
    return out


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _group(name: str, rows: Sequence[tuple[SpentRun, float, float, float | None, float | None]]) -> SpendGroup:
    distinct = {r.run_id: r for r, *_ in rows}
    return SpendGroup(
        name=name,
        runs=len(distinct),
        running=sum(1 for r in distinct.values() if r.running),
        node_hours=sum(row[1] for row in rows),
        total_usd=sum(row[2] for row in rows),
        energy_kwh=_sum_known(row[3] for row in rows),
        co2e_kg=_sum_known(row[4] for row in rows),
    )


# ---------------------------------------------------------------- finding and pricing


def bucket_runs(url: str, open_store: OpenStore) -> dict[str, list[str]]:
    """Run id -> its ledger segment keys (relative to the run), for every run folder under `url`.

    Raises:
        StoreError: the bucket cannot be listed.
    """
    found: dict[str, list[str]] = {}
    for key in open_store(url).list(""):
        run_id, _, rel = key.partition("/")
        if _RUN_ID.match(run_id) and is_segment_key(rel):
            found.setdefault(run_id, []).append(rel)
    return found


def team_spend(
    *,
    open_store: OpenStore,
    buckets: Sequence[str] = (),
    by: str | None = None,
    since_s: float | None = None,
    catalog_dir: Path | None = None,
    registry: Registry | None = None,
    now_s: float | None = None,
) -> TeamSpend:
    """Every run this machine knows and every run in `buckets`, each once, priced from its ledger.

    `since_s`: only runs whose ledger shows activity in the last `since_s` seconds (a run is
    counted whole when any of it falls in the window).

    A bucket that cannot be read (gone, no access, down) does not stop the others: it is listed in
    `unreadable` with the store's reason, and the runs in it are left out of the total. The CLI
    then still prints what it could read, names each unreadable bucket with its reason and fix,
    and exits 1: the figure is a team's spend only when every bucket answered, and a script that
    sums it must not take a part for the whole (`TeamSpend.complete`).
    """
    from skygreen.checkpoint.bucket_set import home_url
    from skygreen.checkpoint.bucket_url import parse_url
    from skygreen.costs.costing import data_places, lazy_lookup, read_segments, storage_bytes

    registry = registry or Registry()
    lookup = lazy_lookup(catalog_dir)
    now_s = time.time() if now_s is None else now_s
    cutoff = None if since_s is None else now_s - since_s
    records = {r.run_id: r for r in registry.list()}
    found_in: dict[str, list[str]] = {run_id: [THIS_MACHINE] for run_id in records}
    where: dict[str, str] = {run_id: r.checkpoint_url for run_id, r in records.items()}
    unreadable: dict[str, Unreadable] = {}
    for url in buckets:
        try:
            in_bucket = bucket_runs(url, open_store)
        except StoreError as e:
            unreadable[url] = Unreadable(bucket=url, reason=first_line(e))
            continue
        for run_id in in_bucket:
            found_in.setdefault(run_id, []).append(url)
            where.setdefault(run_id, f"{url}/{run_id}")
    runs, without = [], []
    for run_id, sources in found_in.items():
        record = records.get(run_id)
        url = where[run_id]
        base = record.bucket.rstrip("/") if record else url.rsplit("/", 1)[0]
        if base in unreadable:
            unreadable[base] = dataclasses.replace(unreadable[base], runs=(*unreadable[base].runs, run_id))
            continue
        try:
            segments = read_segments(record, open_store) if record else _read(url, run_id, open_store)
        except StoreError as e:
            unreadable[base] = Unreadable(bucket=base, reason=first_line(e), runs=(run_id,))
            continue
        if not segments:
            if record is not None:
                without.append(run_id)
            continue
        if cutoff is not None and max(s.last_at for s in segments) < cutoff:
            continue
        cost = run_cost(
            run_id,
            segments,
            lookup=lookup,
            storage_bytes=storage_bytes(url, open_store),
            storage_scheme=parse_url(home_url(url)).scheme,
            **data_places(url, segments, record.spec_snapshot if record else None),
            managed=(record.mode == "cloud") if record else not all(s.place.cloud == "local" for s in segments),
            cancelled=record.cancelled if record else False,
        )
        runs.append(
            SpentRun(
                run_id=run_id,
                task=(record.task_name if record and record.task_name else task_of_run_id(run_id)),
                user=_user(record, segments),
                state=settled_state(record.state, completed=cost.completed) if record else segments[-1].end,
                found_in=tuple(sources),
                cost=cost,
            )
        )
    return summarise(runs, by=by, since_s=since_s, buckets=buckets, without_ledger=sorted(without),
                     unreadable=list(unreadable.values()))  # fmt: skip


def first_line(error: Exception) -> str:
    """The error's first line, without the run prefix `read_segments` adds."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _read(url: str, run_id: str, open_store: OpenStore) -> list[Segment]:
    from skygreen.ledger.io import read_run_ledger

    try:
        return read_run_ledger(open_store(url))
    except StoreError as e:
        raise StoreError(f"run {run_id}: cannot read its ledger at {url}: {str(e).splitlines()[0]}") from e


def describe_since(since_s: float | None) -> str:
    """`all time`, or `the last 30d` / `the last 12h` for the window `--since` gave."""
    if since_s is None:
        return "all time"
    for unit, size in (("w", 604800.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if since_s >= size and since_s % size == 0:
            return f"the last {since_s / size:g}{unit}"
    return f"the last {since_s:g}s"
