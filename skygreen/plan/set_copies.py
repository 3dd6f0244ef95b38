"""The copies a bucket set makes when a recovery moves a run, added to each offer's bill.

With `checkpoint.buckets:` each offer is first priced against its nearest bucket
(`skygreen.plan.data_cost`). Where a recovery lands depends on the launch's candidates (the
plan's top offers, which `skygreen up` renders as SkyPilot's `ordered` list), which are known
only once the offers are ranked; so the copies are priced on the ranked list and the offers
ranked again (`skygreen.bill.bucket_places.move_copies` has the rule). A copy is transfer: it
raises `cost_usd.transfer`, the total and `est_cost_usd`, and `bytes_moved_gb`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skygreen.bill.bucket_places import SetPlaces, move_copies
from skygreen.bill.rates import Place, load_rates
from skygreen.bill.traffic import save_gb
from skygreen.plan.candidate import Candidate
from skygreen.plan.cost import RunModel


def launch_places(ranked: Sequence[Candidate]) -> list[Place]:
    """The places of the launch entries (one per place, GPU and capacity, as the render lists
    them), best first; a place listed twice counts twice."""
    seen: list[tuple[str, str, str, int, bool]] = []
    out: list[Place] = []
    for c in ranked:
        entry = (c.cloud, c.region, c.accelerator, c.accelerator_count, bool(c.spot))
        if entry not in seen:
            seen.append(entry)
            out.append(Place(cloud=c.cloud, region=c.region))
    return out


def with_copies(
    ranked: Sequence[Candidate], places: SetPlaces, model: RunModel, *, limit: int, strategy: str
) -> list[Candidate]:
    """Each candidate with the copies its expected moves make added to its bill (unranked); none
    under `FAILOVER`, which relaunches in the preempted region first."""
    if strategy.upper() != "EAGER_NEXT_REGION":
        return list(ranked)
    launches = launch_places(ranked)
    one_gb = save_gb(model.checkpoint_gb or 0.0, trainable_fraction=model.trainable_fraction)
    rates = load_rates()
    out = []
    for c in ranked:
        gb, usd = move_copies(
            places,
            vm=Place(cloud=c.cloud, region=c.region),
            launches=launches,
            save_gb=one_gb,
            moves=c.expected_preemptions,
            limit=limit,
            rates=rates,
        )
        if usd <= 0 and gb <= 0:
            out.append(c)
            continue
        bill = dict(c.cost_usd)
        bill.update(transfer=bill["transfer"] + usd, total=bill["total"] + usd)
        out.append(
            dataclasses.replace(
                c, cost_usd=bill, est_cost_usd=c.est_cost_usd + usd, bytes_moved_gb=c.bytes_moved_gb + gb
            )
        )
    return out
