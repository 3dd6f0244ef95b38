"""Cost on the user's machine: a run's actual cost from its ledger, a task's estimate per
cloud, several runs side by side, and the throughput earlier runs measured.

Composition: the run registry says where a run's bucket is, `skygreen.ledger` reads and prices
its segments (`pricing.run_cost`, the one function `status`, `cost` and `compare` share), the
catalog prices what the ledger does not know, and the planner estimates what a task would cost.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from skygreen.checkpoint.store import OpenStore
from skygreen.costs.speeds import measured_speeds, save_measured
from skygreen.errors import CheckpointError, NoLedgerYetError, SkygreenError, StoreError
from skygreen.launch.registry import Registry, RunRecord
from skygreen.ledger.pricing import RunCost, catalog_lookup, first_metrics, run_cost
from skygreen.ledger.records import Segment

"""Per run, beside run.json: throughput per GPU type the ledger measured (for `plan`)."""


# ---------------------------------------------------------------- one run


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCostReport:
    """A run's cost with what it ran and, for local runs, what the clouds would have charged."""

    record: RunRecord
    cost: RunCost
    segments: tuple[Segment, ...]
    cloud_estimate: TaskEstimate | None = None
    """For a `--local` run: the same task priced on each cloud's best offer (an estimate)."""
    estimate_error: str | None = None
    """Why a local run got no estimate (its task file moved, no offer fits)."""

    def to_json(self) -> dict[str, Any]:
        """The run's cost as JSON values, with its task path and mode, and the cloud estimate or why there is none."""
        data = self.cost.to_json()
        data["task"] = self.record.task_path
        data["mode"] = self.record.mode
        if self.cloud_estimate is not None:
            data["cloud_estimate"] = self.cloud_estimate.to_json()
        if self.estimate_error:
            data["cloud_estimate_error"] = self.estimate_error
        return data


def load_run_cost(
    record: RunRecord, *, open_store: OpenStore, catalog_dir: Path | None = None, registry: Registry | None = None
) -> RunCost | None:
    """The run's cost from its ledger, or None when it has no ledger (yet). The same figure for
    `status`, `cost` and `compare`; also refreshes the run's measured throughput for `plan`."""
    segments = read_segments(record, open_store)
    if not segments:
        return None
    lookup = lazy_lookup(catalog_dir)
    cost = run_cost(
        record.run_id,
        segments,
        lookup=lookup,
        storage_bytes=storage_bytes(record.checkpoint_url, open_store),
        storage_scheme=_scheme(record.checkpoint_url),
        **data_places(record.checkpoint_url, segments, record.spec_snapshot),
        managed=record.mode == "cloud",
        cancelled=record.cancelled,
    )
    save_measured(registry or Registry(), record, segments)
    return cost


def read_segments(record: RunRecord, open_store: OpenStore) -> list[Segment]:
    """The segments of the run's ledger, oldest first, the last one at the run's newest committed
    checkpoint (`read_run_ledger`: the step `status` shows); empty when it has none yet.

    Unreadable ledger objects are skipped with a warning. Raises `StoreError`, naming the run,
    when its bucket cannot be read.
    """
    from skygreen.ledger.io import read_run_ledger

    try:
        return read_run_ledger(open_store(record.checkpoint_url))
    except StoreError as e:
        raise StoreError(
            f"run {record.run_id}: cannot read its ledger at {record.checkpoint_url}: {str(e).splitlines()[0]}"
        ) from e


def storage_bytes(url: str, open_store: OpenStore) -> int:
    """Bytes of every committed checkpoint in the run's bucket now (blobs from the manifests)."""
    from skygreen.checkpoint.manifest import iter_manifests

    try:
        return sum(info.size for m in iter_manifests(open_store(url)) for info in m.blobs.values())
    except (StoreError, CheckpointError):
        return 0


def data_places(url: str, segments: Sequence[Segment], snapshot: Mapping[str, Any] | None) -> dict[str, Any]:
    """`run_cost`'s data arguments for a run whose checkpoints are at `url`: each bucket's place
    (`buckets`: the run's and every one its segments counted bytes for, each read from the
    bucket where credentials allow, else the task's `checkpoint.region` for the run's own, else
    its cloud's default), the run's bucket's place (`store`) and `keep` from the task."""
    from skygreen.bill.bucket import bucket_place
    from skygreen.checkpoint.bucket_set import home_url, is_set_url, members
    from skygreen.checkpoint.traffic import bucket_of

    checkpoint = ((snapshot or {}).get("skygreen") or {}).get("checkpoint") or {}
    stated = checkpoint.get("region") if isinstance(checkpoint, Mapping) else None
    keep = checkpoint.get("keep") if isinstance(checkpoint, Mapping) else None
    run_bucket = bucket_of(home_url(url))  # a bucket set: its home bucket stands for its storage
    states = {run_bucket: stated}
    if is_set_url(url):  # each bucket of a set where its key says, unless it says otherwise itself
        states = {bucket_of(m.url): m.region for m in members(url)}
    keys = set(states) | {k for s in segments for k in (*s.bytes_uploaded, *s.bytes_downloaded)}
    buckets = {}
    for key in sorted(keys):
        read = _read_region(key)
        try:
            found = bucket_place(key, stated_region=states.get(key), read_region=read)
        except SkygreenError:  # the task's region contradicts the bucket: the bucket's answer stands
            found = bucket_place(key, read_region=read)
        buckets[key] = found.place if found is not None else None
    return {"buckets": buckets, "store": buckets[run_bucket], "keep": keep if isinstance(keep, int) else None}


@functools.lru_cache(maxsize=64)
def _read_region(bucket: str) -> str | None:
    """The region the bucket reports, asked once per bucket and process (`cost --all` reads many
    runs in one bucket)."""
    from skygreen.checkpoint.bucket_region import read_bucket_region

    return read_bucket_region(bucket)


def _scheme(url: str) -> str:
    from skygreen.checkpoint.bucket_set import home_url
    from skygreen.checkpoint.store import parse_url

    return parse_url(home_url(url)).scheme


def lazy_lookup(catalog_dir: Path | None):
    """A catalog price lookup that reads the catalog only if a segment needs it."""
    loaded: list[Any] = []

    def lookup(place):
        if not loaded:
            from skygreen.plan.catalog import load_catalog

            loaded.append(catalog_lookup(load_catalog(catalog_dir)))
        return loaded[0](place)

    return lookup


def cost_of_run(
    run_id: str, *, open_store: OpenStore, catalog_dir: Path | None = None, registry: Registry | None = None
) -> RunCostReport:
    """The cost of run `run_id` (or the one run whose id starts with it) from its ledger.

    A run whose segments all ran locally (`--local`) also gets its task priced on each cloud;
    when that raises a `SkygreenError`, the report keeps its first line in `estimate_error`
    instead. Refreshes the run's measured throughput, as `load_run_cost` does. Raises
    `InputError` for an unknown run or one without a ledger yet, and `StoreError` when its
    bucket cannot be read.
    """
    registry = registry or Registry()
    record = registry.load(run_id)
    cost = load_run_cost(record, open_store=open_store, catalog_dir=catalog_dir, registry=registry)
    if cost is None:
        raise NoLedgerYetError(
            f"run {run_id} has no ledger at {record.checkpoint_url}/ledger yet: the ledger (time, steps, "
            "energy) is written once training starts by skygreen.runtime's Run, the HF and Lightning "
            "callbacks (skygreen.integrations) and the folder mode (checkpoint.dir); a script that uses "
            "none of them writes none\n"
            "  fix: wait for its first step; for a run that ended without one, add skygreen's callback or "
            "checkpoint.dir to the task (docs/trainers.md)"
        )
    estimate, why = None, None
    if cost.local:
        try:
            estimate = estimate_task(record.task_path, catalog_dir=catalog_dir, registry=registry)
        except SkygreenError as e:  # the run's own cost stands without it
            why = str(e).splitlines()[0]
    segments = tuple(sc.segment for sc in cost.segments)
    return RunCostReport(record=record, cost=cost, segments=segments, cloud_estimate=estimate, estimate_error=why)


# ---------------------------------------------------------------- a task, per cloud


@dataclass(frozen=True, kw_only=True, slots=True)
class CloudEstimate:
    """One cloud's best offers for a task, ranked by the task's objective: its best spot and its best
    on-demand candidate."""

    cloud: str
    spot: Any | None
    """The cloud's best spot `plan.Candidate` by the task's objective, or None."""
    on_demand: Any | None
    """The cloud's best on-demand `plan.Candidate`, or None."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskEstimate:
    """What a task would cost per run: the plan's pick, then each cloud's best offers."""

    task: str
    pick: Any | None
    """The plan's own pick for the task as written (its constraints), or None when none fits."""
    clouds: tuple[CloudEstimate, ...]
    speeds: Mapping[str, str] = field(default_factory=dict)
    """GPU -> "measured (N runs)" or "prior", for the GPUs shown."""
    catalog_source: str = ""
    notices: tuple[str, ...] = ()
    bucket: str = ""
    """Where the checkpoints go, as the data column prices them (`_bucket_line`)."""

    def to_json(self) -> dict[str, Any]:
        """The estimate as JSON values, marked `"estimate": true`; the catalog notices are left out."""

        def cand(c):
            return None if c is None else c.to_json()

        return {
            "task": self.task,
            "estimate": True,
            "pick": cand(self.pick),
            "clouds": [{"cloud": c.cloud, "spot": cand(c.spot), "on_demand": cand(c.on_demand)} for c in self.clouds],
            "speeds": dict(self.speeds),
            "catalog": self.catalog_source,
            "bucket": self.bucket,
        }


def estimate_task(
    task_path: str | Path, *, catalog_dir: Path | None = None, registry: Registry | None = None
) -> TaskEstimate:
    """Cost per run on each cloud's best region and instance, spot and on-demand, the plan's
    pick first; speeds measured by earlier runs of the task replace the shipped prior."""
    from skygreen.checkpoint.bucket_region import read_bucket_regions
    from skygreen.errors import NoOfferError
    from skygreen.plan.catalog import load_catalog
    from skygreen.plan.rank import make_plan
    from skygreen.task.checks import load_task

    spec = load_task(task_path)
    catalog = load_catalog(catalog_dir)
    measured = measured_speeds(spec, task_path, registry=registry)
    speeds = {gpu: value for gpu, (value, _) in measured.items()}
    region = read_bucket_regions(spec.green.checkpoint.bucket)
    try:
        pick = make_plan(spec, catalog, measured_speed=speeds, bucket_region=region).best
    except NoOfferError:
        pick = None
    wide_green = msgspec.structs.replace(
        spec.green, spot=True, on_demand_fallback=True, budget_usd=None, max_price_per_hour=None
    )
    wide = make_plan(dataclasses.replace(spec, green=wide_green), catalog, measured_speed=speeds, bucket_region=region)
    per_cloud: dict[str, dict[bool, Any]] = {}
    for c in wide.candidates:  # ranked: the first per (cloud, spot) is the best
        per_cloud.setdefault(c.cloud, {}).setdefault(c.spot, c)
    order = sorted(
        per_cloud,
        key=lambda cl: (pick is None or cl != pick.cloud, min(x.est_cost_usd for x in per_cloud[cl].values())),
    )
    clouds = tuple(
        CloudEstimate(cloud=cl, spot=per_cloud[cl].get(True), on_demand=per_cloud[cl].get(False)) for cl in order
    )
    shown = {c.accelerator for ce in clouds for c in (ce.spot, ce.on_demand) if c is not None}
    labels = {gpu: (f"measured ({measured[gpu][1]} runs)" if gpu in measured else "prior") for gpu in sorted(shown)}
    return TaskEstimate(
        task=str(task_path),
        pick=pick,
        clouds=clouds,
        speeds=labels,
        catalog_source=catalog.source,
        notices=catalog.notices,
        bucket=_bucket_line(spec, region),
    )


def _bucket_line(spec: Any, read_region: str | Mapping[str, str | None] | None) -> str:
    """Where the task's checkpoints go and what the plan therefore counts, for `cost TASK`."""
    from skygreen.bill.bucket_places import plan_buckets

    url = spec.green.checkpoint.bucket
    found, places = plan_buckets(url, stated_region=spec.green.checkpoint.region, read=read_region)
    if places is not None:
        where = ", ".join(f"{m.key}: {m.url} ({p.place.label})" for m, p in places.buckets)
        return f"a bucket per place ({where}); each offer priced against its nearest, plus a copy per expected move"
    if found is None:
        return "no cloud bucket in the task, so no data is priced (`skygreen up` asks for one for a cloud run)"
    if spec.green.model is None:
        return f"bucket {url} ({found.place.label}); no skygreen.model: checkpoint size unknown, data not counted"
    how = {"read": "read from the bucket", "stated": "as the task states", "assumed": "assumed: the cloud's default"}
    return f"bucket {url} in {found.place.label} ({how[found.how]})"


# ---------------------------------------------------------------- compare


@dataclass(frozen=True, kw_only=True, slots=True)
class CompareRow:
    """One run in `skygreen compare`: its cost, the metric compared and how much it improved."""

    record: RunRecord
    cost: RunCost
    metric: str | None
    mode: str
    """`min` when a lower metric is better, `max` when a higher one is."""
    improvement: float | None
    """How much the metric got better from its first to its last report (sign-corrected)."""

    @property
    def usd_per_improvement(self) -> float | None:
        """Dollars per unit of metric improvement; None without an improvement or when it is zero.

        Negative when the metric got worse.
        """
        return self.cost.total_usd / self.improvement if self.improvement else None

    def to_json(self) -> dict[str, Any]:
        """The row as JSON values, with the metric's last reported value as `final_metric`."""
        return {
            "run_id": self.record.run_id,
            "task": self.record.task_path,
            "clouds_node_hours": self.cost.clouds,
            "span_h": self.cost.span_h,
            "node_hours": self.cost.node_hours,
            "total_usd": round(self.cost.total_usd, 6),
            "compute_usd": round(self.cost.compute_usd, 6),
            "controller_usd": round(self.cost.controller_usd, 6),
            "transfer_usd": round(self.cost.transfer_usd, 6),
            "storage_usd": round(self.cost.storage_usd, 6),
            "requests_usd": round(self.cost.requests_usd, 6),
            "measured": {name: basis == "measured" for name, _, basis in self.cost.parts},
            "energy_kwh": self.cost.energy_kwh,
            "co2e_kg": self.cost.co2e_kg,
            "metric": self.metric,
            "metric_mode": self.mode if self.metric else None,
            "final_metric": self.cost.final_metrics.get(self.metric) if self.metric else None,
            "improvement": self.improvement,
            "usd_per_improvement": self.usd_per_improvement,
            "preemptions": self.cost.preemptions,
            "completed": self.cost.completed,
            "steps": self.cost.steps,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """`skygreen compare`'s answer: a row per run with a ledger, in the order given, and the runs
    left out because they have none yet (launched, not training yet)."""

    rows: list[CompareRow]
    waiting: tuple[str, ...] = ()


def compare_runs(
    run_ids: Sequence[str],
    *,
    open_store: OpenStore,
    catalog_dir: Path | None = None,
    registry: Registry | None = None,
) -> Comparison:
    """One row per run, in the order given, each priced as `cost_of_run` prices it.

    The metric is the run's early-stopping metric and mode, else the first in name order of
    those it reported, its direction read from its name (`metric_mode`). A run with no ledger yet
    is left out and named in `waiting`, not an error: while many runs start, some have not
    written their first segment, and a comparison of the others (as `status` and `cost RUN` answer
    for such a run) beats none. Raises what `cost_of_run` raises otherwise for any of the runs.
    """
    registry = registry or Registry()
    rows, waiting = [], []
    for run_id in run_ids:
        try:
            report = cost_of_run(run_id, open_store=open_store, catalog_dir=catalog_dir, registry=registry)
        except NoLedgerYetError:
            waiting.append(registry.resolve(run_id))
            continue
        metric, mode = _metric_of(report.record, report.cost.final_metrics)
        improvement = None
        if metric and metric in report.cost.final_metrics:
            first = first_metrics(report.segments).get(metric)
            last = report.cost.final_metrics[metric]
            if first is not None:
                improvement = (first - last) if mode == "min" else (last - first)
        rows.append(
            CompareRow(record=report.record, cost=report.cost, metric=metric, mode=mode, improvement=improvement)
        )
    return Comparison(rows=rows, waiting=tuple(waiting))


HIGHER_IS_BETTER_WORDS: frozenset[str] = frozenset({
    "acc", "accuracy", "auc", "auroc", "bleu", "dice", "f1", "iou", "miou", "map", "precision", "recall", "reward",
    "rouge", "rougel", "score",
})  # fmt: skip
"""Words that make a metric's name (split at `_`, `-`, `/`, `.`; a trailing number dropped, as in
`mAP50` or `rouge1`) higher-is-better when the task names no early-stopping mode: `val_acc`,
`top1_accuracy`, `eval/f1`, `mAP50`. Whole words only: `mape` is an error."""


def metric_mode(name: str) -> str:
    """`max` for a metric whose name reads higher-is-better (`HIGHER_IS_BETTER_WORDS`), else `min`
    (losses, errors, perplexity): the direction `compare` takes without an early-stopping mode."""
    words = {w for w in re.split(r"[_\-/.\s]+", name.lower()) if w}
    words |= {w.rstrip("0123456789") for w in words}
    return "max" if words & HIGHER_IS_BETTER_WORDS else "min"


def _metric_of(record: RunRecord, reported: Iterable[str]) -> tuple[str | None, str]:
    """The metric to compare and its mode: the early-stopping metric and mode when the task has
    them, else the first reported metric in name order, its mode read from its name."""
    stop = (record.spec_snapshot or {}).get("skygreen", {}).get("early_stopping") or {}
    metric = stop.get("metric")
    if metric:
        return metric, stop.get("mode", "min")
    metric = next(iter(sorted(reported)), None)
    return metric, metric_mode(metric) if metric else "min"


def checkpoint_save(url: str, manifest: Any, segments: Sequence[Segment], snapshot: Mapping[str, Any] | None) -> Any:
    """What the run's next save costs (`skygreen.bill.save_cost.SaveCost`), for `status`: the newest
    commit's measured bytes from the latest segment's place to the bucket it commits to (for a
    bucket set, the one nearest that place); None for a local bucket or before the first commit."""
    from skygreen.bill.rates import CLOUDS, DEFAULT_REGION
    from skygreen.bill.rates import Place as BillPlace
    from skygreen.bill.save_cost import save_cost
    from skygreen.checkpoint.bucket_set import is_set_url, members, nearest
    from skygreen.checkpoint.traffic import bucket_of

    if manifest is None or not manifest.blobs:
        return None
    last = max(segments, key=lambda s: s.started_at).place if segments else None
    vm = None
    if last is not None and last.cloud in CLOUDS:
        vm = BillPlace(cloud=last.cloud, region=last.region or DEFAULT_REGION[last.cloud])
    target = url
    if is_set_url(url):
        target = nearest(members(url), cloud=vm.cloud if vm else None, region=vm.region if vm else None).url
    bucket = data_places(url, segments, snapshot)["buckets"].get(bucket_of(target))
    if bucket is None:
        return None
    size_gb = sum(info.size for info in manifest.blobs.values()) / 1e9
    return save_cost(gb=size_gb, files=len(manifest.blobs), vm=vm, bucket=bucket)
