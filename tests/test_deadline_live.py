"""The live deadline core: terms, progress from the ledger, availability, decisions, actions.

All pure: the watcher's whole decision is checked here without processes; the end-to-end
test (`test_deadline_watch.py`) runs it against real local runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from skygreen.deadline.live import (
    RETRY_H,
    Action,
    Availability,
    DeadlineTerms,
    Progress,
    current_mode,
    decide,
    needed_compute_h,
    next_action,
    progress_from,
    spot_reading,
)
from skygreen.deadline.policy import ExpectedSpot, Job, Mode, Observation, UniformProgress
from skygreen.ledger.records import Place, Segment, new_segment_key, settle

T0 = 1_800_000_000.0
H = 3600.0


def terms(**overrides: Any) -> DeadlineTerms:
    values: dict[str, Any] = dict(
        started_at_s=T0, deadline_at_s=T0 + 16 * H, changeover_h=0.1, policy="uniform_progress", compute_h=6.0
    )
    values.update(overrides)
    return DeadlineTerms(**values)


def segment(*, started_at: float, start_step: int, step: int, train_s: float, total_steps: int | None = 300) -> Segment:
    return Segment(
        run_id="r",
        key=new_segment_key(started_at),
        place=Place(cloud="local"),
        started_at=started_at,
        updated_at=started_at + train_s + 5,
        start_step=start_step,
        step=step,
        train_s=train_s,
        total_steps=total_steps,
    )


# -- terms -------------------------------------------------------------------------------------


def test_terms_round_trip_and_deadline_hours():
    t = terms(spot_usd_per_hour=1.0, on_demand_usd_per_hour=3.0, nodes=2)
    assert DeadlineTerms.from_json({**t.to_json(), "from_a_newer_version": 1}) == t
    assert t.deadline_h == 16.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"deadline_at_s": T0}, "after the start"),
        ({"changeover_h": 0.0}, "changeover_h"),
        ({"compute_h": -1.0}, "compute_h"),
        ({"policy": "optimum"}, "unknown deadline policy"),
    ],
)
def test_terms_refuse_what_cannot_be_held(overrides, message):
    with pytest.raises(ValueError, match=message):
        terms(**overrides)


def test_skygreen_policy_is_told_the_price_ratio():
    policy = terms(policy="skygreen").make_policy(price_ratio=4.5)
    assert isinstance(policy, ExpectedSpot) and policy.price_ratio == 4.5
    assert isinstance(terms().make_policy(price_ratio=4.5), UniformProgress)


# -- progress from the ledger ------------------------------------------------------------------


def test_progress_counts_the_furthest_step_and_the_timed_throughput():
    first = segment(started_at=T0, start_step=0, step=100, train_s=50.0)
    second = segment(started_at=T0 + 100, start_step=90, step=150, train_s=40.0)
    progress = progress_from([first, second])
    assert progress.step == 150 and progress.total_steps == 300
    assert progress.fraction == pytest.approx(0.5)
    # 160 timed steps in 90 s: 300 steps take 168.75 s
    assert progress.measured_compute_h == pytest.approx(300 * 90 / 160 / 3600)
    assert progress.timed_train_s == pytest.approx(90.0)  # what that measure rests on


def test_progress_of_a_killed_segment_counts_the_steps_its_seconds_were_measured_over():
    # Killed at step 180 (its last write, 90 s of training), replaced by a segment resuming from
    # the checkpoint at 150: settling moves the first back to 150, but its 90 s trained 180 steps.
    killed = segment(started_at=T0, start_step=0, step=180, train_s=90.0)
    resumed = segment(started_at=T0 + 200, start_step=150, step=150, train_s=0.0)
    settled = settle([killed, resumed])
    assert settled[0].step == 150 and settled[0].timed_steps == 180
    progress = progress_from(settled)
    assert progress.measured_compute_h == pytest.approx(300 * 90 / 180 / 3600)  # 2 steps/s, not 1.67


def test_progress_without_total_steps_or_timed_steps_is_unknown():
    assert progress_from([]).fraction is None
    untimed = segment(started_at=T0, start_step=0, step=0, train_s=0.0)
    assert progress_from([untimed]).measured_compute_h is None
    no_total = segment(started_at=T0, start_step=0, step=10, train_s=5.0, total_steps=None)
    assert progress_from([no_total]).fraction is None


# -- availability ------------------------------------------------------------------------------


def test_availability_keeps_changes_and_measures_stretches():
    history = Availability()
    for at_h, up in [(0, True), (0.5, True), (2, False), (3, False), (5, True)]:
        history = history.record(T0 + at_h * H, up)
    assert history.changes == ((T0, True), (T0 + 2 * H, False), (T0 + 5 * H, True))
    seen_h, stretches, up_h = history.stats(start_s=T0, now_s=T0 + 6.5 * H)
    assert (seen_h, stretches, up_h) == pytest.approx((3.5, 2, 1.5))
    assert history.last_unavailable_s() == T0 + 2 * H


def test_spot_reading_prefers_the_market_then_the_job_then_a_retry():
    empty = Availability()
    assert spot_reading(market=False, spot=True, state="RUNNING", history=empty, now_s=T0) == (False, True)
    assert spot_reading(market=None, spot=True, state="RUNNING", history=empty, now_s=T0) == (True, True)
    assert spot_reading(market=None, spot=True, state="RECOVERING", history=empty, now_s=T0) == (False, True)
    lost = Availability().record(T0, False)
    early = T0 + (RETRY_H - 0.1) * H
    late = T0 + RETRY_H * H
    assert spot_reading(market=None, spot=False, state="RUNNING", history=lost, now_s=early) == (False, False)
    assert spot_reading(market=None, spot=False, state="RUNNING", history=lost, now_s=late) == (True, False)


@pytest.mark.parametrize(
    ("state", "since_launch_h", "reading"),
    [
        ("PENDING", 0.05, (True, False)),  # provisioning within d: not an outage yet, nothing learned
        ("STARTING", 0.09, (True, False)),
        ("STARTING", 0.1, (False, True)),  # a changeover later and still no VM: spot is not there
        ("RECOVERING", 0.01, (False, True)),  # a preempted job looking for capacity again
    ],
)
def test_a_spot_job_provisioning_within_one_changeover_of_its_launch_is_not_an_outage(state, since_launch_h, reading):
    got = spot_reading(market=None, spot=True, state=state, history=Availability(), now_s=T0 + since_launch_h * H,
                       launched_at_s=T0, changeover_h=0.1)  # fmt: skip
    assert got == reading
    mode = current_mode(spot=True, state=state, spot_available=got[0])
    assert mode is (Mode.SPOT if got[0] else Mode.IDLE)  # on spot while it comes up: d is the cost of that
    unknown = spot_reading(market=None, spot=True, state=state, history=Availability(), now_s=T0, changeover_h=0.1)
    assert unknown == (False, True)  # a launch the watcher did not date (the user's resume): as it looks


@pytest.mark.parametrize(
    ("spot", "state", "available", "mode"),
    [
        (True, "RUNNING", True, Mode.SPOT),
        (False, "RUNNING", False, Mode.ON_DEMAND),
        (False, "PENDING", False, Mode.ON_DEMAND),  # on-demand being provisioned is bought
        (True, "STARTING", True, Mode.SPOT),
        (True, "PENDING", False, Mode.IDLE),  # spot waiting for capacity makes no progress
        (True, "RECOVERING", True, Mode.IDLE),
        (True, "STOPPED", True, Mode.IDLE),
        (False, "CANCELLED", True, Mode.IDLE),
    ],
)
def test_current_mode(spot, state, available, mode):
    assert current_mode(spot=spot, state=state, spot_available=available) is mode


# -- decisions ---------------------------------------------------------------------------------


def test_decide_waits_until_the_run_has_a_size():
    facts: dict[str, Any] = dict(
        now_s=T0, mode=Mode.SPOT, spot_available=True, spot_observed=True, history=Availability()
    )
    assert decide(terms(), progress=Progress(step=10, total_steps=None), **facts) is None
    assert decide(terms(compute_h=None), progress=Progress(step=10, total_steps=100), **facts) is None


@pytest.mark.parametrize("now_h", [2.5, 4.5, 5.5, 6.5])
def test_decide_is_the_simulators_policy_on_the_same_facts(now_h):
    """The watcher asks the policy object `skygreen simulate` replays, with the same observation."""
    history = Availability().record(T0, True).record(T0 + 2 * H, False)
    progress = Progress(step=100, total_steps=300)
    decision = decide(
        terms(), now_s=T0 + now_h * H, progress=progress, mode=Mode.IDLE, spot_available=False, spot_observed=True,
        history=history,
    )  # fmt: skip
    assert decision is not None
    obs = Observation(elapsed_h=now_h, progress_h=2.0, mode=Mode.IDLE, spot_available=False, spot_seen_h=2.0,
                      spot_runs_seen=1, spot_up_h=0.0)  # fmt: skip
    expected = UniformProgress().decide(Job(compute_h=6.0, deadline_h=16.0, changeover_h=0.1), obs)
    assert decision.mode == expected.value
    # Uniform Progress: behind the even pace (6/16 per hour) from 5.33 h on, with 2 h done
    assert decision.mode == ("on_demand" if now_h * 6 / 16 > 2.0 else "idle")
    assert decision.slack_h == pytest.approx((16 - now_h) - 4.0)
    assert decision.uniform_progress_h == pytest.approx(now_h * 6 / 16)


def test_decide_names_the_safety_net_when_it_decides():
    progress = Progress(step=290, total_steps=300)  # 5.8 of 6 h done; 0.2 h of work left
    decision = decide(
        terms(), now_s=T0 + 15.6 * H, progress=progress, mode=Mode.IDLE, spot_available=False, spot_observed=True,
        history=Availability().record(T0, False),
    )  # fmt: skip
    assert decision is not None and decision.mode == "on_demand"
    assert "within two changeovers" in decision.reason


def test_measured_compute_stands_in_for_a_missing_estimate():
    progress = Progress(step=50, total_steps=100, measured_compute_h=2.0)
    decision = decide(
        terms(compute_h=None), now_s=T0, progress=progress, mode=Mode.SPOT, spot_available=True, spot_observed=True,
        history=Availability(),
    )  # fmt: skip
    assert decision is not None and decision.compute_h == 2.0 and decision.progress_h == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("measured_h", "timed_s", "used_h"),
    [
        (9.0, 3600.0, 9.0),  # slower than planned, on an hour of training: the run needs 9 h
        (9.0, 60.0, 6.0),  # a minute of steps (start-up, compilation) is no measure yet
        (4.0, 3600.0, 6.0),  # faster than planned: the plan's figure stays (never lowered)
        (None, 0.0, 6.0),
    ],
)
def test_a_run_measured_slower_than_planned_is_paced_for_the_work_it_really_needs(measured_h, timed_s, used_h):
    progress = Progress(step=50, total_steps=100, measured_compute_h=measured_h, timed_train_s=timed_s)
    assert needed_compute_h(terms(), progress) == used_h
    decision = decide(
        terms(), now_s=T0 + 8 * H, progress=progress, mode=Mode.SPOT, spot_available=False, spot_observed=True,
        history=Availability().record(T0, True).record(T0 + 7 * H, False),
    )  # fmt: skip
    assert decision is not None and decision.compute_h == used_h
    assert decision.progress_h == pytest.approx(used_h / 2)
    assert decision.slack_h == pytest.approx(16 - 8 - used_h / 2)  # half the work left, 8 h to go


# -- actions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wanted", "spot", "state", "queues", "action"),
    [
        (Mode.SPOT, True, "RUNNING", False, Action.NONE),
        (Mode.SPOT, False, "RUNNING", False, Action.CANCEL),  # first half of on-demand -> spot
        (Mode.SPOT, False, "CANCELLED", False, Action.LAUNCH_SPOT),  # second half
        (Mode.SPOT, True, "STOPPED", False, Action.LAUNCH_SPOT),  # spot is back after a preemption
        (Mode.ON_DEMAND, True, "RUNNING", False, Action.CANCEL),
        (Mode.ON_DEMAND, True, "RECOVERING", True, Action.CANCEL),
        (Mode.ON_DEMAND, True, "STOPPED", False, Action.LAUNCH_ON_DEMAND),
        (Mode.ON_DEMAND, False, "PENDING", True, Action.NONE),
        (Mode.ON_DEMAND, True, "CANCELLING", True, Action.NONE),  # wait for the switch's cancel
        (Mode.IDLE, True, "RECOVERING", True, Action.NONE),  # a managed spot job waits by itself
        (Mode.IDLE, False, "RUNNING", True, Action.CANCEL),  # on-demand no longer needed
        (Mode.IDLE, False, "CANCELLED", True, Action.LAUNCH_SPOT),  # SkyPilot queues for spot
        (Mode.IDLE, False, "CANCELLED", False, Action.NONE),  # a local run waits stopped
    ],
)
def test_next_action(wanted, spot, state, queues, action):
    assert next_action(wanted=wanted, spot=spot, state=state, queues_for_spot=queues) is action


def test_skygreens_policy_decides_live_with_the_plans_price_ratio():
    history = Availability().record(T0, True).record(T0 + 1 * H, False)
    t = terms(policy="skygreen", spot_usd_per_hour=1.0, on_demand_usd_per_hour=4.0)
    for now_h in (1.5, 6.0, 9.0, 12.0):
        decision = decide(t, now_s=T0 + now_h * H, progress=Progress(step=50, total_steps=300), mode=Mode.IDLE,
                          spot_available=False, spot_observed=True, history=history)  # fmt: skip
        obs = Observation(elapsed_h=now_h, progress_h=1.0, mode=Mode.IDLE, spot_available=False, spot_seen_h=1.0,
                          spot_runs_seen=1, spot_up_h=0.0)  # fmt: skip
        job = Job(compute_h=6.0, deadline_h=16.0, changeover_h=0.1)
        assert decision is not None and decision.mode == ExpectedSpot(price_ratio=4.0).decide(job, obs).value
