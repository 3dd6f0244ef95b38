"""Read the multi-region spot traces into a `Market`.

Two sets are time-aligned across zones (both from the SkyNomad artifact, under
`spot-traces/skynomad-artifact/data/`):
- GCP H100, 13 zones, 600 s ticks: `converted_multi_region_aligned_h100_16_merged.tar.gz`. Its
  `full.json` per zone uses 1 = preempted (inverted here), counts a zone as up when at least one
  of 16 a3-highgpu-1g launched, and prices the a3-highgpu-8g (8 x H100) in `metadata.price_info`.
  The per-zone shards `0..15.json` start at different times per zone and are not read.
- AWS V100, 9 zones, 195 s ticks: `real/availability/2023-02-15/processed/<zone>_v100_1.csv`
  (1 = available) with per-tick spot prices in `v100_spot_prices.json`, row for row; on-demand
  p3.2xlarge is $3.06/h.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
from pathlib import Path

import numpy as np

from skygreen.places.place import Market, Place

V100_ON_DEMAND_USD_PER_HOUR = 3.06
"""p3.2xlarge on-demand in us-east-1, us-east-2 and us-west-2 (AWS list price)."""
V100_TICK_S = 195.0
H100_SUFFIX = "_h100_16"
V100_SUFFIX = "_v100_1"


def load_market(path: Path) -> Market:
    """The market a path holds: the H100 archive (.tar.gz) or its unpacked folder, or the V100
    `processed` folder (its prices are found in `v100_spot_prices.json` above it). Raises
    ValueError saying what was expected."""
    path = Path(path)
    if path.is_file() and path.name.endswith(".tar.gz"):
        return load_h100(path)
    if path.is_dir() and any(path.glob(f"*{V100_SUFFIX}.csv")):
        return load_v100(path)
    if path.is_dir() and any(path.glob(f"*{H100_SUFFIX}/full.json")):
        return load_h100(path)
    raise ValueError(
        f"{path} is not a multi-region trace: expected the H100 archive "
        "converted_multi_region_aligned_h100_16_merged.tar.gz or the V100 folder "
        "real/availability/2023-02-15/processed"
    )


def is_market(path: Path) -> bool:
    """Whether `path` looks like a multi-region trace `load_market` reads."""
    path = Path(path)
    if path.is_file():
        return path.name.endswith(".tar.gz")
    return path.is_dir() and (any(path.glob(f"*{V100_SUFFIX}.csv")) or any(path.glob(f"*{H100_SUFFIX}/full.json")))


def load_h100(path: Path) -> Market:
    """The GCP H100 zones (archive or unpacked folder), sorted by zone name."""
    docs = _h100_docs(Path(path))
    if not docs:
        raise ValueError(f"{path}: no <zone>{H100_SUFFIX}/full.json inside")
    zones = sorted(docs)
    places, avail, spot, od = [], [], [], []
    length = min(len(docs[z]["data"]) for z in zones)
    for zone in zones:
        doc = docs[zone]
        info = doc["metadata"]["price_info"]
        region = zone.rsplit("-", 1)[0]
        places.append(Place(cloud="gcp", region=region, zone=zone, offer="a3-highgpu-8g"))
        avail.append([x == 0 for x in doc["data"][:length]])  # 1 = preempted
        prices = doc.get("prices") or [info["price"]] * length
        spot.append([float(p) for p in prices[:length]])
        od.append(float(info["on_demand_price"]))
    first = docs[zones[0]]["metadata"]
    return Market(
        places=tuple(places),
        tick_s=float(first["gap_seconds"]),
        available=np.array(avail, dtype=bool),
        spot_usd_per_hour=np.array(spot, dtype=float),
        on_demand_usd_per_hour=np.array(od, dtype=float),
        start_utc=first.get("start_time"),
    )


def _h100_docs(path: Path) -> dict[str, dict]:
    docs: dict[str, dict] = {}
    if path.is_dir():
        for full in sorted(path.glob(f"*{H100_SUFFIX}/full.json")):
            docs[full.parent.name[: -len(H100_SUFFIX)]] = json.loads(full.read_text(encoding="utf-8"))
        return docs
    with tarfile.open(path, "r:gz") as archive:
        for member in archive.getmembers():
            parts = member.name.split("/")
            if len(parts) >= 2 and parts[-1] == "full.json" and parts[-2].endswith(H100_SUFFIX):
                handle = archive.extractfile(member)
                if handle is not None:
                    docs[parts[-2][: -len(H100_SUFFIX)]] = json.load(io.TextIOWrapper(handle, encoding="utf-8"))
    return docs


def load_v100(folder: Path, prices_json: Path | None = None) -> Market:
    """The AWS V100 zones of `folder`, with per-tick spot prices from `prices_json` (default: the
    `v100_spot_prices.json` in a folder above)."""
    folder = Path(folder)
    prices_json = prices_json or _find_above(folder, "v100_spot_prices.json")
    if prices_json is None:
        raise ValueError(f"no v100_spot_prices.json above {folder}")
    prices = json.loads(Path(prices_json).read_text(encoding="utf-8"))
    files = sorted(folder.glob(f"*{V100_SUFFIX}.csv"))
    places, avail, spot = [], [], []
    start = None
    for file in files:
        key = file.name[: -len(".csv")]
        zone = key[: -len(V100_SUFFIX)]
        with file.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
        start = start or rows[0]["date"]
        places.append(Place(cloud="aws", region=zone[:-1], zone=zone, offer="p3.2xlarge"))
        avail.append([r["availability"].strip() == "1" for r in rows])
        spot.append([float(p) for p in prices[key]])
    length = min(*(len(a) for a in avail), *(len(s) for s in spot))
    return Market(
        places=tuple(places),
        tick_s=V100_TICK_S,
        available=np.array([a[:length] for a in avail], dtype=bool),
        spot_usd_per_hour=np.array([s[:length] for s in spot], dtype=float),
        on_demand_usd_per_hour=np.full(len(places), V100_ON_DEMAND_USD_PER_HOUR),
        start_utc=start,
    )


def _find_above(folder: Path, name: str) -> Path | None:
    for parent in (folder, *folder.resolve().parents):
        if (parent / name).is_file():
            return parent / name
    return None
