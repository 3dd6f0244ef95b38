"""The run ledger's records: one `Segment` per VM lifetime of a run, as plain data.

A run that is preempted twice lives on three VMs; each VM's stay is a segment. A segment says
where it ran (cloud, region, zone, instance type, spot, GPUs, nodes), when (start, last
update, end), what it did (steps and samples, measured throughput, energy, the metric series
it reported) and how it ended. Cost, plans, budgets and progress watchers all read these.

Pure: no outside library, no I/O. `skygreen.ledger.io` reads and writes them.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

LEDGER_DIR = "ledger"
FORMAT_VERSION = 1

RUNNING = "running"
COMPLETED = "completed"
PREEMPTED = "preempted"
FAILED = "failed"
EARLY_STOPPED = "early-stopped"
BUDGET = "budget"
CANCELLED = "cancelled"
KILLED = "killed"
"""Read-side only: a segment that never wrote an end (kill -9, a VM that vanished) and that a
later segment replaced. Its time ends at its last update."""
END_REASONS: tuple[str, ...] = (COMPLETED, PREEMPTED, FAILED, EARLY_STOPPED, BUDGET, CANCELLED)

MAX_SERIES_POINTS = 500
"""Per metric and segment; older points are thinned (every other one dropped) beyond it, so a
segment object stays a few kilobytes however long the run."""

_KEY = re.compile(r"^ledger/(\d{8}T\d{9}Z)-([0-9a-f]{8})\.json\Z")


@dataclass(frozen=True, kw_only=True, slots=True)
class Place:
    """Where a segment runs. `cloud` is "local" off the clouds; unknown parts are None."""

    cloud: str
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    spot: bool | None = None
    gpu: str | None = None
    """The catalog's GPU name ("L4", "A100-80GB"), None on CPU."""
    gpu_count: int = 0
    """GPUs per node."""
    nodes: int = 1
    price_usd_per_hour: float | None = None
    """Per node, the catalog price of this offer when the run was planned; None when unknown."""
    price_source: str | None = None
    """Where the price came from: "plan" (rendered at launch) or "catalog"."""
    simulated_gpu: str | None = None
    """A local run on a simulated board (`SKYGREEN_SIMULATED_GPU`): its name and count ("T4x1").
    Training ran on the CPU, so `gpu` stays None and no speed is measured for that GPU."""

    def __post_init__(self) -> None:
        if not self.cloud:
            raise ValueError("Place.cloud must be a cloud name or 'local'")
        if self.nodes < 1 or self.gpu_count < 0:
            raise ValueError(f"Place needs nodes >= 1 and gpu_count >= 0, got {self.nodes}, {self.gpu_count}")
        if self.price_usd_per_hour is not None and not (
            math.isfinite(self.price_usd_per_hour) and self.price_usd_per_hour >= 0
        ):
            raise ValueError(f"price_usd_per_hour must be a finite number >= 0, got {self.price_usd_per_hour}")

    @property
    def label(self) -> str:
        """`gcp/us-central1 g2-standard-4 (L4x1, spot)`, `local (CPU)`, or `local (simulated T4x1 on CPU)`."""
        where = "/".join(p for p in (self.cloud, self.region) if p)
        gpus = f"{self.gpu}x{self.gpu_count}" if self.gpu else "CPU"
        if not self.gpu and self.simulated_gpu:
            gpus = f"simulated {self.simulated_gpu} on CPU"
        kind = {True: ", spot", False: ", on-demand", None: ""}[self.spot]
        nodes = f" x{self.nodes} nodes" if self.nodes > 1 else ""
        itype = f" {self.instance_type}" if self.instance_type else ""
        return f"{where}{itype} ({gpus}{nodes}{kind})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    """One VM lifetime of a run. Times are Unix seconds (UTC)."""

    run_id: str
    key: str
    """The segment's object key under the run (`ledger/<start>-<random>.json`); its identity."""
    place: Place
    started_at: float
    updated_at: float
    ended_at: float | None = None
    """None while running, and forever for a segment killed without warning."""
    end: str = RUNNING
    """`running` or one of END_REASONS; `killed` only on the read side."""
    start_step: int = 0
    step: int = 0
    """The step of this segment's last update at a checkpoint save (its last checkpoint's step)."""
    reached_step: int | None = None
    """The furthest step this segment trained to, from its heartbeat between checkpoints; steps
    past `step` on a VM killed without a word were redone by the next one. None: no heartbeat."""
    timed_step: int | None = None
    """Read side only: the step `train_s` was measured at, where a reader moved `step` to the
    run's checkpoint (`settle`, `at_checkpoint`); None where `step` is still the written one."""
    start_samples: int = 0
    samples: int = 0
    samples_per_epoch: int | None = None
    total_steps: int | None = None
    """The step the training loop runs to (`run.steps(total_steps)`): progress is step / total_steps."""
    first_step_at: float | None = None
    """When this segment's first training step began (after loading the checkpoint)."""
    train_s: float = 0.0
    """Seconds spent in training steps since the first step of this segment (throughput's denominator)."""
    energy_j: float | None = None
    """GPU energy of this segment; None where nothing metered it. Filled by the runtime's
    energy meter (`skygreen.power.meter`)."""
    metrics: Mapping[str, Sequence[tuple[int, float, float]]] = field(default_factory=dict)
    """Reported metrics: name -> [(step, unix seconds, value)], for loss curves."""
    setup_started_at: float | None = None
    """The VM's first setup line (the rendered setup script stamps it); None where no setup ran."""
    setup_s: float | None = None
    """Seconds the setup script ran (package installs and the task's own setup)."""
    restore_s: float | None = None
    """Seconds the runtime spent finding, downloading, verifying and loading the checkpoint."""
    restore_bytes: int | None = None
    """Bytes of the checkpoint it restored; None when it started from scratch."""
    redone_steps: int | None = None
    """Steps an earlier segment had reached beyond the restored checkpoint: work done again."""
    bytes_uploaded: Mapping[str, int] = field(default_factory=dict)
    """Bucket URL (`s3://BUCKET`, `gs://BUCKET`, a local directory) -> bytes this segment sent
    to it, counted at the store (`skygreen.checkpoint.traffic`) on the ledger's writer: rank 0's
    checkpoint blobs, notes, manifests, leases, retention copies and ledger writes. Empty in
    ledgers written before it was counted."""
    bytes_downloaded: Mapping[str, int] = field(default_factory=dict)
    """Bucket URL -> bytes this segment received from it (its restore above all); as above."""
    checkpoint_bytes: int | None = None
    """Size of the newest checkpoint this segment committed, every blob of every rank (from its
    manifest): the real checkpoint size, which `plan` learns (`skygreen.costs.speeds`). None
    before a commit, and in older ledgers."""
    memory_planned_gb: Mapping[str, float] | None = None
    """The plan's memory per GPU for the run (`skygreen.memory.planned.PlannedMemory.to_json`):
    `low`, `high` and `tensors` in GB and the `gpus` it was planned for; None for a task without
    `model:`, and in older ledgers."""
    memory_peak_gb: float | None = None
    """The largest rank's measured peak memory in GB over its first steps at the final micro-batch
    (`skygreen.runtime.peak_memory`); None before it was measured, or where nothing measures."""
    memory_measure: str | None = None
    """How `memory_peak_gb` was measured: `cuda max_memory_allocated` on a GPU, `cpu resident
    tensors + RSS growth` on CPU."""
    user: str | None = None
    """Who launched the run (rendered by `skygreen up`); None in ledgers written before it was kept."""
    segment: int = 0
    """1-based position of this segment in the run, by start time; set by `read_ledger`."""
    version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.end not in (RUNNING, KILLED, *END_REASONS):
            raise ValueError(f"unknown segment end {self.end!r}; expected one of {(RUNNING, *END_REASONS)}")
        if self.updated_at < self.started_at:
            raise ValueError("a segment cannot be updated before it started")

    # -- derived -----------------------------------------------------------------------------

    @property
    def last_at(self) -> float:
        """When the segment's billed time ends as far as anyone knows."""
        return self.ended_at if self.ended_at is not None else self.updated_at

    @property
    def duration_s(self) -> float:
        """Seconds from the start to `last_at` (the end, else the last update); never negative."""
        return max(0.0, self.last_at - self.started_at)

    @property
    def steps_done(self) -> int:
        """Optimizer steps this segment took (`step - start_step`); never negative."""
        return max(0, self.step - self.start_step)

    @property
    def samples_done(self) -> int:
        """Samples this segment trained on (`samples - start_samples`); never negative."""
        return max(0, self.samples - self.start_samples)

    @property
    def samples_per_s(self) -> float | None:
        """Measured throughput of the whole job (all ranks), or None before a timed step."""
        return self.samples_done / self.train_s if self.train_s > 0 and self.samples_done else None

    @property
    def timed_steps(self) -> int:
        """Steps `train_s` was measured over: to the written step, which a reader that moved
        `step` back to the checkpoint keeps in `timed_step`; never negative."""
        return max(0, (self.step if self.timed_step is None else self.timed_step) - self.start_step)

    @property
    def steps_per_s(self) -> float | None:
        """Steps per second of training time (`train_s`, measured at the written step), or None
        before a timed step."""
        timed = self.timed_steps
        return timed / self.train_s if self.train_s > 0 and timed else None

    @property
    def startup_s(self) -> float:
        """Process start to first step (checkpoint load, data, compile); all of it if none."""
        end = self.first_step_at if self.first_step_at is not None else self.last_at
        return max(0.0, end - self.started_at)

    @property
    def changeover_s(self) -> float | None:
        """From the VM's first setup line (or, without one, the process start) to the first new
        step; None before that step."""
        if self.first_step_at is None:
            return None
        start = self.setup_started_at if self.setup_started_at is not None else self.started_at
        return max(0.0, self.first_step_at - start)

    @property
    def restore_bytes_per_s(self) -> float | None:
        """The restore's rate, bytes over seconds; None without a timed restore."""
        if not self.restore_bytes or not self.restore_s:
            return None
        return self.restore_bytes / self.restore_s

    @property
    def bytes_moved(self) -> int:
        """Bytes this segment sent and received, all buckets together (0 where not counted)."""
        return sum(self.bytes_uploaded.values()) + sum(self.bytes_downloaded.values())

    @property
    def node_hours(self) -> float:
        """Hours of `duration_s` times nodes: what a per-node hourly price multiplies."""
        return self.duration_s / 3600.0 * self.place.nodes

    # -- serialisation -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The stored form: every field but `segment` (numbered by readers), metric points as lists."""
        data = asdict(self)
        data["metrics"] = {name: [list(p) for p in points] for name, points in self.metrics.items()}
        data.pop("segment")
        data.pop("timed_step")
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Segment:
        """A segment from its stored form. Fields this version does not know, in the segment or
        its place, are ignored; malformed data raises `ValueError`, `TypeError` or `KeyError`
        (`read_ledger` skips such an object)."""
        values = dict(data)
        place_fields = {f.name for f in fields(Place)}
        values["place"] = Place(**{k: v for k, v in dict(values["place"]).items() if k in place_fields})
        values["metrics"] = {
            str(name): tuple((int(s), float(t), float(v)) for s, t, v in points)
            for name, points in dict(values.get("metrics") or {}).items()
        }
        for name in ("bytes_uploaded", "bytes_downloaded"):
            values[name] = {str(bucket): int(n) for bucket, n in dict(values.get(name) or {}).items()}
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


# -- keys ------------------------------------------------------------------------------------


def new_segment_key(started_at: float, *, token: str | None = None) -> str:
    """`ledger/<UTC start to the millisecond>-<8 random hex>.json`.

    Why this key: every VM names its own segment without asking anyone, so no two writers
    ever race for a number. Lexicographic order is start order (a replacement VM starts after
    the VM it replaces was lost, so it sorts after it), and the random suffix keeps two
    segments started in the same millisecond apart. The segment number is its position in
    that order, computed by readers.
    """
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started_at)) + f"{int(started_at * 1000) % 1000:03d}Z"
    return f"{LEDGER_DIR}/{stamp}-{token or secrets.token_hex(4)}.json"


def is_segment_key(key: str) -> bool:
    """Whether a key, relative to the run, names a segment object as `new_segment_key` makes them."""
    return bool(_KEY.match(key))


# -- the read side ---------------------------------------------------------------------------


def settle(segments: Sequence[Segment]) -> list[Segment]:
    """Order segments by key, number them from 1, and mark as `killed` each one that never
    wrote an end but was replaced by a later segment (its VM is gone).

    A killed segment's `step` becomes the step the next one resumed from: its last committed
    checkpoint, the step `status` shows. The ledger is written at each save, before that save
    commits, so a kill in between left the ledger one save off the bucket; the steps it trained
    past the checkpoint stay in `reached_step` (redone by the next segment)."""
    ordered = sorted(segments, key=lambda s: s.key)
    out = []
    for i, seg in enumerate(ordered):
        replaced = i < len(ordered) - 1
        end = KILLED if seg.end == RUNNING and replaced else seg.end
        seg = replace(seg, segment=i + 1, end=end)
        if end == KILLED and ordered[i + 1].start_step >= seg.start_step:
            seg = _moved_to(seg, ordered[i + 1].start_step)
        out.append(seg)
    return out


def at_checkpoint(segments: Sequence[Segment], committed_step: int | None) -> list[Segment]:
    """Settled segments with the last one's `step` at the run's newest committed checkpoint, the
    step `skygreen status` shows; steps trained past it go to `reached_step`.

    Why: the runtime writes its segment at each save before the save commits, and the trainer
    callbacks write theirs after the commit, so a VM killed in between left its ledger one save
    off the bucket until a next VM settles it (`settle`). Readers that price or show a run
    (`skygreen cost`, `compare`, `cost --all`) read both and say the checkpoint's step. A
    checkpoint older than the last segment's start (it is not this segment's), or none, changes
    nothing."""
    out = list(segments)
    if not out or committed_step is None:
        return out
    last = out[-1]
    if committed_step != last.step and committed_step >= last.start_step:
        out[-1] = _moved_to(last, committed_step)
    return out


def _moved_to(seg: Segment, step: int) -> Segment:
    """`seg` with its step at the checkpoint `step`; the written step stays the rate's
    (`timed_step`) and, past `step`, the furthest reached."""
    reached = max(seg.step, seg.reached_step or 0)
    timed = seg.step if seg.timed_step is None else seg.timed_step
    return replace(seg, step=step, timed_step=timed, reached_step=reached if reached > step else seg.reached_step)


def add_point(
    series: Mapping[str, Sequence[tuple[int, float, float]]], name: str, point: tuple[int, float, float]
) -> dict[str, tuple]:
    """`series` with one more point for `name`, thinned to MAX_SERIES_POINTS."""
    out = {k: tuple(v) for k, v in series.items()}
    points = (*out.get(name, ()), point)
    if len(points) > MAX_SERIES_POINTS:
        points = points[: -MAX_SERIES_POINTS // 2 : 2] + points[-MAX_SERIES_POINTS // 2 :]
    out[name] = points
    return out
