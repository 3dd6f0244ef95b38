"""The terms a run launched with a deadline is held to, fixed at `skygreen up`.

The plan already knows what a deadline costs (`skygreen.deadline.cost`): with `--deadline` it
keeps only the offers that can finish in time. The best of them gives the watcher its numbers:
the compute hours (unless the user says), the changeover d (restart plus half a checkpoint
interval, the plan's own formula) and the spot and on-demand prices that tune skygreen's
policy. A local run has no plan: its compute hours are the user's or, left out, measured from
the run's first timed steps; d is the same formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skygreen.deadline.cost import changeover_h
from skygreen.deadline.live import DeadlineTerms
from skygreen.deadline.policy import POLICIES
from skygreen.errors import InputError
from skygreen.plan.cost import DEFAULT_RESTART_S
from skygreen.task.spec import TaskSpec

if TYPE_CHECKING:
    from skygreen.plan.rank import Plan


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadlineAsk:
    """What `skygreen up` was asked: `--deadline` (None: the task's), `--compute`, `--policy`, and when."""

    now_s: float
    """The watcher's clock at launch (`skygreen.deadline.clock`)."""
    deadline_h: float | None = None
    compute_h: float | None = None
    policy: str | None = None
    """None: not asked; `deadline_ask` makes it skygreen's own."""


def deadline_ask(spec: TaskSpec, ask: DeadlineAsk | None) -> DeadlineAsk | None:
    """The ask with the deadline resolved (flag, else the task's), or None without one."""
    if ask is None:
        return None
    deadline_h = ask.deadline_h if ask.deadline_h is not None else spec.green.deadline
    if deadline_h is None:
        for flag, given in (("--compute", ask.compute_h), ("--policy", ask.policy)):
            if given is not None:
                raise InputError(f"{flag}: only used with a deadline\n  fix: add --deadline 36h, or leave {flag} out")
        return None
    policy = ask.policy or "skygreen"
    if policy not in POLICIES:
        raise InputError(f"--policy: unknown policy {policy!r}\n  fix: one of {', '.join(POLICIES)}")
    if not spec.green.spot:
        raise InputError(
            "skygreen.spot: false: a deadline moves a run between spot and on-demand, and this task asks for on-demand only\n"
            "  fix: set skygreen.spot: true, or leave the deadline out"
        )
    return DeadlineAsk(now_s=ask.now_s, deadline_h=deadline_h, compute_h=ask.compute_h, policy=policy)


def deadline_terms(spec: TaskSpec, plan: Plan | None, ask: DeadlineAsk) -> DeadlineTerms:
    """The terms from the plan's best offer (cloud) or the task alone (local)."""
    assert ask.deadline_h is not None, "deadline_ask resolves the deadline first"
    restart_min = spec.green.preemption.restart_minutes
    restart_s = DEFAULT_RESTART_S if restart_min is None else restart_min * 60.0
    compute_h, spot_price, on_demand_price, nodes = ask.compute_h, None, None, spec.num_nodes
    if plan is not None:
        best = plan.candidates[0]
        d = changeover_h(restart_s, best.checkpoint_interval_s)
        compute_h = compute_h if compute_h is not None else best.compute_hours
        spot_price, on_demand_price, nodes = (
            best.spot_price_usd_per_hour,
            best.on_demand_price_usd_per_hour,
            best.num_nodes,
        )
    else:
        d = changeover_h(restart_s, spec.green.checkpoint.every_s)
    if compute_h is not None and compute_h + 2 * d > ask.deadline_h:
        need = math.ceil((compute_h + 2 * d) * 10) / 10
        raise InputError(
            f"--deadline: {ask.deadline_h:g} h is too short for {compute_h:g} h of compute and two changeovers of {d:.2f} h\n"
            f"  fix: a deadline of at least {need:g} h, or less work"
        )
    return DeadlineTerms(
        started_at_s=ask.now_s,
        deadline_at_s=ask.now_s + ask.deadline_h * 3600.0,
        changeover_h=d,
        policy=ask.policy or "skygreen",
        compute_h=compute_h,
        spot_usd_per_hour=spot_price,
        on_demand_usd_per_hour=on_demand_price,
        nodes=nodes,
    )
