"""Retention: what to delete after a commit, without ever losing the only good checkpoint.

After each commit the checkpointer keeps the last `keep`, the best by metric and every pinned
checkpoint, and deletes the rest. Only checkpoints that verify count:

- the one just committed is never deleted, and checkpoints newer than it are not this
  life's (a resumed run skipped them because they did not load): they never count towards
  `keep`, so they can never push out a checkpoint that loads;
- older checkpoints whose manifest is unreadable or whose blobs are missing or short (a size
  check, no download) do not count either;
- a life that no longer holds the run's writer lease (`skygreen.checkpoint.lease`: a newer
  launch took over the folder) deletes and moves nothing;
- unloadable checkpoints are not deleted but moved aside to `<run>/quarantine/<step>/`,
  named in one log line, after a newer commit exists: the bytes stay for a post-mortem, and
  no reader will ever try them again.

Without these rules a run whose newer checkpoints were all corrupt restarted from step 0 and
then deleted each new good checkpoint right after committing it, since the corrupt newer
ones filled `keep`: a second interruption lost everything again.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence

from skygreen.checkpoint.keep import check_keep
from skygreen.checkpoint.lease import Lease, check_lease
from skygreen.checkpoint.manifest import (
    CKPT_DIR,
    Manifest,
    committed_steps,
    delete_step,
    missing_blobs,
    read_manifest,
    step_folders,
    step_prefix,
)
from skygreen.checkpoint.store import Store
from skygreen.errors import CheckpointError, StoreError, TransientStoreError

log = logging.getLogger("skygreen.retention")

QUARANTINE_DIR = "quarantine"
"""Unloadable checkpoints move from `ckpt/<step>/` to `quarantine/<step>/` under the run."""


def best_step(manifests: Sequence[Manifest]) -> int | None:
    """The step with the best metric (by the newest manifest's mode); ties go to the newest."""
    scored = [(m, m.metric) for m in manifests if m.metric is not None]
    if not scored:
        return None
    mode = max(scored, key=lambda pair: pair[0].step)[0].metric_mode
    sign = 1.0 if mode == "min" else -1.0
    return min(scored, key=lambda pair: (sign * pair[1], -pair[0].step))[0].step


def retained_steps(manifests: Sequence[Manifest], *, keep: int) -> set[int]:
    """The steps retention keeps: the last `keep`, the best by metric, and every pinned one."""
    check_keep(keep)
    steps = sorted(m.step for m in manifests)
    kept = set(steps[-keep:])
    best = best_step(manifests)
    if best is not None:
        kept.add(best)
    kept.update(m.step for m in manifests if m.pinned)
    return kept


def deletable_steps(
    manifests: Sequence[Manifest], folder_steps: Sequence[int], *, keep: int, newest: int | None = None
) -> list[int]:
    """Step folders to delete after a commit.

    Only folders older than the newest commit (`newest`, default the newest of `manifests`)
    go: committed ones retention does not keep, and uncommitted leftovers of saves that
    died. Folders newer than it may be a save in flight on another rank, so they stay.
    `manifests` are the checkpoints that count (`apply_retention` leaves out those that do not
    verify).
    """
    if not manifests:
        return []
    newest = max(m.step for m in manifests) if newest is None else newest
    kept = retained_steps(manifests, keep=keep) | {newest}
    return sorted(s for s in set(folder_steps) if s < newest and s not in kept)


def apply_retention(
    store: Store,
    *,
    keep: int,
    committed_step: int | None = None,
    unloadable: Mapping[int, str] | None = None,
    lease: Lease | None = None,
) -> list[int]:
    """Delete what retention no longer needs and quarantine what does not load; returns the
    deleted steps. `committed_step`: the checkpoint just committed (default: the newest
    manifest). `unloadable`: steps the caller found unloadable (reason per step), quarantined
    unless one of them is `committed_step` itself. `lease`: the caller's writer lease, checked
    before anything is deleted or moved.

    Raises:
        LeaseLostError: a newer life of the run holds the lease; nothing was deleted.
    """
    manifests, broken = _readable_manifests(store)
    newest = committed_step if committed_step is not None else max((m.step for m in manifests), default=None)
    if newest is None:
        return []
    broken = {step: why for step, why in broken.items() if step < newest}
    counted: list[Manifest] = []
    for manifest in manifests:
        if manifest.step > newest:
            continue  # not loaded by this life: neither counted nor deleted here
        problems = [] if manifest.step == committed_step else missing_blobs(store, manifest)
        if problems:
            broken[manifest.step] = "; ".join(problems)
        else:
            counted.append(manifest)
    broken.update({step: why for step, why in (unloadable or {}).items() if step != committed_step})
    folders = step_folders(store.list(CKPT_DIR + "/"))
    doomed = deletable_steps(counted, [s for s in folders if s not in broken], keep=keep, newest=newest)
    if lease is not None and (doomed or broken):
        check_lease(store, lease)
    for step in doomed:
        delete_step(store, step)
    if doomed:
        log.info("retention: deleted checkpoint steps %s", ", ".join(map(str, doomed)))
    quarantine_steps(store, {step: why for step, why in broken.items() if step in folders})
    return doomed


def _readable_manifests(store: Store) -> tuple[list[Manifest], dict[int, str]]:
    """Committed manifests, newest first, and the steps whose manifest cannot be read."""
    manifests, unreadable = [], {}
    for step in reversed(committed_steps(store)):
        try:
            manifests.append(read_manifest(store, step))
        except TransientStoreError:
            raise
        except (CheckpointError, StoreError) as e:
            unreadable[step] = first_line(e)
    return manifests, unreadable


def quarantine_key(key: str) -> str:
    """`ckpt/<step>/<name>` -> `quarantine/<step>/<name>`."""
    return QUARANTINE_DIR + "/" + key.removeprefix(CKPT_DIR + "/")


def quarantine_steps(store: Store, reasons: Mapping[int, str]) -> list[int]:
    """Move each step's folder to `quarantine/`: copy every object, then delete the folder
    (manifest first, so it stops being a commit at once). One log line names them all; a
    step that cannot be moved now stays where it is and is tried again after the next commit."""
    moved = []
    for step in sorted(reasons, reverse=True):
        try:
            for key in store.list(step_prefix(step)):
                _copy(store, key, quarantine_key(key))
            delete_step(store, step)
            moved.append(step)
        except StoreError as e:
            log.warning("could not quarantine checkpoint step %d: %s", step, first_line(e))
    if moved:
        why = "; ".join(f"step {step}: {reasons[step]}" for step in moved)
        log.warning(
            "quarantined unloadable checkpoint steps %s to %s/%s/ (%s)",
            ", ".join(map(str, moved)), store.url.rstrip("/"), QUARANTINE_DIR, why,
        )  # fmt: skip
    return moved


def _copy(store: Store, source: str, target: str) -> None:
    """Through a temporary file, so a multi-GB blob never sits in memory."""
    with tempfile.TemporaryFile() as spool:
        store.get_to(source, spool)
        spool.seek(0)
        store.put(target, spool)


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of the error's message, for a one-line log or reason: cut to `limit`
    characters (ending in "..."), or the error's class name where the message is empty."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."
