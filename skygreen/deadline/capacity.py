"""Spot or on-demand: the same rendered task, launched on the other kind of capacity.

A deadline watcher moves a run between spot and on-demand by relaunching its rendered task
with the same run id (it resumes from its checkpoint). Only three things change: SkyPilot's
`use_spot` (on the resources and on every candidate), the offers the runtime prices its ledger
with (the same offers at the other price), and `SKYGREEN_CAPACITY`, which tells a local run's
ledger which kind it stands for. Pure: a task dict in, a new task dict out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from skygreen.ledger.place import CAPACITY_ENV, OFFERS_ENV


def with_capacity(task: Mapping[str, Any], *, spot: bool, offers: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """`task` relaunched on spot (`spot=True`) or on-demand.

    `offers`: the plan's offers as recorded with the run (`Candidate.to_json`); they give each
    offer's price of the new kind. Without them (a local run) the offers are left as they are.
    """
    out = copy.deepcopy(dict(task))
    resources = out.get("resources")
    if isinstance(resources, dict):
        resources["use_spot"] = spot
        for key in ("ordered", "any_of"):
            if resources.get(key):
                resources[key] = _flipped(resources[key], spot=spot)
    envs = out.setdefault("envs", {})
    envs[CAPACITY_ENV] = "spot" if spot else "on-demand"
    if offers:
        envs[OFFERS_ENV] = _offers_env(offers, spot=spot)
    return out


def _flipped(entries: Sequence[Any], *, spot: bool) -> list[Any]:
    """Candidates on the new kind, each once: a plan may hold the same place as spot and as
    on-demand, and the two become one entry."""
    out: list[Any] = []
    for entry in entries:
        if isinstance(entry, dict):
            entry = {**entry, "use_spot": spot}
        if entry not in out:
            out.append(entry)
    return out


def _offers_env(offers: Sequence[Mapping[str, Any]], *, spot: bool) -> str:
    """`SKYGREEN_OFFERS` for the new kind: each offer once, at its price of that kind."""
    rows, seen = [], set()
    for offer in offers:
        price = offer.get("spot_price_usd_per_hour" if spot else "on_demand_price_usd_per_hour")
        if price is None:
            continue
        key = (offer.get("cloud"), offer.get("region"), offer.get("instance_type"))
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            [
                offer.get("cloud"),
                offer.get("region"),
                offer.get("instance_type"),
                offer.get("accelerator"),
                offer.get("accelerator_count"),
                spot,
                round(float(price), 6),
            ]
        )
    return json.dumps(rows, separators=(",", ":"))
