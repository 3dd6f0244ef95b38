"""Reading and writing ledger segments through the checkpoint `Store` interface.

Each segment is one object, `<run>/ledger/<start>-<random>.json`, written whole by its only
writer (rank 0 of the VM that runs it) with the store's atomic put: S3 and GCS replace an
object atomically, the local store renames a finished temporary file over it. So a reader
sees the previous version or the next, never half of one; no object is ever read, changed and
written back, and a replacement VM never touches an older VM's object (it makes its own key).
"""

from __future__ import annotations

import json
import logging

from skygreen.checkpoint.store import Store
from skygreen.errors import StoreError
from skygreen.ledger.records import LEDGER_DIR, Segment, is_segment_key, settle

log = logging.getLogger("skygreen.ledger")


def write_segment(store: Store, segment: Segment) -> None:
    """Put the segment's object (the whole of it) under its key."""
    store.put(segment.key, json.dumps(segment.to_json(), sort_keys=True).encode("utf-8"))


def read_ledger(store: Store, run_id: str | None = None) -> list[Segment]:
    """Every segment of a run, oldest first, numbered from 1; `killed` marks a segment that
    ended without writing its end and was replaced.

    `store` is rooted at the run (`<bucket>/<run_id>`), or at the bucket with `run_id` given.
    An unreadable object is skipped with a warning (a foreign file must not hide the rest).
    This is the ledger's public read API: cost, plans, budgets and deadline watchers use it.
    """
    prefix = f"{run_id}/" if run_id else ""
    segments = []
    for key in store.list(f"{prefix}{LEDGER_DIR}/"):
        rel = key[len(prefix) :]
        if not is_segment_key(rel):
            continue
        try:
            segments.append(Segment.from_json(json.loads(store.get(key))))
        except (StoreError, ValueError, TypeError, KeyError) as e:
            log.warning("skipping unreadable ledger object %s: %s", key, e)
    return settle(segments)
