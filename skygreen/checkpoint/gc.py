"""Cold storage for old checkpoints (`skygreen gc`): find stale steps, move their blobs cold.

Protected steps never move: the newest commit, the latest loadable one, the best by metric
and the pinned. Manifests and rank notes stay in the standard class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skygreen.checkpoint.bucket_set import is_set_url, members
from skygreen.checkpoint.manifest import CKPT_DIR, Manifest, blob_key, iter_manifests, latest_manifest
from skygreen.checkpoint.retention import best_step
from skygreen.checkpoint.store import OpenStore, Store, join_url, parse_url
from skygreen.errors import InputError
from skygreen.task.readers import read_duration_s

COLD_CLASSES = {
    "s3": ("GLACIER", "DEEP_ARCHIVE", "GLACIER_IR"),
    "gs": ("ARCHIVE", "COLDLINE", "NEARLINE"),
    "az": ("ARCHIVE", "COLD", "COOL"),
}
DEFAULT_COLD_CLASS = {"s3": "GLACIER", "gs": "ARCHIVE", "az": "ARCHIVE"}


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


def stale_steps(
    manifests: Sequence[Manifest], *, latest_step: int | None, now_s: float, older_than_s: float
) -> list[int]:
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


@dataclass(frozen=True, kw_only=True, slots=True)
class GcResult:
    """What `skygreen gc` found under `url`, and whether it moved it (`act`)."""

    url: str
    local: bool
    """A local directory: cold storage classes do not apply, nothing was looked at."""
    act: bool = False
    older_than: str = ""
    moves: tuple[ColdMove, ...] = ()
    """Done when `act` was true, else only planned."""

    def lines(self) -> list[str]:
        """The report, one line per object and a summary, as `skygreen gc` prints it."""
        if self.local:
            return [f"{self.url} is a local directory: cold storage classes do not apply; nothing to move"]
        if not self.moves:
            kept = "(latest, best and pinned checkpoints are kept)"
            return [f"nothing older than {self.older_than} to move under {self.url} {kept}"]
        verb = "moved" if self.act else "would move"
        lines = [
            f"{verb} {m.run_url}/{m.key} (step {m.step}, {m.age_days:.0f} days old) to {m.storage_class}"
            for m in self.moves
        ]
        if not self.act:
            lines.append(f"dry run: {len(self.moves)} object(s); run again with --yes to move them")
        return lines


def cold_storage_class(scheme: str, requested: str | None) -> str:
    """The cold class to move to: the requested one (checked against the cloud), else the default."""
    allowed = COLD_CLASSES[scheme]
    cold = (requested or DEFAULT_COLD_CLASS[scheme]).upper()
    if cold not in allowed:
        raise InputError(
            f"--storage-class: {requested!r} is not a cold class for {scheme}://\n  allowed: {', '.join(allowed)}"
        )
    return cold


def gc(
    url: str,
    *,
    open_store: OpenStore,
    older_than: str,
    storage_class: str | None,
    act: bool,
    now_s: float,
    check_bucket: Callable[[str], None] | None = None,
) -> GcResult:
    """Move checkpoints under `url` older than `older_than` to a cold class; `act=False` only plans.
    `check_bucket(url)` runs before any listing: the laptop's bounded check that the bucket
    answers (`skygreen.launch.bucket.check_readable`), so a dead bucket fails in one line."""
    scheme = parse_url(url).scheme
    if scheme == "file":
        return GcResult(url=url, local=True, act=act, older_than=older_than)
    if is_set_url(url):  # each cloud names its cold classes its own way
        raise InputError(
            f"{url}: this is a bucket set, and skygreen gc moves one bucket's checkpoints to its cloud's cold class\n"
            f"  fix: run skygreen gc on each of its buckets: {', '.join(m.url for m in members(url))}"
        )
    cold = cold_storage_class(scheme, storage_class)
    if check_bucket is not None:
        check_bucket(url)
    older_than_s = read_duration_s(older_than, "--older-than")
    moves = plan_cold_moves(url, open_store=open_store, older_than_s=older_than_s, storage_class=cold, now_s=now_s)
    if act and moves:
        moves = apply_cold_moves(moves, open_store=open_store)
    return GcResult(url=url, local=False, act=act, older_than=older_than, moves=tuple(moves))


def plan_cold_moves(
    url: str, *, open_store: OpenStore, older_than_s: float, storage_class: str, now_s: float
) -> list[ColdMove]:
    """Blobs of stale checkpoints under `url` (a run or a bucket of runs) not yet cold.

    Manifests and rank notes stay in the standard class, so status and listings keep working
    and a reader meets a clear 'in cold storage' error instead of a missing checkpoint.
    """
    cold_already = set(COLD_CLASSES.get(parse_url(url).scheme, ()))
    root = open_store(url)
    moves = []
    for run in find_runs(root):
        run_url = join_url(url, run) if run else url
        store = open_store(run_url)
        manifests = list(iter_manifests(store))
        latest = latest_manifest(store)
        by_step = {m.step: m for m in manifests}
        latest_step = latest.step if latest else None
        for step in stale_steps(manifests, latest_step=latest_step, now_s=now_s, older_than_s=older_than_s):
            manifest = by_step[step]
            for name in sorted(manifest.blobs):
                key = blob_key(step, name)
                if store.storage_class(key) in cold_already:
                    continue  # already cold; moving between cold classes needs a restore first
                age_days = (now_s - manifest.created_at_s) / 86400.0
                moves.append(
                    ColdMove(run_url=run_url, step=step, key=key, age_days=age_days, storage_class=storage_class)
                )
    return moves


def apply_cold_moves(moves: Sequence[ColdMove], *, open_store: OpenStore) -> list[ColdMove]:
    """Move each planned object to its cold class; returns the moves marked done."""
    done = []
    stores: dict[str, Store] = {}
    for move in moves:
        if move.run_url not in stores:
            stores[move.run_url] = open_store(move.run_url)
        stores[move.run_url].set_storage_class(move.key, move.storage_class)
        done.append(dataclasses.replace(move, done=True))
    return done
