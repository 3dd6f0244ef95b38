"""Cold storage for old checkpoints (`skygreen gc`): find stale steps, move their blobs cold.

Protected steps never move: the newest commit, the latest loadable one, the best by metric
and the pinned. Manifests and rank notes stay in the standard class.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skygreen.checkpoint.manifest import CKPT_DIR, Manifest, best_step, blob_key, iter_manifests, latest_manifest
from skygreen.checkpoint.store import Store, join_url, open_store, parse_url
from skygreen.errors import InputError

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


def plan_cold_moves(url: str, *, older_than_s: float, storage_class: str, now_s: float) -> list[ColdMove]:
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
        for step in stale_steps(
            manifests, latest_step=latest.step if latest else None, now_s=now_s, older_than_s=older_than_s
        ):
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
