"""Where a segment runs, read on the VM from what SkyPilot and `skygreen up` tell the process.

- `SKYPILOT_CLUSTER_INFO` (JSON `{cluster_name, cloud, region, zone}`): where the managed job
  landed this time (it changes with every recovery).
- `SKYPILOT_NUM_NODES`, `SKYPILOT_NUM_GPUS_PER_NODE`: the node layout of this cluster.
- `SKYGREEN_OFFERS` (rendered by `skygreen up`): the plan's offers with their catalog prices,
  `[[cloud, region, instance_type, gpu, gpus_per_node, spot, price_usd_per_hour], ...]`. The
  offer that matches the cloud, region and GPU gives the instance type, spot and the price;
  SkyPilot tells the task neither. No SkyPilot import and no network on the VM.
- No cluster info at all: a `local` place (this machine, free); `SKYGREEN_CAPACITY` says
  whether it stands for spot or on-demand when a deadline watcher launched it, and
  `SKYGREEN_PLACE` the region and zone a nomad watcher pinned it to.

Pure: the environment is passed in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from skygreen.gpus import GPUS
from skygreen.ledger.records import Place

CLUSTER_INFO_ENV = "SKYPILOT_CLUSTER_INFO"
OFFERS_ENV = "SKYGREEN_OFFERS"
CAPACITY_ENV = "SKYGREEN_CAPACITY"
"""`spot` or `on-demand`: rendered when a deadline watcher chooses the capacity, so a local
run's ledger says which kind it stood for (on the clouds the matching offer says it)."""
PLACE_ENV = "SKYGREEN_PLACE"
"""`cloud/region[/zone]`: rendered when a nomad watcher pins a life to a place
(`skygreen.places.pin`), so a local run's ledger says which region each life stood for."""
LOCAL = "local"


def offers_env(candidates: Sequence[Any]) -> str:
    """The compact offers list for `SKYGREEN_OFFERS`, from plan candidates (best first)."""
    rows = [
        [
            c.cloud,
            c.region,
            c.instance_type,
            c.accelerator,
            c.accelerator_count,
            bool(c.spot),
            round(c.price_usd_per_hour, 6),
        ]
        for c in candidates
    ]
    return json.dumps(rows, separators=(",", ":"))


def parse_offers(raw: str | None) -> list[dict[str, Any]]:
    """`SKYGREEN_OFFERS` back into dicts; a malformed value is ignored (prices become unknown)."""
    try:
        rows = json.loads(raw or "[]")
    except ValueError:
        return []
    names = ("cloud", "region", "instance_type", "gpu", "gpu_count", "spot", "price_usd_per_hour")
    return [dict(zip(names, row, strict=True)) for row in rows if isinstance(row, list) and len(row) == len(names)]


def gpu_catalog_name(device_name: str | None, memory_gb: float | None = None) -> str | None:
    """The catalog's name for a CUDA device name ("NVIDIA A100-SXM4-80GB" -> "A100-80GB")."""
    if not device_name:
        return None
    upper = device_name.upper()
    for name in sorted(GPUS, key=len, reverse=True):  # "A100-80GB" and "V100-32GB" before "A100"
        base, _, size = name.partition("-")
        if re.search(rf"(?<![A-Z0-9]){re.escape(base)}(?![0-9])", upper):
            if size and size not in upper and not (memory_gb and memory_gb > GPUS[base].memory_gb * 1.2):
                continue
            return name
    return None


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return max(int(environ.get(name, "") or default), 0)
    except ValueError:
        return default


SIMULATED_GPU_ENV = "SKYGREEN_SIMULATED_GPU"
"""`skygreen.power.simulated.SIMULATED_GPU_ENV`: `T4`, or `V100:2` for two boards."""


def _simulated_board(environ: Mapping[str, str]) -> str | None:
    """`T4x1` for `SKYGREEN_SIMULATED_GPU=T4` (`V100:2` -> `V100x2`); None when unset."""
    raw = (environ.get(SIMULATED_GPU_ENV) or "").strip()
    if not raw:
        return None
    name, _, count = raw.partition(":")
    return f"{name.strip()}x{int(count) if count.strip().isdecimal() else 1}"


def current_place(environ: Mapping[str, str], *, gpu: str | None, gpu_count: int | None = None) -> Place:
    """This VM's place: SkyPilot's cluster info joined with the rendered offer that matches."""
    try:
        info = json.loads(environ.get(CLUSTER_INFO_ENV, "") or "{}")
    except ValueError:
        info = {}
    if not isinstance(info, dict) or not info.get("cloud"):
        capacity = environ.get(CAPACITY_ENV)
        stands_for = (environ.get(PLACE_ENV) or "").split("/")  # a nomad's pin: cloud/region[/zone]
        return Place(
            cloud=LOCAL,
            region=stands_for[1] if len(stands_for) > 1 and stands_for[1] else None,
            zone=stands_for[2] if len(stands_for) > 2 and stands_for[2] else None,
            spot={"spot": True, "on-demand": False}.get(capacity or ""),
            gpu=gpu,
            gpu_count=gpu_count or (1 if gpu else 0),
            nodes=1,
            price_usd_per_hour=0.0,
            price_source="local",
            simulated_gpu=None if gpu else _simulated_board(environ),
        )
    cloud = str(info["cloud"]).lower()
    region = info.get("region") or None
    zone = info.get("zone") or None
    nodes = max(_int(environ, "SKYPILOT_NUM_NODES", 1), 1)
    count = _int(environ, "SKYPILOT_NUM_GPUS_PER_NODE", gpu_count or (1 if gpu else 0))
    offer = match_offer(parse_offers(environ.get(OFFERS_ENV)), cloud=cloud, region=region, gpu=gpu, gpu_count=count)
    return Place(
        cloud=cloud,
        region=region,
        zone=zone,
        instance_type=offer["instance_type"] if offer else None,
        spot=bool(offer["spot"]) if offer else None,
        gpu=gpu or (offer["gpu"] if offer else None),
        gpu_count=count,
        nodes=nodes,
        price_usd_per_hour=float(offer["price_usd_per_hour"]) if offer else None,
        price_source="plan" if offer else None,
    )


def match_offer(
    offers: Sequence[Mapping[str, Any]], *, cloud: str, region: str | None, gpu: str | None, gpu_count: int
) -> Mapping[str, Any] | None:
    """The first (best-ranked) offer in this cloud and region with this GPU and count.

    SkyPilot tries the plan's offers in order, so among equal matches the earlier one is the
    one it launched; when the GPU is unknown (no CUDA device name), cloud and region decide.
    """
    for offer in offers:
        if offer["cloud"] != cloud or (region and offer["region"] != region):
            continue
        if gpu and offer["gpu"] != gpu:
            continue
        if gpu_count and int(offer["gpu_count"]) != gpu_count:
            continue
        return offer
    return None
