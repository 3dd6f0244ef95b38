"""`skygreen watch RUN`: hold a run to its deadline by moving it between spot and on-demand.

Every poll the watcher reads the run's record, its job's state (launcher), its progress (the
run ledger in its bucket) and, where something can tell, spot availability; the pure core
(`skygreen.deadline.live`) decides with the same policy objects `skygreen simulate` replays,
and the watcher takes one step: nothing, cancel the job (the first half of a switch: the
runtime commits a checkpoint), or relaunch the stopped run on spot or on-demand with the same
run id (`skygreen.launch.runs.resume`, so it continues from its checkpoint).

Restartable and idempotent: one watcher per run (`skygreen.deadline.watch_state.watcher_lock`),
every fact re-read each poll, its own memory in the run's folder; a second `watch` of a watched
run says so and exits 0. It ends when the run completes, fails, stops at its budget or is
cancelled by the user (the user's word wins over the policy's).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from skygreen.costs.changeovers import measured_changeovers
from skygreen.deadline.live import (
    MODE_WORDS,
    Action,
    DeadlineTerms,
    Decision,
    Progress,
    current_mode,
    decide,
    finished_at_s,
    next_action,
    progress_from,
    spot_reading,
)
from skygreen.deadline.policy import Mode
from skygreen.deadline.watch_state import WatchState, load_state, save_state, user_cancelled, watcher_lock
from skygreen.errors import InputError, SkygreenError, StoreError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.launch import runs
from skygreen.launch.bucket import within_deadline
from skygreen.launch.launcher import JobState
from skygreen.launch.registry import RunRecord
from skygreen.launch.status import BUDGET_STATE, run_state
from skygreen.launch.wiring import Wiring, launcher_for
from skygreen.ledger.io import read_ledger
from skygreen.ledger.records import Segment
from skygreen.places.watcher import Roam, run_places, settle_moves

LEDGER_READ_DEADLINE_S = 30.0
"""A poll gives up reading the ledger after this long and decides at the next one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class WatchResult:
    """How a `watch` ended: why, and the exit code the command returns."""

    run_id: str
    reason: str
    exit_code: int
    state: WatchState
    outcome: str | None = None
    """The reason in a few words (`deadline met`, `missed by 0.50 h`, ...); None while watching."""
    at_s: float = 0.0
    """When the run ended, as far as the watcher can tell (its clock)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Watch:
    """One run's watcher: its wiring, its clock and (for a replayed market) spot availability."""

    run_id: str
    wiring: Wiring
    clock: Callable[[], float]
    """Unix seconds (`skygreen.deadline.clock.now_s`)."""
    market: Callable[[DeadlineTerms], Callable[[float], bool]] | None = None
    """Builds an availability reading for a run's terms (a replayed trace); None: infer it."""
    say: Callable[[str], None] = lambda line: None
    """Where the watcher's one-line events go (the CLI prints them, with the time)."""

    def run(self, *, poll_s: float, once: bool = False) -> WatchResult:
        """Poll until the run ends (or once); a run already watched elsewhere returns at once."""
        registry = self.wiring.registry
        record = registry.load(self.run_id)
        if record.deadline is None:
            raise InputError(
                f"run {record.run_id} was launched without a deadline; there is nothing to watch\n"
                f"  fix: launch with `skygreen up TASK --deadline 36h`"
            )
        changeover_s = DeadlineTerms.from_json(record.deadline).changeover_h * 3600.0
        if not once and poll_s > changeover_s:  # the policies hold the deadline deciding every d or less
            self.say(
                f"polling every {changeover_s / 60:.1f} min (the run's changeover) rather than every "
                f"{poll_s / 60:g} min: the deadline holds only with a look at least once per changeover"
            )
            poll_s = changeover_s
        run_dir = registry.run_dir(record.run_id)
        with watcher_lock(run_dir) as mine:
            if not mine:
                state = load_state(run_dir)
                return WatchResult(
                    run_id=record.run_id,
                    reason=f"run {record.run_id} is already watched (pid {state.pid}); nothing to do",
                    exit_code=0,
                    state=state,
                )
            save_state(run_dir, dataclasses.replace(load_state(run_dir), pid=os.getpid(), ended=None))
            while True:
                try:
                    result = self.poll()
                except SkygreenError as e:  # a launcher or bucket that refused this time
                    if once:
                        raise
                    self.say(f"poll failed: {str(e).splitlines()[0]}; trying again in {poll_s:g} s")
                    result = None
                if result is not None or once:
                    return result or WatchResult(
                        run_id=record.run_id, reason="one poll done", exit_code=0, state=load_state(run_dir)
                    )
                time.sleep(poll_s)

    def poll(self) -> WatchResult | None:
        """One look and at most one step; a `WatchResult` once there is nothing left to watch."""
        registry = self.wiring.registry
        record = registry.load(self.run_id)
        run_dir = registry.run_dir(record.run_id)
        state = load_state(run_dir)
        terms = DeadlineTerms.from_json(record.deadline or {})
        now_s = self.clock()
        first_look = state.heartbeat_at_s is None
        state = dataclasses.replace(state, heartbeat_at_s=now_s, pid=os.getpid())
        current = run_state(record, wiring=self.wiring)  # the job and the checkpoint; no spend, no views
        roam = self._roam(record, terms, now_s, current.manifest)  # a run with several places: the nomad
        ended = self._ended(record, current.state, current.completed, state, terms, now_s)
        if roam is not None and roam.moves_to_measure:
            segments = self._segments(record, then="measuring its moves at the next poll")
            if segments is not None:
                settle_moves(roam, segments)
        if ended is not None:
            elapsed_h = (ended.at_s - terms.started_at_s) / 3600.0
            save_state(
                run_dir,
                dataclasses.replace(
                    state, ended=ended.reason, outcome=ended.outcome, ended_at_h=elapsed_h, cancelled_job=None
                ),
            )
            return dataclasses.replace(ended, state=load_state(run_dir))
        spot = record.launches[-1].spot if record.launches else True
        job_state = current.state
        market = self.market(terms)(now_s) if self.market is not None else None
        available, observed = spot_reading(
            market=market,
            spot=spot,
            state=job_state,
            history=state.availability,
            now_s=now_s,
            launched_at_s=_launched_at_s(record, state, terms),
            changeover_h=terms.changeover_h,
        )
        if observed:
            state = dataclasses.replace(state, availability=state.availability.record(now_s, available))
        progress = self._progress(record)
        if roam is not None:
            roam.poll(state, job_state=job_state, progress=progress)
            return None
        mode = current_mode(spot=spot, state=job_state, spot_available=available)
        decision = None
        if progress is not None:
            decision = decide(
                terms,
                now_s=now_s,
                progress=progress,
                mode=mode,
                spot_available=available,
                spot_observed=observed,
                history=state.availability,
            )
        if decision is None:
            save_state(run_dir, state)
            if first_look:
                self.say(f"run {record.run_id}: waiting for its first steps in the ledger before deciding")
            return None
        state = state.with_decision(decision)
        launcher = launcher_for(record, self.wiring)
        action = next_action(
            wanted=Mode(decision.mode),
            spot=spot,
            state=job_state,
            queues_for_spot=bool(getattr(launcher, "queues_for_spot", False)),
        )
        save_state(run_dir, state)
        self._act(action, record, state, decision)
        return None

    # ------------------------------------------------------------ steps

    def _act(self, action: Action, record: RunRecord, state: WatchState, decision: Decision) -> None:
        run_dir = self.wiring.registry.run_dir(record.run_id)
        if action is Action.NONE:
            return
        was, now = MODE_WORDS[decision.current], MODE_WORDS[decision.mode]
        self.say(f"run {record.run_id} at {_when(decision)}: {was} -> {now} ({decision.reason})")
        if action is Action.CANCEL:
            runs.cancel(record.run_id, wiring=self.wiring, by_user=False)
            save_state(run_dir, dataclasses.replace(state, cancelled_job=record.job_id, switches=state.switches + 1))
            return
        spot = action is Action.LAUNCH_SPOT
        relaunched = runs.resume(record.run_id, spot=spot, wiring=self.wiring)
        switches = state.switches + (0 if state.cancelled_job else 1)
        save_state(
            run_dir,
            dataclasses.replace(
                state,
                cancelled_job=None,
                switches=switches,
                relaunched_job=relaunched.job_id,
                relaunched_at_s=decision.at_s,
            ),
        )
        self.say(f"run {record.run_id}: relaunched on {'spot' if spot else 'on-demand'} as job {relaunched.job_id}")
        if user_cancelled(run_dir):  # the user cancelled while the launch was under way: the user's word wins
            runs.cancel(record.run_id, wiring=self.wiring, by_user=False)
            self.say(f"run {record.run_id}: cancelled job {relaunched.job_id} again, as the user cancelled the run")

    def _ended(
        self,
        record: RunRecord,
        job_state: str,
        completed: bool,
        state: WatchState,
        terms: DeadlineTerms,
        now_s: float,
    ) -> WatchResult | None:
        """A result when the run needs no more watching, else None."""

        def done(reason: str, code: int, outcome: str, at_s: float = now_s) -> WatchResult:
            return WatchResult(
                run_id=record.run_id, reason=reason, exit_code=code, state=state, outcome=outcome, at_s=at_s
            )

        if completed or job_state == JobState.SUCCEEDED.value:
            segments = self._segments(record, then="dating its end to now")
            end_s = now_s if segments is None else finished_at_s(segments, now_s=now_s, wall_now_s=time.time())
            late_h = (end_s - terms.deadline_at_s) / 3600.0
            verdict = "deadline met" if late_h <= 0 else f"deadline missed by {late_h:.2f} h"
            elapsed_h = (end_s - terms.started_at_s) / 3600.0
            reason = f"run {record.run_id} finished after {elapsed_h:.2f} h of {terms.deadline_h:g} h: {verdict}"
            return done(reason, 0, verdict.removeprefix("deadline ") if late_h > 0 else verdict, end_s)
        if job_state == JobState.FAILED.value:
            return done(f"run {record.run_id} failed; the watcher stops (`skygreen logs {record.run_id}`)", 1, "failed")
        if job_state == BUDGET_STATE.upper():
            return done(
                f"run {record.run_id} stopped at its budget; the watcher stops",
                PREEMPTED_EXIT_CODE,
                "stopped at budget",
            )
        if user_cancelled(self.wiring.registry.run_dir(record.run_id)):
            return done(f"run {record.run_id} was cancelled by the user; the watcher stops", 0, "cancelled")
        return None

    def _roam(self, record: RunRecord, terms: DeadlineTerms, now_s: float, manifest: Any) -> Roam | None:
        """The nomad's poll of a run with several places (`skygreen.places.watcher`); None for one place."""
        places = run_places(record, terms, self.wiring.environ, now_s=now_s)
        if places is None:
            return None
        gb = sum(b.size for b in manifest.blobs.values()) / 1e9 if manifest is not None else 0.0
        measured = measured_changeovers(record.task_path, registry=self.wiring.registry).seconds
        by_cloud = {key: s for key, s in measured.items() if "/" not in key}  # per cloud, all its GPUs
        return Roam(wiring=self.wiring, record=record, terms=terms, places=places, now_s=now_s, say=self.say,
                    checkpoint_gb=gb, changeover_s_by_cloud=by_cloud)  # fmt: skip

    def _progress(self, record: RunRecord) -> Progress | None:
        """The run's progress from its ledger; None when the bucket did not answer this time."""
        segments = self._segments(record, then="deciding at the next poll")
        return None if segments is None else progress_from(segments)

    def _segments(self, record: RunRecord, *, then: str) -> list[Segment] | None:
        """The run's ledger segments; None (and a line saying why, and `then` what) when the bucket did not answer."""
        url = record.checkpoint_url
        try:
            return within_deadline(
                record.bucket,
                lambda: read_ledger(self.wiring.open_store(url)),
                deadline_s=LEDGER_READ_DEADLINE_S,
            )
        except (StoreError, SkygreenError) as e:
            self.say(f"run {record.run_id}: cannot read its ledger ({str(e).splitlines()[0]}); {then}")
            return None


def _launched_at_s(record: RunRecord, state: WatchState, terms: DeadlineTerms) -> float | None:
    """When the run's current job was launched, on the watcher's clock: as its launch recorded it
    (whoever launched it), else as the watcher knows it: its own latest relaunch, or `up`'s first
    launch (the terms' start)."""
    if record.launches and record.launches[-1].started_at_s is not None:
        return record.launches[-1].started_at_s
    if state.relaunched_job is not None and state.relaunched_job == record.job_id:
        return state.relaunched_at_s
    if len(record.launches) == 1:
        return terms.started_at_s
    return None


def _when(decision: Decision) -> str:
    at = datetime.fromtimestamp(decision.at_s, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{at} ({decision.elapsed_h:.2f} h of {decision.deadline_h:g} h)"
