"""The checkpoint protocol's pure core: key layout, manifest, latest, retention, interval.

Layout under a run's URL (`<bucket>/<run_id>/`):

    ckpt/<step:012d>/shared.pt           rank 0's shared state (model, optimizer, ...)
    ckpt/<step:012d>/rank<r:05d>.pt      each rank's own state (RNG, data position)
    ckpt/<step:012d>/rank<r:05d>.json    each rank's note: its blob's size and sha256
    ckpt/<step:012d>/manifest.json       the commit, written last by rank 0

The manifest is the commit: a step folder without one does not exist for readers, whatever
blobs it holds. It records every blob's size and sha256, so a reader can tell a complete,
intact checkpoint from a partial or corrupted one without trusting the bucket.

`model_sha256` identifies the weights: sha256 over the model's tensors in sorted name order,
each fed as its name (UTF-8), dtype (e.g. "torch.float32"), shape (e.g. "[3, 4]") and raw
bytes, each field followed by a NUL byte. Computing it needs tensors, so the helper lives in
`skygreen.runtime.checkpointer`; the definition is here, beside the manifest.

This module imports no torch and no cloud library: `skygreen status` reads progress through
`read_progress` on a laptop without either.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, BinaryIO

from skygreen.errors import CheckpointError, InputError, StoreError, TransientStoreError
from skygreen.store import KeyNotFoundError, Store, open_store

log = logging.getLogger("skygreen.checkpoint")

FORMAT_VERSION = 1
CKPT_DIR = "ckpt"
MANIFEST_NAME = "manifest.json"
SHARED_BLOB = "shared.pt"
METRIC_MODES = ("min", "max")

_STEP_KEY = re.compile(r"^ckpt/(\d{12})/([^/]+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


# ---------------------------------------------------------------------------------------
# Key layout


def step_prefix(step: int) -> str:
    return f"{CKPT_DIR}/{step:012d}/"


def blob_key(step: int, name: str) -> str:
    return step_prefix(step) + name


def manifest_key(step: int) -> str:
    return blob_key(step, MANIFEST_NAME)


def rank_blob_name(rank: int) -> str:
    return f"rank{rank:05d}.pt"


def rank_note_name(rank: int) -> str:
    return f"rank{rank:05d}.json"


def parse_step_key(key: str) -> tuple[int, str] | None:
    """(step, file name) for a key inside a step folder, else None."""
    match = _STEP_KEY.match(key)
    return (int(match.group(1)), match.group(2)) if match else None


def step_folders(keys: Sequence[str]) -> dict[int, set[str]]:
    """Step -> names of the files in its folder, from a listing of `ckpt/`."""
    folders: dict[int, set[str]] = {}
    for key in keys:
        parsed = parse_step_key(key)
        if parsed:
            folders.setdefault(parsed[0], set()).add(parsed[1])
    return folders


# ---------------------------------------------------------------------------------------
# Manifest


@dataclass(frozen=True, kw_only=True, slots=True)
class BlobInfo:
    size: int
    sha256: str

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"blob size must be a non-negative integer, got {self.size!r}")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ValueError(f"blob sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256}


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso_s(text: str) -> float:
    """Seconds since the epoch of an ISO-8601 UTC time as written by `utc_now_iso`."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """The commit record of one checkpoint. Written last; JSON; immutable once written."""

    step: int
    created_at: str
    """ISO-8601 UTC, e.g. 2025-01-31T12:00:00.000000Z."""
    format_version: int = FORMAT_VERSION
    blobs: Mapping[str, BlobInfo] = field(default_factory=dict)
    model_sha256: str | None = None
    metric: float | None = None
    metric_mode: str = "min"
    """Whether a lower ("min") or higher ("max") metric is better, for keeping the best."""
    pinned: bool = False
    world_size: int = 1
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Free-form JSON from the runtime: state, energy_j, wall_s, preemptions, ..."""

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"Manifest.step must be a non-negative integer, got {self.step!r}")
        parse_iso_s(self.created_at)
        if self.metric is not None and not (isinstance(self.metric, (int, float)) and math.isfinite(self.metric)):
            raise ValueError(f"Manifest.metric must be a finite number or None, got {self.metric!r}")
        if self.metric_mode not in METRIC_MODES:
            raise ValueError(f"Manifest.metric_mode must be one of {METRIC_MODES}, got {self.metric_mode!r}")
        if self.model_sha256 is not None and not _SHA256.match(str(self.model_sha256)):
            raise ValueError(f"Manifest.model_sha256 must be 64 hex digits, got {self.model_sha256!r}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"Manifest.world_size must be an integer >= 1, got {self.world_size!r}")
        if SHARED_BLOB not in self.blobs:
            raise ValueError(f"Manifest.blobs must include {SHARED_BLOB!r}")

    @property
    def created_at_s(self) -> float:
        return parse_iso_s(self.created_at)

    @property
    def label(self) -> str:
        """How warnings and errors name this checkpoint."""
        return f"checkpoint step {self.step} ({step_prefix(self.step)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "step": self.step,
            "created_at": self.created_at,
            "blobs": {name: info.to_json() for name, info in sorted(self.blobs.items())},
            "model_sha256": self.model_sha256,
            "metric": self.metric,
            "metric_mode": self.metric_mode,
            "pinned": self.pinned,
            "world_size": self.world_size,
            "meta": dict(self.meta),
        }

    def dumps(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()

    @classmethod
    def loads(cls, data: bytes | str, *, where: str) -> Manifest:
        """Parse a manifest; anything malformed is a `CheckpointError` naming `where`."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            version = raw.get("format_version")
            if version != FORMAT_VERSION:
                raise ValueError(f"format_version {version!r} is not {FORMAT_VERSION} (written by another skygreen version)")
            blobs = raw["blobs"]
            if not isinstance(blobs, dict):
                raise ValueError("blobs is not a mapping")
            return cls(
                step=raw["step"],
                created_at=raw["created_at"],
                format_version=version,
                blobs={str(n): BlobInfo(size=b["size"], sha256=b["sha256"]) for n, b in blobs.items()},
                model_sha256=raw.get("model_sha256"),
                metric=raw.get("metric"),
                metric_mode=raw.get("metric_mode", "min"),
                pinned=bool(raw.get("pinned", False)),
                world_size=raw.get("world_size", 1),
                meta=raw.get("meta") or {},
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{where}: unreadable checkpoint manifest: {e}") from e


# ---------------------------------------------------------------------------------------
# Hashing (plain bytes; torch-free)


class HashingWriter:
    """A write-only file wrapper that counts and hashes every byte on its way to `out`.

    Serialising through it gives the blob's size and sha256 in the same pass, so a
    multi-GB checkpoint is never read back just to be hashed.
    """

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        self.size += len(data)
        return self._out.write(data)

    def flush(self) -> None:
        self._out.flush()

    def info(self) -> BlobInfo:
        return BlobInfo(size=self.size, sha256=self._hash.hexdigest())


def blob_info(data: bytes) -> BlobInfo:
    return BlobInfo(size=len(data), sha256=hashlib.sha256(data).hexdigest())


# ---------------------------------------------------------------------------------------
# Reading: committed steps, latest


def committed_steps(store: Store) -> list[int]:
    """Steps with a manifest, oldest first."""
    folders = step_folders(store.list(CKPT_DIR + "/"))
    return sorted(step for step, names in folders.items() if MANIFEST_NAME in names)


def read_manifest(store: Store, step: int) -> Manifest:
    key = manifest_key(step)
    manifest = Manifest.loads(store.get(key), where=f"{store.url}/{key}")
    if manifest.step != step:
        raise CheckpointError(f"{store.url}/{key}: manifest says step {manifest.step}, folder says {step}")
    return manifest


def iter_manifests(store: Store) -> Iterator[Manifest]:
    """Committed manifests, newest first; an unreadable one is skipped with a warning naming it."""
    for step in reversed(committed_steps(store)):
        try:
            yield read_manifest(store, step)
        except TransientStoreError:
            raise
        except (CheckpointError, StoreError) as e:
            log.warning("skipping checkpoint step %d: %s", step, e)


def missing_blobs(store: Store, manifest: Manifest) -> list[str]:
    """Problems with the manifest's blobs found by size alone (cheap: no download)."""
    problems = []
    for name, info in sorted(manifest.blobs.items()):
        key = blob_key(manifest.step, name)
        try:
            size = store.size(key)
        except KeyNotFoundError:
            problems.append(f"{name} is missing")
            continue
        if size != info.size:
            problems.append(f"{name} has {size} bytes, the manifest says {info.size}")
    return problems


def latest_manifest(store: Store) -> Manifest | None:
    """The newest manifest whose blobs are all present with their recorded sizes.

    Newer manifests with missing or short blobs are skipped with a warning naming them. The
    sha256 check needs the bytes; the checkpointer does it while downloading.
    """
    for manifest in iter_manifests(store):
        problems = missing_blobs(store, manifest)
        if not problems:
            return manifest
        log.warning("skipping %s: %s", manifest.label, "; ".join(problems))
    return None


def read_progress(url: str) -> Manifest | None:
    """The run's latest committed checkpoint, for `skygreen status`; no torch involved."""
    return latest_manifest(open_store(url))


# ---------------------------------------------------------------------------------------
# Retention


def best_step(manifests: Sequence[Manifest]) -> int | None:
    """The step with the best metric (by the newest manifest's mode); ties go to the newest."""
    scored = [m for m in manifests if m.metric is not None]
    if not scored:
        return None
    mode = max(scored, key=lambda m: m.step).metric_mode
    sign = 1.0 if mode == "min" else -1.0
    return min(scored, key=lambda m: (sign * m.metric, -m.step)).step


def retained_steps(manifests: Sequence[Manifest], *, keep: int) -> set[int]:
    """The steps retention keeps: the last `keep`, the best by metric, and every pinned one."""
    if keep < 2:
        raise ValueError(f"keep must be at least 2, got {keep}")
    steps = sorted(m.step for m in manifests)
    kept = set(steps[-keep:])
    best = best_step(manifests)
    if best is not None:
        kept.add(best)
    kept.update(m.step for m in manifests if m.pinned)
    return kept


def deletable_steps(manifests: Sequence[Manifest], folder_steps: Sequence[int], *, keep: int) -> list[int]:
    """Step folders to delete after a commit.

    Only folders older than the newest commit go: committed ones retention does not keep, and
    uncommitted leftovers of saves that died. Folders newer than the newest commit may be a
    save in flight on another rank, so they stay.
    """
    if not manifests:
        return []
    newest = max(m.step for m in manifests)
    kept = retained_steps(manifests, keep=keep)
    return sorted(s for s in set(folder_steps) if s < newest and s not in kept)


def delete_step(store: Store, step: int) -> None:
    """Delete a step folder, manifest first, so a half-deleted checkpoint is never 'committed'."""
    keys = store.list(step_prefix(step))
    manifest = manifest_key(step)
    if manifest in keys:
        store.delete(manifest)
    for key in keys:
        if key != manifest:
            store.delete(key)


def apply_retention(store: Store, *, keep: int) -> list[int]:
    """Delete what retention no longer needs; returns the deleted steps."""
    manifests = list(iter_manifests(store))
    folders = step_folders(store.list(CKPT_DIR + "/"))
    doomed = deletable_steps(manifests, list(folders), keep=keep)
    for step in doomed:
        delete_step(store, step)
    if doomed:
        log.info("retention: deleted checkpoint steps %s", ", ".join(map(str, doomed)))
    return doomed


# ---------------------------------------------------------------------------------------
# Interval


DEFAULT_PREEMPTIONS_PER_HOUR = 0.1
"""Assumed spot preemption rate when the run names none (mean 10 h between preemptions)."""


def young_daly_interval_s(save_cost_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval, sqrt(2 x save cost x mean time between failures).

    Checkpointing more often wastes save cost; less often loses more work per preemption.
    """
    if save_cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"need save_cost_s >= 0 and mtbf_s > 0, got {save_cost_s}, {mtbf_s}")
    return math.sqrt(2.0 * save_cost_s * mtbf_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class IntervalPolicy:
    """When to checkpoint: every N steps, every T seconds, or auto (Young/Daly).

    Auto needs a measured save cost; until the first save it uses `first_auto_s`. The auto
    interval is never shorter than the last upload took, so saves do not queue up behind
    each other, and is clamped to [min_interval_s, max_interval_s].
    """

    every_steps: int | None = None
    every_s: float | None = None
    preemptions_per_hour: float = DEFAULT_PREEMPTIONS_PER_HOUR
    first_auto_s: float = 120.0
    min_interval_s: float = 10.0
    max_interval_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_s is not None:
            raise ValueError("IntervalPolicy: set every_steps or every_s, not both")
        if self.every_steps is not None and (not isinstance(self.every_steps, int) or self.every_steps < 1):
            raise ValueError(f"IntervalPolicy.every_steps must be an integer >= 1, got {self.every_steps!r}")
        if self.every_s is not None and not self.every_s > 0:
            raise ValueError(f"IntervalPolicy.every_s must be > 0, got {self.every_s!r}")
        if not self.preemptions_per_hour > 0:
            raise ValueError(f"IntervalPolicy.preemptions_per_hour must be > 0, got {self.preemptions_per_hour!r}")
        if not 0 < self.min_interval_s <= self.max_interval_s:
            raise ValueError("IntervalPolicy: need 0 < min_interval_s <= max_interval_s")

    @property
    def mode(self) -> str:
        if self.every_steps is not None:
            return "steps"
        return "seconds" if self.every_s is not None else "auto"

    @property
    def mtbf_s(self) -> float:
        return 3600.0 / self.preemptions_per_hour

    def auto_interval_s(self, save_cost_s: float | None, upload_s: float | None = None) -> float:
        if save_cost_s is None:
            return self.first_auto_s
        interval_s = max(young_daly_interval_s(save_cost_s, self.mtbf_s), upload_s or 0.0)
        return min(max(interval_s, self.min_interval_s), self.max_interval_s)


class CheckpointSchedule:
    """Decides, step by step, whether a checkpoint is due. Time is passed in (pure)."""

    def __init__(self, policy: IntervalPolicy, *, start_step: int, start_s: float) -> None:
        self.policy = policy
        self.last_step = start_step
        self.last_s = start_s
        self.interval_s: float | None = policy.every_s if policy.mode == "seconds" else None
        if policy.mode == "auto":
            self.interval_s = policy.first_auto_s
        log.info("checkpoint interval: %s", self.describe())

    def due(self, step: int, now_s: float) -> bool:
        if self.policy.mode == "steps":
            return step - self.last_step >= self.policy.every_steps
        return now_s - self.last_s >= self.interval_s

    def saved(self, step: int, now_s: float, *, save_cost_s: float | None = None, upload_s: float | None = None) -> None:
        """Record a save; in auto mode, re-derive the interval from the measured cost."""
        self.last_step = step
        self.last_s = now_s
        if self.policy.mode == "auto" and save_cost_s is not None:
            new_s = self.policy.auto_interval_s(save_cost_s, upload_s)
            if self.interval_s is None or abs(new_s - self.interval_s) > 0.1 * self.interval_s:
                self.interval_s = new_s
                log.info("checkpoint interval: %s (save cost %.3f s)", self.describe(), save_cost_s)
            else:
                self.interval_s = new_s

    def describe(self) -> str:
        if self.policy.mode == "steps":
            return f"every {self.policy.every_steps} steps"
        if self.policy.mode == "seconds":
            return f"every {self.interval_s:g} s"
        return (
            f"auto, every {self.interval_s:.0f} s (Young/Daly, "
            f"{self.policy.preemptions_per_hour:g} preemptions/hour assumed)"
        )


# ---------------------------------------------------------------------------------------
# Cold storage (`skygreen gc`)


COLD_CLASSES = {"s3": ("GLACIER", "DEEP_ARCHIVE", "GLACIER_IR"), "gs": ("ARCHIVE", "COLDLINE", "NEARLINE")}
DEFAULT_COLD_CLASS = {"s3": "GLACIER", "gs": "ARCHIVE"}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|d|w)\s*$")
_AGE_S = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_age_s(text: str) -> float:
    """`90d`, `12h`, `2w` -> seconds; anything else is an `InputError` naming the flag."""
    match = _AGE.match(str(text))
    if not match:
        raise InputError(f"--older-than: expected an age such as 90d, 12h or 2w, got {text!r}")
    return float(match.group(1)) * _AGE_S[match.group(2)]


def protected_steps(manifests: Sequence[Manifest], *, latest_step: int | None) -> set[int]:
    """Steps gc never touches: the newest commit, the latest loadable one, the best, the pinned."""
    keep = {m.step for m in manifests if m.pinned}
    if manifests:
        keep.add(max(m.step for m in manifests))
    if latest_step is not None:
        keep.add(latest_step)
    best = best_step(manifests)
    if best is not None:
        keep.add(best)
    return keep


def stale_steps(manifests: Sequence[Manifest], *, latest_step: int | None, now_s: float, older_than_s: float) -> list[int]:
    """Committed steps older than `older_than_s` that gc may move to cold storage."""
    keep = protected_steps(manifests, latest_step=latest_step)
    return sorted(m.step for m in manifests if m.step not in keep and now_s - m.created_at_s >= older_than_s)


def find_runs(store: Store) -> list[str]:
    """Run folders under a store: "" when the store is itself a run, else `<run_id>` names."""
    runs = set()
    for key in store.list(""):
        head, _, rest = key.partition("/")
        if head == CKPT_DIR:
            runs.add("")
        elif rest.startswith(CKPT_DIR + "/"):
            runs.add(head)
    return sorted(runs)


@dataclass(frozen=True, kw_only=True, slots=True)
class ColdMove:
    """One object gc moves (or would move): `key` relative to the run's URL."""

    run_url: str
    step: int
    key: str
    age_days: float
    storage_class: str
    done: bool = False


def plan_cold_moves(url: str, *, older_than_s: float, storage_class: str, now_s: float) -> list[ColdMove]:
    """Blobs of stale checkpoints under `url` (a run or a bucket of runs) not yet cold.

    Manifests and rank notes stay in the standard class, so status and listings keep working
    and a reader meets a clear 'in cold storage' error instead of a missing checkpoint.
    """
    from skygreen.store import join_url, parse_url

    cold_already = set(COLD_CLASSES.get(parse_url(url).scheme, ()))
    root = open_store(url)
    moves = []
    for run in find_runs(root):
        run_url = join_url(url, run) if run else url
        store = open_store(run_url)
        manifests = list(iter_manifests(store))
        latest = latest_manifest(store)
        by_step = {m.step: m for m in manifests}
        for step in stale_steps(manifests, latest_step=latest.step if latest else None, now_s=now_s, older_than_s=older_than_s):
            manifest = by_step[step]
            for name in sorted(manifest.blobs):
                key = blob_key(step, name)
                if store.storage_class(key) in cold_already:
                    continue  # already cold; moving between cold classes needs a restore first
                age_days = (now_s - manifest.created_at_s) / 86400.0
                moves.append(ColdMove(run_url=run_url, step=step, key=key, age_days=age_days, storage_class=storage_class))
    return moves


def apply_cold_moves(moves: Sequence[ColdMove]) -> list[ColdMove]:
    """Move each planned object to its cold class; returns the moves marked done."""
    done = []
    stores: dict[str, Store] = {}
    for move in moves:
        store = stores.setdefault(move.run_url, open_store(move.run_url))
        store.set_storage_class(move.key, move.storage_class)
        done.append(ColdMove(**{**_fields(move), "done": True}))
    return done


def _fields(move: ColdMove) -> dict[str, Any]:
    return {name: getattr(move, name) for name in ColdMove.__slots__}
