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
"""The runtime's checkpoint bucket (`skygreen.task.settings.RuntimeSettings.bucket`)."""


def bucket_for(place: Place, run_bucket: str) -> str:
    """The checkpoint bucket a life at `place` writes: the run's bucket. A bucket per place
    (`checkpoint.buckets`) travels whole, as its set URL: the life finds its nearest member
    where it lands (`skygreen.checkpoint.bucket_set.nearest_url`, from SkyPilot's cluster info or
    the `SKYGREEN_PLACE` the pin sets), restores the newest commit of the set and copies it there
    once, so the moves after it save to a bucket in their own place."""
    del place
    return run_bucket


def place_env(place: Place) -> str:
    """`SKYGREEN_PLACE`'s value for `place`."""
    return "/".join(p for p in (place.cloud, place.region, place.zone) if p)


def pinned_task(
    task: Mapping[str, Any], place: Place, *, bucket: str, rendered: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`task` relaunched at `place`, checkpointing to `bucket`; its candidates are taken from
    `rendered` (the task as `up` rendered it, before any pin) where given, so a run pinned to one
    region finds every candidate of the plan again for the next.

    The plan's candidates (`ordered` or `any_of`) in another cloud or region are dropped and the
    rest pinned to the place (SkyPilot's `infra: cloud/region[/zone]`); where none is there, every
    candidate is pinned there (its GPUs are what the task needs); a task with no candidates (a
    local one) is pinned on its resources.
    """
    out = copy.deepcopy(dict(task))
    if rendered is not None and isinstance(rendered.get("resources"), Mapping):
        out["resources"] = {**copy.deepcopy(dict(rendered["resources"])), **_capacity(out.get("resources"))}
    resources = out.get("resources")
    infra = place_env(place)
    if isinstance(resources, dict):
        kept = False
        for key in ("ordered", "any_of"):
            entries = resources.get(key)
            if not entries:
                continue
            here = _pinned_entries(entries, place, infra) or _pinned_entries(entries, None, infra)
            if here:
                resources[key] = here
                kept = True
            else:
                resources.pop(key)
        for name in ("infra", "cloud", "region", "zone"):
            resources.pop(name, None)
        if not kept:
            resources["infra"] = infra
    envs = out.setdefault("envs", {})
    envs[PLACE_ENV] = infra
    envs[BUCKET_ENV] = bucket
    return out


def _capacity(resources: Any) -> dict[str, Any]:
    """The capacity the current task asks for (`use_spot`), which a relaunch keeps."""
    return {"use_spot": resources["use_spot"]} if isinstance(resources, Mapping) and "use_spot" in resources else {}


def _where(entry: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(cloud, region) a candidate names, from `infra` (`cloud/region[/zone]`) or the older keys."""
    if entry.get("infra"):
        parts = str(entry["infra"]).split("/")
        return parts[0].lower(), parts[1] if len(parts) > 1 and parts[1] != "*" else None
    cloud = entry.get("cloud")
    return (str(cloud).lower() if cloud else None), entry.get("region")


def _pinned_entries(entries: Any, place: Place | None, infra: str) -> list[Any]:
    """The candidates that can run at `place` (None: every one), each pinned to `infra`, each once."""
    out: list[Any] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        cloud, region = _where(entry)
        if place is not None and ((cloud and cloud != place.cloud) or (region and region != place.region)):
            continue
        pinned = {k: v for k, v in entry.items() if k not in ("cloud", "region", "zone")} | {"infra": infra}
        if pinned not in out:
            out.append(pinned)
    return out
