"""A run relaunched at one place: its rendered task pinned to a cloud, region and zone, with the
checkpoint bucket that place reads.

A nomad's move is a cancel and a relaunch of the same run id (it resumes from its checkpoint,
and the new life takes over the run's writer lease as any resume does). What changes is where
SkyPilot may put it: the resources keep only the plan's candidates in that cloud and region,
pinned to it, and `SKYGREEN_PLACE` tells the runtime (and a local run's ledger) which place the
life stands for. Pure: a task dict in, a new task dict out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from skygreen.ledger.place import PLACE_ENV
from skygreen.places.place import Place

BUCKET_ENV = "SKYGREEN_BUCKET"
"""The runtime's checkpoint bucket (`skygreen.settings.RuntimeSettings.bucket`)."""


def bucket_for(place: Place, run_bucket: str) -> str:
    """The checkpoint bucket a life at `place` writes: the run's one bucket today. The one
    function a bucket per place plugs into (a bucket in the place's region saves its egress)."""
    del place
    return run_bucket


def place_env(place: Place) -> str:
    """`SKYGREEN_PLACE`'s value for `place`."""
    return "/".join(p for p in (place.cloud, place.region, place.zone) if p)


def pinned_task(task: Mapping[str, Any], place: Place, *, bucket: str) -> dict[str, Any]:
    """`task` relaunched at `place`, checkpointing to `bucket`.

    The plan's candidates (`ordered` or `any_of`) in another cloud or region are dropped and the
    rest pinned to the place's region (and zone); a task with no candidate there is pinned on
    its resources alone.
    """
    out = copy.deepcopy(dict(task))
    resources = out.get("resources")
    where = {"cloud": place.cloud, "region": place.region, **({"zone": place.zone} if place.zone else {})}
    if isinstance(resources, dict):
        kept = False
        for key in ("ordered", "any_of"):
            entries = resources.get(key)
            if not entries:
                continue
            here = _pinned_entries(entries, place, where)
            if here:
                resources[key] = here
                kept = True
            else:
                resources.pop(key)
        for name in ("cloud", "region", "zone"):
            resources.pop(name, None)
        if not kept:
            resources.update(where)
    envs = out.setdefault("envs", {})
    envs[PLACE_ENV] = place_env(place)
    envs[BUCKET_ENV] = bucket
    return out


def _pinned_entries(entries: Any, place: Place, where: Mapping[str, str]) -> list[Any]:
    """The candidates that can run at `place`, each pinned there, each once."""
    out: list[Any] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        cloud, region = entry.get("cloud"), entry.get("region")
        if (cloud and str(cloud).lower() != place.cloud) or (region and region != place.region):
            continue
        pinned = {**entry, **where}
        if pinned not in out:
            out.append(pinned)
    return out
