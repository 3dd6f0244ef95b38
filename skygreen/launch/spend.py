"""What a run has spent so far, for `skygreen status`.

From the run's ledger when it has one, priced by `skygreen.costs.costing.load_run_cost`, the
same function `skygreen cost` and `compare` use, so the three agree to the cent. A run started
by a runtime without a ledger falls back to the launcher's view: each launch's run time times
the catalog price of the offer it landed on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from skygreen.checkpoint.store import OpenStore
from skygreen.errors import SkygreenError
from skygreen.launch.launcher import JobStatus
from skygreen.launch.registry import RunRecord


def run_spend(
    record: RunRecord,
    job: JobStatus | None,
    *,
    job_status_of: Callable[[str], JobStatus | None],
    open_store: OpenStore,
) -> tuple[float | None, bool]:
    """Spend of every launch of the run so far, and whether any part of it is a guess.

    From the run's ledger when it has one (`skygreen.costs.costing.load_run_cost`). Otherwise (a run
    from a runtime without a ledger):
    SkyPilot reports no cost per managed job, so each launch costs its job's run time times
    the catalog price of the offer it landed on; a job that does not say where it runs is
    priced at the plan's best offer (a guess). `job` is the current launch's status, already
    fetched; earlier launches (before a `resume`) are asked for theirs. A launch whose status
    is gone from SkyPilot's queue is left out."""
    from skygreen.costs.costing import load_run_cost

    try:  # the run ledger, priced by the same function as `skygreen cost` and `compare`
        cost = load_run_cost(record, open_store=open_store)
    except SkygreenError:  # an unreadable ledger or catalog: fall back to the launcher's view
        cost = None
    if cost is not None:
        return cost.total_usd, cost.unpriced_segments > 0
    if record.mode == "local":
        return 0.0, False
    offers = list((record.plan_summary or {}).get("offers", ()))
    if not offers:
        return None, False
    jobs = [job_status_of(launch.job_id) for launch in record.launches[:-1]] + [job]
    priced = [_launch_spend(offers, j) for j in jobs if j is not None and j.duration_s is not None]
    if not priced:
        return None, False
    return sum(usd for usd, _ in priced), any(guessed for _, guessed in priced)


def _launch_spend(offers: list[Mapping[str, Any]], job: JobStatus) -> tuple[float, bool]:
    landed = [
        o
        for o in offers
        if o["cloud"] == job.cloud
        and (job.region is None or o["region"] == job.region)
        and (not job.accelerators or o["accelerator"] in job.accelerators)
    ]
    offer = landed[0] if landed else offers[0]
    price = float(offer["price_usd_per_hour"]) * int(offer.get("num_nodes") or 1)
    return (job.duration_s or 0.0) / 3600.0 * price, not landed
