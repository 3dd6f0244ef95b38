"""Reading and writing ledger segments through the checkpoint `Store` interface.

Each segment is one object, `<run>/ledger/<start>-<random>.json`, written whole by its only
writer (rank 0 of the VM that runs it) with the store's atomic put: S3 and GCS replace an
object atomically, the local store renames a finished temporary file over it. So a reader
sees the previous version or the next, never half of one; no object is ever read, changed and
written back, and a replacement VM never touches an older VM's object (it makes its own key).

`LedgerWriter` is the runtime's side: rank 0 keeps its VM's segment object up to date. The
segment is written when training starts (after the resume), at every checkpoint, and at exit
with how it ended; a VM killed without warning loses at most the time since the last
checkpoint. A failed write is a warning, never a reason to stop training: the ledger is for
accounting, the checkpoints are the run.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from skygreen.checkpoint.store import Store
from skygreen.checkpoint.traffic import traffic_of
from skygreen.errors import CheckpointError, StoreError
from skygreen.ledger.changeover import redone_steps
from skygreen.ledger.records import (
    LEDGER_DIR,
    RUNNING,
    Place,
    Segment,
    add_point,
    at_checkpoint,
    is_segment_key,
    new_segment_key,
    settle,
)

log = logging.getLogger("skygreen.ledger")
runtime_log = logging.getLogger("skygreen.runtime")
"""The writer's warnings go to the runtime's log, next to the training lines they interrupt."""


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


def read_run_ledger(store: Store) -> list[Segment]:
    """The run's segments as `read_ledger` gives them, with the last one at the step of the run's
    newest committed checkpoint (`latest_manifest`, the step `skygreen status` shows), so a run
    killed between a save and its commit reads the same step in `cost` as in `status`
    (`skygreen.ledger.records.at_checkpoint`).

    Args:
        store: the run's store, rooted at the run (`<bucket>/<run_id>`).

    Returns:
        The segments, oldest first; empty when the run has no ledger.

    Raises:
        StoreError: the ledger cannot be listed. A checkpoint folder that cannot be read leaves
            the ledger's own step.
    """
    from skygreen.checkpoint.manifest import latest_manifest

    segments = read_ledger(store)
    if not segments:
        return segments
    try:
        manifest = latest_manifest(store)
    except (StoreError, CheckpointError) as e:
        log.warning("ledger of %s: its checkpoints cannot be read (%s); showing the ledger's step", store.url, e)
        return segments
    return at_checkpoint(segments, manifest.step if manifest else None)


CHANGEOVER_FIELDS = ("setup_started_at", "setup_s", "restore_s", "restore_bytes")


class LedgerWriter:
    """Owns one segment object; the only writer of it."""

    def __init__(
        self,
        store: Store,
        *,
        run_id: str,
        place: Place,
        started_at: float,
        clock: Callable[[], float] = time.time,
        user: str | None = None,
        memory_planned_gb: Mapping[str, float] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.earlier: list[Segment] = []
        self.segment = Segment(
            run_id=run_id,
            key=new_segment_key(started_at),
            place=place,
            started_at=started_at,
            updated_at=started_at,
            user=user,
            memory_planned_gb=memory_planned_gb,
        )
        self._energy_base_j: float | None = None
        self._warned = False
        self._write_lock = threading.Lock()
        """One write at a time, each of the segment as it is when the write starts, so a later
        write always carries everything an earlier one did (a heartbeat's write in the background
        never lands over a newer checkpoint's)."""

    def begin(
        self,
        *,
        step: int,
        samples: int,
        samples_per_epoch: int | None,
        energy_j_total: float | None,
        total_steps: int | None = None,
        changeover: Mapping[str, Any] | None = None,
    ) -> None:
        """Read the earlier segments (for budgets) and write this one at its resume point.

        `changeover`: the setup and restore figures of this VM (`Segment`'s `setup_started_at`,
        `setup_s`, `restore_s`, `restore_bytes`); the steps redone are counted here, from the
        furthest step an earlier segment reached, its heartbeat's included (`redone_steps`)."""
        try:
            # This VM replaces any segment still marked running: its VM is gone (settled as
            # `read_ledger` will settle them once this segment is written).
            mine = replace(self.segment, start_step=step, step=step)
            before = [s for s in read_ledger(self.store) if s.key != mine.key]
            self.earlier = [s for s in settle([*before, mine]) if s.key != mine.key]
        except StoreError as e:
            self._warn(e)
        self._energy_base_j = energy_j_total
        self.segment = replace(
            self.segment,
            start_step=step,
            step=step,
            start_samples=samples,
            samples=samples,
            samples_per_epoch=samples_per_epoch,
            total_steps=total_steps,
            redone_steps=redone_steps(self.earlier, step),
            **{key: value for key, value in (changeover or {}).items() if key in CHANGEOVER_FIELDS},
        )
        self._write()

    def first_step(self) -> None:
        """Note when this segment's first training step began, once (later calls keep the first
        time); written with the next update."""
        if self.segment.first_step_at is None:
            self.segment = replace(self.segment, first_step_at=self.clock())

    def memory_peak(self, peak_gb: float, *, measure: str) -> None:
        """Note the measured peak memory per GPU (GB) and how it was measured; written with the next write."""
        self.segment = replace(self.segment, memory_peak_gb=round(peak_gb, 4), memory_measure=measure)

    def report(self, name: str, step: int, value: float) -> None:
        """Remember one reported metric value; written with the next update."""
        self.segment = replace(
            self.segment, metrics=add_point(self.segment.metrics, name, (step, self.clock(), float(value)))
        )

    def update(
        self, *, step: int, samples: int, train_s: float, energy_j_total: float | None, end: str = RUNNING
    ) -> None:
        """Progress so far; `end` other than running closes the segment. The step reached rises
        with it, so it never lags the step a checkpoint committed (the heartbeat raises it between)."""
        now = self.clock()
        energy = None
        if energy_j_total is not None and self._energy_base_j is not None:
            energy = max(0.0, energy_j_total - self._energy_base_j)
        self.segment = replace(
            self.segment,
            step=step,
            reached_step=max(step, self.segment.reached_step or 0),
            samples=samples,
            train_s=train_s,
            energy_j=energy,
            updated_at=max(now, self.segment.started_at),
            ended_at=None if end == RUNNING else max(now, self.segment.started_at),
            end=end,
        )
        self._write()

    def heartbeat(self, *, step: int, write: bool = True) -> None:
        """Between checkpoints: the time billed so far and the step reached, so a VM killed without
        a word is billed to its last heartbeat and the steps it trained past its last checkpoint
        count as redone (`skygreen.ledger.pricing`). `write=False` only notes them; `flush` (on
        another thread) writes them."""
        now = self.clock()
        reached = max(step, self.segment.step, self.segment.reached_step or 0)
        self.segment = replace(self.segment, updated_at=max(now, self.segment.started_at), reached_step=reached)
        if write:
            self._write()

    def flush(self) -> None:
        """Write the segment as it is now; safe from another thread than the one that updates it."""
        self._write()

    def counted(self) -> Segment:
        """The segment as it is now, with the bytes its store counted so far
        (`skygreen.checkpoint.traffic`; counters live for the process, as the segment does).
        A copy, so a write on another thread never races an update of `segment`."""
        segment = self.segment
        traffic = traffic_of(self.store)
        if traffic is None:
            return segment
        figures = traffic.figures()
        return replace(
            segment,
            bytes_uploaded=figures.bytes_uploaded,
            bytes_downloaded=figures.bytes_downloaded,
            checkpoint_bytes=figures.checkpoint_bytes,
        )

    def _write(self) -> None:
        with self._write_lock:
            try:
                write_segment(self.store, self.counted())
            except StoreError as e:
                self._warn(e)

    def _warn(self, error: Exception) -> None:
        if not self._warned:
            runtime_log.warning(
                "run ledger not written (%s); training goes on, cost figures will miss this VM",
                str(error).splitlines()[0],
            )
            self._warned = True
