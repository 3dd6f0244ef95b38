"""What moving and keeping a gigabyte costs: the sourced rate table and the places it prices between.

The rates live in `data/*.csv` beside this module, one figure a row with the page it comes from
(`source`) and the day it was read (`as_of`), so a changed price is a one-line change with its
evidence. They are list prices for US source regions; providers change them, so check a row's
page before trusting it.

- `egress_internet.csv`: leaving a cloud, per GB, by the month's volume. Below 10 TB (10,240 GB,
  SkyPilot's unit) the rows equal SkyPilot 0.14.1's own `get_egress_cost` (AWS and Azure charge
  the first GB free, then tier by tier; GCP charges the bracket's rate on the whole volume).
  Above 10 TB the rows are the providers' tiers: SkyPilot's AWS and Azure arithmetic charges the
  volume above a bracket at its rate and then the remainder again at the first tier's, which
  counts gigabytes twice between 10 and 50 TB and drops most of them above. Tiers are monthly and
  account-wide: pricing one run's volume alone is an estimate.
- `transfer_cloud.csv`: inside one cloud: a VM and a bucket in the same region (free), between
  zones, between regions on the same continent and between continents.
- `storage.csv`: standard object storage per GB-month; `requests.csv`: writes and reads per 1,000.
- `regions.csv`: each known region's continent; other names are read by their prefix.

A transfer is paid once, by the sending side: a save from an Azure VM to an S3 bucket pays
Azure's internet egress, a restore from that bucket to the VM pays AWS's. Ingress is free.
"""

from __future__ import annotations

import csv
import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
DEFAULT_REGION: Mapping[str, str] = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}
"""Where a bucket is assumed to be when neither the task nor the bucket says: each cloud's
default for a new bucket (S3's us-east-1; GCS and Azure ask, these are the usual first picks)."""
PATHS: tuple[str, ...] = ("same_region", "inter_zone", "same_continent", "other_continent")
BASES: tuple[str, ...] = ("marginal", "whole_volume")
_PREFIX_CONTINENT: tuple[tuple[str, str], ...] = (
    ("us", "north_america"), ("ca-", "north_america"), ("northamerica", "north_america"),
    ("canada", "north_america"), ("eu", "europe"), ("uk", "europe"), ("france", "europe"),
    ("germany", "europe"), ("sweden", "europe"), ("switzerland", "europe"), ("norway", "europe"),
    ("australia", "oceania"), ("ap-", "asia"), ("asia", "asia"), ("japan", "asia"), ("korea", "asia"),
    ("india", "asia"), ("me-", "middle_east"), ("uae", "middle_east"), ("il-", "middle_east"),
    ("af-", "africa"), ("southafrica", "africa"), ("sa-", "south_america"), ("southamerica", "south_america"),
    ("brazil", "south_america"),
)  # fmt: skip
"""Region name prefixes, for names the table does not list (checked in order, first wins)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Place:
    """Where a VM or a bucket is: a cloud and one of its regions."""

    cloud: str
    region: str

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {self.cloud!r}; one of {', '.join(CLOUDS)}")
        if not self.region:
            raise ValueError("a place needs a region")

    @property
    def label(self) -> str:
        """`aws us-east-1`."""
        return f"{self.cloud} {self.region}"


@dataclass(frozen=True, kw_only=True, slots=True)
class EgressTier:
    """One row of internet egress: the rate for the month's volume from `from_gb` to `to_gb`."""

    from_gb: float
    to_gb: float
    """`math.inf` for the last tier."""
    usd_per_gb: float
    basis: str
    """"marginal": the rate applies to the gigabytes inside the tier; "whole_volume": a volume in
    this bracket pays this rate on all of it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    """The whole table, as loaded from `data/` (`load_rates`)."""

    egress: Mapping[str, tuple[EgressTier, ...]]
    within: Mapping[tuple[str, str], float]
    """(cloud, path) -> USD per GB, path one of `PATHS`."""
    storage_usd_per_gb_month: Mapping[str, float]
    write_usd_per_1000: Mapping[str, float]
    read_usd_per_1000: Mapping[str, float]
    continents: Mapping[tuple[str, str], str]


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The CSV's rows; a `ValueError` naming the file and row for a missing source or date."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for i, row in enumerate(rows, start=2):
        for key in required:
            if not (row.get(key) or "").strip():
                raise ValueError(f"{path.name} line {i}: {key} is empty")
        if "source" in required and not row["source"].startswith("https://"):
            raise ValueError(f"{path.name} line {i}: source must be an https:// page, got {row['source']!r}")
    return rows


@functools.lru_cache(maxsize=4)
def load_rates(folder: Path = DATA) -> Rates:
    """The rate table in `folder` (the shipped one by default), read once per process.

    Raises:
        ValueError: a row without its source or date, an unknown cloud, path or basis, or
            egress tiers that leave a gap.
    """
    sourced = ("cloud", "source", "as_of")
    egress: dict[str, list[EgressTier]] = {}
    for row in _rows(folder / "egress_internet.csv", (*sourced, "from_gb", "usd_per_gb", "basis")):
        if row["basis"] not in BASES:
            raise ValueError(f"egress_internet.csv: basis must be one of {BASES}, got {row['basis']!r}")
        to_gb = float(row["to_gb"]) if row["to_gb"] else math.inf
        tier = EgressTier(
            from_gb=float(row["from_gb"]), to_gb=to_gb, usd_per_gb=float(row["usd_per_gb"]), basis=row["basis"]
        )
        egress.setdefault(row["cloud"], []).append(tier)
    for cloud, tiers in egress.items():
        for before, after in itertools.pairwise(tiers):
            if before.to_gb != after.from_gb:
                raise ValueError(f"egress_internet.csv: {cloud}'s tiers leave a gap at {before.to_gb} GB")
    within = {}
    for row in _rows(folder / "transfer_cloud.csv", (*sourced, "path", "usd_per_gb")):
        if row["path"] not in PATHS:
            raise ValueError(f"transfer_cloud.csv: path must be one of {PATHS}, got {row['path']!r}")
        within[(row["cloud"], row["path"])] = float(row["usd_per_gb"])
    storage = {r["cloud"]: float(r["usd_per_gb_month"]) for r in _rows(folder / "storage.csv", sourced)}
    requests = _rows(folder / "requests.csv", (*sourced, "kind", "usd_per_1000"))
    continents = {(r["cloud"], r["region"]): r["continent"] for r in _rows(folder / "regions.csv", ("cloud",))}
    rates = Rates(
        egress={cloud: tuple(tiers) for cloud, tiers in egress.items()},
        within=within,
        storage_usd_per_gb_month=storage,
        write_usd_per_1000={r["cloud"]: float(r["usd_per_1000"]) for r in requests if r["kind"] == "write"},
        read_usd_per_1000={r["cloud"]: float(r["usd_per_1000"]) for r in requests if r["kind"] == "read"},
        continents=continents,
    )
    for cloud in CLOUDS:
        missing = [
            name
            for name, table in (
                ("egress_internet", rates.egress),
                ("storage", rates.storage_usd_per_gb_month),
                ("requests write", rates.write_usd_per_1000),
                ("requests read", rates.read_usd_per_1000),
            )
            if cloud not in table
        ] + [f"transfer_cloud {p}" for p in PATHS if (cloud, p) not in within]
        if missing:
            raise ValueError(f"the rate table has no {', '.join(missing)} row for {cloud}")
    return rates


def continent(place: Place, rates: Rates | None = None) -> str | None:
    """The continent of a region: the table's, else by the name's prefix; None when neither knows."""
    rates = rates or load_rates()
    known = rates.continents.get((place.cloud, place.region))
    if known is not None:
        return known
    return next((c for prefix, c in _PREFIX_CONTINENT if place.region.startswith(prefix)), None)


def path_between(src: Place, dst: Place, rates: Rates | None = None) -> str:
    """How bytes go from `src` to `dst`: "same_region", "same_continent", "other_continent" (both
    inside one cloud) or "internet" (between clouds). A region whose continent is unknown counts
    as another continent (the dearer guess)."""
    if src.cloud != dst.cloud:
        return "internet"
    if src.region == dst.region:
        return "same_region"
    a, b = continent(src, rates), continent(dst, rates)
    return "same_continent" if a is not None and a == b else "other_continent"


def internet_egress_usd(cloud: str, gb: float, rates: Rates | None = None) -> float:
    """Dollars for `gb` leaving `cloud` to the internet (another cloud) in one month, tier by tier.

    Equal to SkyPilot's `get_egress_cost(gb)` below 10,240 GB; the providers' tiers above it
    (see the module docstring)."""
    if gb < 0:
        raise ValueError(f"gb must be >= 0, got {gb}")
    tiers = (rates or load_rates()).egress[cloud]
    cost = 0.0
    for tier in tiers:
        if tier.basis == "whole_volume":
            if tier.from_gb < gb <= tier.to_gb or (gb == 0 and tier.from_gb == 0):
                return gb * tier.usd_per_gb
            continue
        if gb > tier.from_gb:
            cost += (min(gb, tier.to_gb) - tier.from_gb) * tier.usd_per_gb
    return cost


def transfer_usd(src: Place, dst: Place, gb: float, rates: Rates | None = None) -> float:
    """Dollars for moving `gb` from `src` to `dst`, paid by the sender: nothing inside a region,
    the sender's inter-region rate inside a cloud, its internet egress tiers between clouds."""
    rates = rates or load_rates()
    path = path_between(src, dst, rates)
    if path == "internet":
        return internet_egress_usd(src.cloud, gb, rates)
    return gb * rates.within[(src.cloud, path)]


def usd_per_gb(src: Place, dst: Place, gb: float, rates: Rates | None = None) -> float:
    """The average rate per GB over a month's volume of `gb` (tiers and free gigabytes make it
    depend on the volume); 0 for no volume."""
    return transfer_usd(src, dst, gb, rates) / gb if gb > 0 else 0.0


def storage_usd(cloud: str, gb_months: float, rates: Rates | None = None) -> float:
    """Dollars for keeping `gb_months` in `cloud`'s standard object storage."""
    return gb_months * (rates or load_rates()).storage_usd_per_gb_month[cloud]


def requests_usd(cloud: str, *, writes: float, reads: float, rates: Rates | None = None) -> float:
    """Dollars for `writes` write requests (PUTs, multipart parts) and `reads` reads (GETs,
    ranged GETs) against `cloud`'s object storage."""
    rates = rates or load_rates()
    return writes / 1000 * rates.write_usd_per_1000[cloud] + reads / 1000 * rates.read_usd_per_1000[cloud]
