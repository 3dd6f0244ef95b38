"""The deadline watcher of a run with several places: the nomad's choice, taken for real.

`skygreen watch` (`skygreen.deadline.watch`) hands a poll here when the run may go to more than
one place: the regions its plan handed to SkyPilot, or, for a local run, the places of a
replayed multi-region market (`SKYGREEN_TEST_SPOT_TRACE` naming one of the traces
`skygreen simulate` reads as a market, its first tick at the run's start). A run with one place
keeps the single-place policy.

Every poll: where the run is (the journey's last pin; for its first, unpinned launch, where the
launcher says it landed, or on a replayed market the cheapest place with spot up at launch, as
SkyPilot's optimizer tries the cheapest offer first), what each place costs now, what the run
has seen of each (spot hours, preemptions, launches that found no capacity), and its progress;
`skygreen.places.live.choose` decides; and the watcher takes one step, as the single-place
watcher does: nothing, cancel (the first half of a move: the runtime commits a checkpoint;
the target is saved first, so a watcher killed now finishes the move when restarted), or
relaunch the stopped run pinned to the chosen place (`skygreen.places.pin`) through
`skygreen.launch.runs.resume`, so the new life resumes from the checkpoint and takes over the
run's writer lease. Each move goes into the journey and the run's ledger, and is measured once
the new life's first step is in the ledger.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from skygreen.deadline.live import MODE_WORDS, DeadlineTerms, Decision, Progress, current_mode, needed_compute_h
from skygreen.deadline.policy import Mode
from skygreen.deadline.watch_state import WatchState, save_state, user_cancelled
from skygreen.errors import InputError, SkygreenError, StoreError
from skygreen.files import write_atomic
from skygreen.launch import runs
from skygreen.launch.bucket import within_deadline
from skygreen.launch.registry import RunRecord
from skygreen.launch.render import to_yaml
from skygreen.launch.wiring import Wiring, launcher_for
from skygreen.places.journey import (
    Journey,
    Move,
    load_journey,
    measure,
    move_key,
    place_json,
    place_of,
    plan_offers,
    save_journey,
)
from skygreen.places.live import LIVE_TICK_S, PlacePrice, Situation, choose
from skygreen.places.pin import bucket_for, pinned_task
from skygreen.places.place import Market, Place

TRACE_ENV = "SKYGREEN_TEST_SPOT_TRACE"
"""The replayed market (`skygreen.deadline.market.TRACE_ENV`); here when it names a multi-region one."""
LEDGER_WRITE_DEADLINE_S = 30.0
RENDERED_FILE = "task-unpinned.yaml"
"""The run's task as `up` rendered it, kept in its folder before the first pin."""
_ALIVE = {"PENDING", "STARTING", "RUNNING", "RECOVERING", "CANCELLING"}
_WAITING = {"PENDING", "STARTING", "RECOVERING"}


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPlaces:
    """The places a run may go, priced now, with spot availability where a market tells."""

    prices: tuple[PlacePrice, ...]
    available: tuple[bool | None, ...]
    tick_s: float = LIVE_TICK_S
    landed: int | None = None
    """On a replayed market: where an unpinned first launch landed (cheapest with spot up then)."""

    def index(self, place: Mapping[str, Any] | Place | None) -> int:
        """The index of a place (by cloud, region and zone), -1 when it is not one of these."""
        if place is None:
            return -1
        p = place if isinstance(place, Place) else place_of(place)
        for i, price in enumerate(self.prices):
            q = price.place
            if p is not None and (q.cloud, q.region) == (p.cloud, p.region) and (p.zone is None or q.zone == p.zone):
                return i
        return -1


def replayed_market(environ: Mapping[str, str]) -> Market | None:
    """The multi-region market `SKYGREEN_TEST_SPOT_TRACE` names, or None (unset, or one trace)."""
    path = environ.get(TRACE_ENV)
    if not path:
        return None
    from skygreen.places.traces import is_market, load_market

    if not is_market(Path(path)):
        return None
    try:
        return load_market(Path(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(
            f"{TRACE_ENV}={path}: not a multi-region market ({e})\n"
            "  fix: name a trace `skygreen simulate` reads as one (the H100 archive or folder, the V100 folder)"
        ) from e


def market_places(market: Market, terms: DeadlineTerms, *, now_s: float, launched_at_s: float) -> RunPlaces:
    """The market's places at `now_s`, its tick 0 at the run's start."""

    def tick(at_s: float) -> int:
        return int((at_s - terms.started_at_s) // market.tick_s)

    t = tick(now_s)
    inside = 0 <= t < market.ticks
    col = min(max(t, 0), market.ticks - 1)
    prices = tuple(
        PlacePrice(place=p, spot_usd_per_hour=float(market.spot_usd_per_hour[i, col]),
                   on_demand_usd_per_hour=float(market.on_demand_usd_per_hour[i]))
        for i, p in enumerate(market.places)
    )  # fmt: skip
    available = tuple(bool(market.available[i, col]) and inside for i in range(len(market.places)))
    first = min(max(tick(launched_at_s), 0), market.ticks - 1)
    up = [i for i in range(len(market.places)) if market.available[i, first]]
    landed = min(up, key=lambda i: market.spot_usd_per_hour[i, first]) if up else None
    return RunPlaces(prices=prices, available=available, tick_s=market.tick_s, landed=landed)


def offer_places(offers: Sequence[Mapping[str, Any]]) -> RunPlaces | None:
    """The regions of the plan's offers, each at the price of its best offer per hour of the run's
    work (a slower GPU's hour does less of it: its prices are scaled by its compute hours over the
    best offer's); None for fewer than two regions (the single-place policy holds such a run)."""
    best: dict[tuple[str, str], PlacePrice] = {}
    reference_h = next((float(o["compute_hours"]) for o in offers if o.get("compute_hours")), None)
    for o in offers:
        spot, od = o.get("spot_price_usd_per_hour"), o.get("on_demand_price_usd_per_hour")
        if not o.get("cloud") or not o.get("region") or spot is None or od is None:
            continue
        key = (str(o["cloud"]), str(o["region"]))
        nodes = int(o.get("num_nodes") or 1)
        slower = float(o["compute_hours"]) / reference_h if reference_h and o.get("compute_hours") else 1.0
        price = PlacePrice(place=Place(cloud=key[0], region=key[1], offer=str(o.get("instance_type") or ""), nodes=nodes),
                           spot_usd_per_hour=float(spot) * nodes * slower,
                           on_demand_usd_per_hour=float(od) * nodes * slower)  # fmt: skip
        if key not in best or price.spot_usd_per_hour < best[key].spot_usd_per_hour:
            best[key] = price
    if len(best) < 2:
        return None
    prices = tuple(best.values())
    return RunPlaces(prices=prices, available=(None,) * len(prices))


def run_places(
    record: RunRecord, terms: DeadlineTerms, environ: Mapping[str, str], *, now_s: float
) -> RunPlaces | None:
    """The places of a run held to a deadline, or None when it has only one."""
    market = replayed_market(environ)
    if market is not None:
        if len(market.places) < 2:
            return None
        launched = record.launches[0].started_at_s if record.launches and record.launches[0].started_at_s else None
        return market_places(market, terms, now_s=now_s, launched_at_s=launched or terms.started_at_s)
    if record.mode == "local":
        return None
    return offer_places(plan_offers(record.spec_snapshot, record.plan_summary))


@dataclass(frozen=True, kw_only=True, slots=True)
class Roam:
    """One poll of a multi-place run: the watcher's wiring, clock reading and voice."""

    wiring: Wiring
    record: RunRecord
    terms: DeadlineTerms
    places: RunPlaces
    now_s: float
    say: Callable[[str], None]
    checkpoint_gb: float = 0.0
    changeover_s_by_cloud: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        """The run's folder on this machine."""
        return self.wiring.registry.run_dir(self.record.run_id)

    @property
    def moves_to_measure(self) -> bool:
        """A move whose new life's first step has not been seen in the ledger yet."""
        journey = load_journey(self.run_dir)
        return journey is not None and not all(m.measured for m in journey.moves)

    def poll(self, state: WatchState, *, job_state: str, progress: Progress | None) -> None:
        """Decide and take at most one step (module docstring)."""
        record, places = self.record, self.places
        save_state(self.run_dir, state)
        journey = load_journey(self.run_dir) or Journey()
        spot = record.launches[-1].spot if record.launches else True
        here = places.index(journey.place)
        unpinned = len(record.launches) <= 1  # the first launch: SkyPilot places it, and may recover it elsewhere
        if here < 0 or (unpinned and job_state == "RUNNING"):
            landed = self._landed(places)
            if landed >= 0:
                here = landed
                journey = dataclasses.replace(journey, place=place_json(places.prices[here].place),
                                              mode=Mode.SPOT.value if spot else Mode.ON_DEMAND.value)  # fmt: skip
        available = list(places.available)
        if here >= 0 and spot and job_state == "RUNNING":
            available[here] = True
        elif here >= 0 and spot and job_state in _WAITING and self._waited_past_changeover():
            available[here] = False  # a spot launch that found no capacity: the next place is tried
        journey, preempted = self._learn(journey, here, spot=bool(spot), job_state=job_state, state=state)
        mode = current_mode(spot=spot, state=job_state, spot_available=available[here] if here >= 0 else None)
        if here < 0 and mode is not Mode.IDLE:  # where the job landed is not known yet
            save_journey(self.run_dir, journey)
            return
        if journey.target is not None and job_state not in _ALIVE:  # finish a move a watcher began
            target = places.index(journey.target)
            if target >= 0 and available[target] is not False:
                self._launch(journey, state, target, Mode(journey.target_mode or Mode.SPOT.value), here,
                             reason=journey.target_reason or "the move under way")  # fmt: skip
                return
            journey = dataclasses.replace(
                journey, target=None, target_mode=None, target_reason=None, target_scores=None
            )
        compute_h = None if progress is None else needed_compute_h(self.terms, progress)
        fraction = None if progress is None else progress.fraction
        if compute_h is None or fraction is None or job_state == "CANCELLING":
            save_journey(self.run_dir, journey)
            return
        situation = Situation(
            places=places.prices, available=tuple(available), at=here, mode=mode,
            work_left_h=compute_h * (1.0 - fraction), time_left_h=(self.terms.deadline_at_s - self.now_s) / 3600.0,
            changeover_h=self.terms.changeover_h, checkpoint_gb=self.checkpoint_gb,
            changeover_s_by_cloud=self.changeover_s_by_cloud,
            seen=tuple(journey.seen_at(p.place.name) for p in places.prices), now_s=self.now_s,
            latched=journey.latched, preempted=preempted, tick_s=places.tick_s,
        )  # fmt: skip
        choice = choose(situation)
        seen = dict(journey.seen)
        for r in choice.found_down:
            seen[places.prices[r].place.name] = dataclasses.replace(journey.seen_at(places.prices[r].place.name),
                                                                   failed_at_s=self.now_s)  # fmt: skip
        journey = dataclasses.replace(journey, seen=seen, latched=choice.latched)
        decision = self._decision(choice.mode, mode, choice.reason, fraction * compute_h, compute_h,
                                  spot_up=available[here] if here >= 0 else None)  # fmt: skip
        state = state.with_decision(decision)
        save_state(self.run_dir, state)
        save_journey(self.run_dir, journey)
        alive = job_state in _ALIVE
        same_place = choice.place == here or choice.mode is Mode.IDLE
        if alive:  # a spot job (running or queued for capacity) stays when spot here, or waiting, is the choice
            on_spot_here = (
                spot and same_place and choice.mode in (Mode.SPOT, Mode.IDLE) and available[here] is not False
            )
            if (choice.mode is mode and same_place) or on_spot_here or (choice.mode is Mode.IDLE and spot):
                return
            self._cancel(journey, state, choice.place, choice.mode, here, choice.reason, choice.scores_usd_per_hour)
        elif choice.mode is not Mode.IDLE:
            self._launch(journey, state, choice.place, choice.mode, here, reason=choice.reason,
                         scores=choice.scores_usd_per_hour)  # fmt: skip

    # ------------------------------------------------------------ steps

    def _landed(self, places: RunPlaces) -> int:
        """Where the run's unpinned first launch is: the launcher's word, else the replayed market's."""
        record = self.record
        if record.job_id is not None and places.landed is None:
            try:
                status = launcher_for(record, self.wiring).status(record.job_id)
            except SkygreenError:
                return -1
            if status.cloud and status.region:
                return places.index(Place(cloud=status.cloud.lower(), region=status.region))
            return -1
        return -1 if places.landed is None else places.landed

    def _waited_past_changeover(self) -> bool:
        """The latest launch has waited for capacity longer than a changeover (provisioning is part of it)."""
        launches = self.record.launches
        started = launches[-1].started_at_s if launches else None
        return started is not None and self.now_s - started > self.terms.changeover_h * 3600.0

    def _learn(
        self, journey: Journey, here: int, *, spot: bool, job_state: str, state: WatchState
    ) -> tuple[Journey, bool]:
        """The journey with this poll's spot hours and any new preemption at `here`; whether one was seen now."""
        preempted = False
        if here >= 0 and spot:
            name = self.places.prices[here].place.name
            seen = journey.seen_at(name)
            if job_state == "RUNNING" and journey.last_poll_s is not None:
                seen = dataclasses.replace(seen, run_h=seen.run_h + max(self.now_s - journey.last_poll_s, 0.0) / 3600.0)
            job = self.record.job_id
            ended = job_state not in _ALIVE or job_state == "RECOVERING"
            ours = state.cancelled_job == job or journey.target is not None  # the watcher's own cancel
            if ended and job_state != "SUCCEEDED" and not ours and journey.preempted_job != job:
                seen = dataclasses.replace(seen, preemptions=seen.preemptions + 1)
                journey = dataclasses.replace(journey, preempted_job=job)
                preempted = True
            journey = dataclasses.replace(journey, seen={**journey.seen, name: seen})
        return dataclasses.replace(journey, last_poll_s=self.now_s), preempted

    def _decision(self, wanted: Mode, mode: Mode, reason: str, progress_h: float, compute_h: float,
                  *, spot_up: bool | None) -> Decision:  # fmt: skip
        terms = self.terms
        return Decision(
            at_s=self.now_s, mode=wanted.value, current=mode.value, spot_available=bool(spot_up),
            spot_observed=spot_up is not None, elapsed_h=max((self.now_s - terms.started_at_s) / 3600.0, 0.0),
            deadline_h=terms.deadline_h, progress_h=progress_h, compute_h=compute_h,
            changeover_h=terms.changeover_h, reason=reason,
        )  # fmt: skip

    def _where(self, r: int, mode: Mode) -> str:
        return f"{MODE_WORDS[mode.value]} at {self.places.prices[r].place.name}" if r >= 0 else "idle"

    def _cancel(self, journey: Journey, state: WatchState, target: int, mode: Mode, here: int, reason: str,
                scores: Mapping[str, float | None]) -> None:  # fmt: skip
        """The first half of a move or a switch: the target first, then the cancel."""
        record = self.record
        goal = place_json(self.places.prices[target].place) if target >= 0 else None
        journey = dataclasses.replace(journey, target=goal, target_mode=mode.value if goal else None,
                                      target_reason=reason, target_scores=dict(scores), stopped_at=time.time())  # fmt: skip
        save_journey(self.run_dir, journey)
        was = self._where(here, Mode(journey.mode or Mode.SPOT.value))
        self.say(f"run {record.run_id} at {self._hours()}: {was} -> {self._where(target, mode)} ({reason})")
        runs.cancel(record.run_id, wiring=self.wiring, by_user=False)
        save_state(self.run_dir, dataclasses.replace(state, cancelled_job=record.job_id, switches=state.switches + 1))

    def _launch(self, journey: Journey, state: WatchState, target: int, mode: Mode, here: int, *, reason: str,
                scores: Mapping[str, float | None] | None = None) -> None:  # fmt: skip
        """Relaunch the stopped run at `target`, pinned there, and record the move when it is one."""
        record = self.record
        place = self.places.prices[target].place
        path = Path(record.task_yaml)
        try:
            task = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as e:
            raise SkygreenError(f"run {record.run_id}: cannot read its rendered task {path} to relaunch it: {e}") from e
        rendered = self.run_dir / RENDERED_FILE  # the plan's every candidate, kept before the first pin
        if not rendered.exists():
            write_atomic(rendered, to_yaml(task))
        first = yaml.safe_load(rendered.read_text(encoding="utf-8"))
        pinned = pinned_task(task, place, bucket=bucket_for(place, record.bucket), rendered=first)
        write_atomic(path, to_yaml(pinned))
        spot = mode is Mode.SPOT
        launched_at = time.time()
        relaunched = runs.resume(record.run_id, spot=spot, wiring=self.wiring)
        moves = journey.moves
        if here >= 0 and here != target:
            price = self.places.prices[target]
            move = Move(
                number=len(moves) + 1, launch=len(relaunched.launches), job_id=relaunched.job_id,
                src=place_json(self.places.prices[here].place), dst=place_json(place), mode=mode.value,
                reason=reason, scores_usd_per_hour=dict(scores if scores is not None else journey.target_scores or {}),
                decided_at_h=self._elapsed_h(),
                stopped_at=journey.stopped_at or launched_at, launched_at=launched_at,
                price_usd_per_hour=price.spot_usd_per_hour if spot else price.on_demand_usd_per_hour,
            )  # fmt: skip
            moves = (*moves, move)
            self.write_move(move)
        journey = dataclasses.replace(journey, place=place_json(place), mode=mode.value, target=None, target_mode=None,
                                      target_reason=None, target_scores=None, stopped_at=None, moves=moves)  # fmt: skip
        save_journey(self.run_dir, journey)
        switches = state.switches + (0 if state.cancelled_job else 1)
        save_state(self.run_dir, dataclasses.replace(state, cancelled_job=None, switches=switches,
                                                     relaunched_job=relaunched.job_id, relaunched_at_s=self.now_s))  # fmt: skip
        self.say(f"run {record.run_id}: relaunched {self._where(target, mode)} as job {relaunched.job_id} ({reason})")
        if user_cancelled(self.run_dir):  # the user's word wins over the policy's
            runs.cancel(record.run_id, wiring=self.wiring, by_user=False)

    def write_move(self, move: Move) -> None:
        """The move into the run's ledger in its bucket; a bucket that does not answer is told, not fatal."""
        record = self.record
        data = json.dumps(move.to_json(), sort_keys=True).encode("utf-8")
        try:
            within_deadline(record.bucket, lambda: self.wiring.open_store(record.checkpoint_url).put(move_key(move), data),
                            deadline_s=LEDGER_WRITE_DEADLINE_S)  # fmt: skip
        except (StoreError, SkygreenError) as e:
            self.say(
                f"run {record.run_id}: could not write move {move.number} to its ledger ({str(e).splitlines()[0]})"
            )

    def _elapsed_h(self) -> float:
        return max((self.now_s - self.terms.started_at_s) / 3600.0, 0.0)

    def _hours(self) -> str:
        return f"{self._elapsed_h():.2f} h of {self.terms.deadline_h:g} h"


def settle_moves(roam: Roam, segments: Sequence[Any]) -> None:
    """Measure the moves whose new life has its first step in `segments`, and write them to the ledger."""
    journey = load_journey(roam.run_dir)
    if journey is None or all(m.measured for m in journey.moves):
        return
    measured = tuple(measure(m, segments) for m in journey.moves)
    for before, after in zip(journey.moves, measured, strict=True):
        if after.measured and not before.measured:
            roam.write_move(after)
            usd = after.usd if after.usd is not None else math.nan
            roam.say(f"run {roam.record.run_id}: move {after.number} measured: {after.restore_bytes} bytes, "
                     f"changeover {after.changeover_s:.1f} s, ${usd:.4f}")  # fmt: skip
    save_journey(roam.run_dir, dataclasses.replace(journey, moves=measured))
