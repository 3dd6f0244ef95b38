"""GPU offers read straight from SkyPilot's own price catalog (schema v8, `<dir>/<cloud>/vms.csv`).

Why not ask SkyPilot? `import sky` costs about 2.3 s and its catalog functions load pandas;
reading the few GPU rows of the CSVs with the standard library takes milliseconds. The prices
must still be SkyPilot's own, row for row, so this module mirrors SkyPilot 0.14.1's rules:

- AWS and Azure: one row per (instance type, region, zone); the region's on-demand price is the
  same in every zone, the spot price differs per zone, and a blank spot price means "no spot
  offer there" (SkyPilot's `get_hourly_cost` raises for it).
- GCP: a GPU VM is a GPU row (empty InstanceType) plus the host VM row of the same zone, paired
  exactly as `sky/catalog/gcp_catalog.py::list_accelerators` does (`_get_host_instance_type`):
  A100, A100-80GB, L4, H100 must run on their own machine family sized by GPU count; other GPUs
  run on the cheapest n1 machine with enough vCPUs and 4 GiB of memory per vCPU. The price is
  the sum of both rows, spot and on-demand alike.
- Spot prices above on-demand are kept as SkyPilot lists them: the planner, not the reader,
  decides what to do with them.

A test cross-checks every price against `sky.catalog` on a real snapshot.

Where the catalog lives: `--catalog DIR`, else `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own
location (`$SKY_RUNTIME_DIR/.sky/catalogs/v8`, or `~/.sky/catalogs/v8` when unset). With no
catalog at all, skygreen falls back to its small embedded price table (`skygreen/data/`) and
says so in one line.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from skygreen.errors import CatalogError, InputError
from skygreen.gpus import GPUS

CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
SCHEMA_VERSION = "v8"
ENV_CATALOG_DIR = "SKYGREEN_CATALOG_DIR"
EMBEDDED_CATALOG = Path(__file__).resolve().parents[1] / "data" / "default_catalog.csv"

# --- GCP host pairing, copied from skypilot 0.14.1 sky/catalog/gcp_catalog.py -------------
# GPU -> count -> the only host machine types it can attach to.
GCP_ACC_HOST_TYPES: dict[str, dict[int, tuple[str, ...]]] = {
    "A100": {1: ("a2-highgpu-1g",), 2: ("a2-highgpu-2g",), 4: ("a2-highgpu-4g",), 8: ("a2-highgpu-8g",), 16: ("a2-megagpu-16g",)},
    "A100-80GB": {1: ("a2-ultragpu-1g",), 2: ("a2-ultragpu-2g",), 4: ("a2-ultragpu-4g",), 8: ("a2-ultragpu-8g",)},
    "L4": {
        1: ("g2-standard-4", "g2-standard-8", "g2-standard-12", "g2-standard-16", "g2-standard-32"),
        2: ("g2-standard-24",), 4: ("g2-standard-48",), 8: ("g2-standard-96",),
    },
    "H100": {1: ("a3-highgpu-1g",), 2: ("a3-highgpu-2g",), 4: ("a3-highgpu-4g",), 8: ("a3-highgpu-8g",)},
    "H100-MEGA": {8: ("a3-megagpu-8g",)},
    "H200": {8: ("a3-ultragpu-8g",)},
    "B200": {8: ("a4-highgpu-8g",)},
    "RTXPRO6000": {1: ("g4-standard-48",), 2: ("g4-standard-96",), 4: ("g4-standard-192",), 8: ("g4-standard-384",)},
}  # fmt: skip
# Other GPUs: count -> minimum host vCPUs (`_NUM_ACC_TO_NUM_CPU`), on an n1 machine.
GCP_N1_HOST_CPUS: dict[str, dict[int, int]] = {
    "K80": {1: 4, 2: 8, 4: 16, 8: 32, 16: 64},
    "V100": {1: 8, 2: 16, 4: 32, 8: 64},
    "T4": {1: 4, 2: 8, 4: 48},
    "P100": {1: 8, 2: 16, 4: 32, 8: 64},
    "DEFAULT": {1: 8, 2: 16, 4: 32, 8: 64, 16: 128},
}
GCP_N1_FAMILIES: tuple[str, ...] = ("n1-standard", "n1-highmem", "n1-highcpu")
GCP_HOST_MEMORY_GB_PER_CPU = 4
_GCP_HOST_PREFIXES: tuple[str, ...] = (
    tuple({t.rsplit("-", 1)[0] + "-" for counts in GCP_ACC_HOST_TYPES.values() for ts in counts.values() for t in ts})
    + GCP_N1_FAMILIES
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Offer:
    """One launchable GPU machine type in one region, with its cheapest zones.

    Prices are per node and per hour, as SkyPilot computes them for this (cloud, region,
    instance type): on-demand is the region's price, spot the cheapest zone's. Either may be
    None when the catalog lists no such price.
    """

    cloud: str
    region: str
    instance_type: str
    """For GCP: the host VM type that carries the GPUs (e.g. "a2-highgpu-1g")."""
    accelerator: str
    accelerator_count: int
    on_demand_price_usd_per_hour: float | None
    spot_price_usd_per_hour: float | None
    on_demand_zone: str | None = None
    spot_zone: str | None = None
    """AWS zones are the catalog's zone IDs (e.g. "use1-az1"); Azure has none."""

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {self.cloud!r}")
        if self.accelerator_count < 1:
            raise ValueError(f"accelerator_count must be >= 1, got {self.accelerator_count}")
        for price in (self.on_demand_price_usd_per_hour, self.spot_price_usd_per_hour):
            if price is not None and not (math.isfinite(price) and price >= 0):
                raise ValueError(f"price must be a finite number >= 0, got {price}")

    def price_usd_per_hour(self, spot: bool) -> float | None:
        """The spot or on-demand price, in USD per node-hour; None when the catalog lists none."""
        return self.spot_price_usd_per_hour if spot else self.on_demand_price_usd_per_hour

    def zone(self, spot: bool) -> str | None:
        """The zone `price_usd_per_hour(spot)` was found in (the cheapest); None when the catalog
        names no zone for it (Azure) or has no such price."""
        return self.spot_zone if spot else self.on_demand_zone


@dataclass(frozen=True, kw_only=True, slots=True)
class Catalog:
    """The offers skygreen may rank, and where they came from."""

    offers: tuple[Offer, ...]
    source: str
    """The directory read, or a label for the embedded table."""
    embedded: bool = False
    regions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """cloud -> every region its catalog file lists (for did-you-mean on `regions:`)."""
    notices: tuple[str, ...] = ()
    """One-line remarks for the user: embedded fallback, clouds missing from the directory."""


# ---------------------------------------------------------------- locating


def skypilot_catalog_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where SkyPilot keeps its catalog: `$SKY_RUNTIME_DIR/.sky/catalogs/v8`, else under HOME."""
    env = os.environ if env is None else env
    root = env.get("SKY_RUNTIME_DIR") or env.get("HOME") or str(Path.home())
    return Path(root).expanduser() / ".sky" / "catalogs" / SCHEMA_VERSION


def resolve_catalog_dir(catalog_dir: Path | str | None, env: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """(directory, explicit): the flag, else $SKYGREEN_CATALOG_DIR, else SkyPilot's location."""
    env = os.environ if env is None else env
    if catalog_dir is not None:
        return Path(catalog_dir).expanduser(), True
    if env.get(ENV_CATALOG_DIR):
        return Path(env[ENV_CATALOG_DIR]).expanduser(), True
    return skypilot_catalog_dir(env), False


def load_catalog(
    catalog_dir: Path | str | None = None,
    *,
    clouds: Iterable[str] = CLOUDS,
    env: Mapping[str, str] | None = None,
) -> Catalog:
    """Read the offers of `clouds` from the catalog directory, or fall back to the embedded table.

    A directory the user named (flag or environment) must hold at least one of the clouds:
    otherwise that is a mistake worth an error. SkyPilot's default location may simply not
    exist yet (SkyPilot downloads lazily), and then the embedded table is used with a notice.
    """
    clouds = tuple(clouds)
    directory, explicit = resolve_catalog_dir(catalog_dir, env)
    present = [c for c in clouds if (directory / c / "vms.csv").is_file()]
    how = "--catalog" if catalog_dir is not None else ENV_CATALOG_DIR
    if not present:
        if explicit:
            raise InputError(_missing_dir_message(directory, clouds, how))
        return load_embedded_catalog(
            clouds=clouds,
            notice=f"no SkyPilot catalog at {directory}; using skygreen's embedded price table "
            f"({embedded_catalog_date()}). Run `skygreen catalog update` for current prices.",
        )
    offers: list[Offer] = []
    regions: dict[str, tuple[str, ...]] = {}
    for cloud in present:
        path = directory / cloud / "vms.csv"
        cloud_offers, cloud_regions = read_vms_csv(path, cloud)
        offers.extend(cloud_offers)
        regions[cloud] = cloud_regions
    missing = [c for c in clouds if c not in present]
    notices: tuple[str, ...] = ()
    if missing:
        notices = (
            (
                f"no catalog for {', '.join(missing)} in {directory}; ranking {', '.join(present)} only "
                f"(`skygreen catalog update` downloads the rest)."
            ),
        )
    return Catalog(offers=tuple(offers), source=str(directory), regions=regions, notices=notices)


def _missing_dir_message(directory: Path, clouds: tuple[str, ...], how: str) -> str:
    wanted = ", ".join(f"{c}/vms.csv" for c in clouds)
    state = "does not exist" if not directory.exists() else f"holds none of {wanted}"
    return (
        f"catalog directory {directory} (from {how}) {state}\n"
        f"  fix: point {how} at a SkyPilot v8 catalog (a folder with <cloud>/vms.csv, "
        f"e.g. ~/.sky/catalogs/v8), or run `skygreen catalog update` while online"
    )


# ---------------------------------------------------------------- SkyPilot CSVs


def read_vms_csv(path: Path, cloud: str) -> tuple[list[Offer], tuple[str, ...]]:
    """The GPU offers of one cloud's `vms.csv`, and every region the file lists."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(
            f"cannot read catalog file {path}: {e}\n  fix: run `skygreen catalog update`, or delete the file and retry"
        ) from e
    try:
        rows, regions = _gpu_rows(text, cloud)
        offers = _gcp_offers(rows) if cloud == "gcp" else _zoned_offers(rows, cloud)
    except (KeyError, ValueError) as e:
        raise CatalogError(
            f"catalog file {path} is not a SkyPilot {SCHEMA_VERSION} catalog ({e})\n"
            f"  fix: run `skygreen catalog update`, or point --catalog at a SkyPilot {SCHEMA_VERSION} catalog"
        ) from e
    return offers, regions


@dataclass(frozen=True, slots=True)
class _Row:
    instance_type: str
    accelerator: str
    accelerator_count: float | None
    vcpus: float | None
    memory_gb: float | None
    price: float | None
    spot_price: float | None
    region: str
    zone: str | None
    has_gpu_info: bool


def _float(text: str) -> float | None:
    """A CSV number; blank or NaN is None (as pandas reads it)."""
    if not text or text.strip().lower() in ("nan", "none", "null"):
        return None
    value = float(text)
    return None if math.isnan(value) else value


def _gpu_rows(text: str, cloud: str) -> tuple[list[_Row], tuple[str, ...]]:
    """The rows that can make a GPU offer (plus, for GCP, the host VM rows), and all regions.

    A full SkyPilot catalog has tens of thousands of CPU-only rows; a cheap split on the
    first columns drops them before the csv module parses the rest.
    """
    lines = text.splitlines()
    if not lines:
        raise ValueError("empty file")
    header = next(csv.reader([lines[0].lstrip("\ufeff")]))
    col = {name: i for i, name in enumerate(header)}
    for name in ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region"):
        if name not in col:
            raise KeyError(f"missing column {name!r}")
    acc_i, type_i, region_i = col["AcceleratorName"], col["InstanceType"], col["Region"]
    quick = max(acc_i, type_i) + 1
    # Columns before GpuInfo are never quoted in SkyPilot's files, so a plain split finds them.
    plain = "GpuInfo" not in col or col["GpuInfo"] >= quick
    known = set(GPUS)
    regions: set[str] = set()
    kept: list[str] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        if plain:
            head = line.split(",", quick)
            acc, itype = head[acc_i], head[type_i]
            if not (acc in known or (cloud == "gcp" and not acc and itype.startswith(_GCP_HOST_PREFIXES))):
                regions.add(_region_of(line, region_i, len(header)))
                continue
        kept.append(line)
    rows = []
    for values in csv.reader(io.StringIO("\n".join(kept))):
        row = _parse_row(values, col)
        regions.add(row.region)
        if row.accelerator and row.accelerator not in known:
            continue
        rows.append(row)
    regions.discard("")
    return rows, tuple(sorted(regions))


def _region_of(line: str, region_i: int, n_columns: int) -> str:
    """The region of a row we otherwise skip. The columns after Region (zone, prices, arch)
    hold no commas, so a split from the right finds it even past a quoted GpuInfo."""
    from_right = n_columns - region_i
    parts = line.rsplit(",", from_right)
    if len(parts) == from_right + 1 and line.count(",") >= n_columns - 1:
        return parts[1] if region_i > 0 else parts[0]
    return next(csv.reader([line]))[region_i]


def _parse_row(values: list[str], col: Mapping[str, int]) -> _Row:
    def get(name: str) -> str:
        i = col.get(name)
        return values[i].strip() if i is not None and i < len(values) else ""

    return _Row(
        instance_type=get("InstanceType"),
        accelerator=get("AcceleratorName"),
        accelerator_count=_float(get("AcceleratorCount")),
        vcpus=_float(get("vCPUs")),
        memory_gb=_float(get("MemoryGiB")),
        price=_float(get("Price")),
        spot_price=_float(get("SpotPrice")),
        region=get("Region"),
        zone=get("AvailabilityZone") or None,
        has_gpu_info=bool(get("GpuInfo")),
    )


def _whole_count(count: float | None) -> int | None:
    """GPUs per node as an int; fractional GPUs (Azure's partial A10s) cannot train a job."""
    if count is None or count < 1 or not float(count).is_integer():
        return None
    return int(count)


def _cheapest(pairs: Iterable[tuple[float | None, str | None]]) -> tuple[float | None, str | None]:
    """(price, zone) of the lowest price, first one on ties (pandas idxmin), blanks skipped."""
    best: tuple[float | None, str | None] = (None, None)
    for price, zone in pairs:
        if price is not None and (best[0] is None or price < best[0]):
            best = (price, zone)
    return best


def _zoned_offers(rows: list[_Row], cloud: str) -> list[Offer]:
    """AWS and Azure: group the zone rows of each (instance type, region)."""
    groups: dict[tuple[str, str, str, int], list[_Row]] = {}
    for row in rows:
        count = _whole_count(row.accelerator_count)
        if not row.instance_type or not row.accelerator or count is None or not row.has_gpu_info:
            continue
        groups.setdefault((row.instance_type, row.region, row.accelerator, count), []).append(row)
    return [
        _offer(cloud, region, itype, acc, count, [(r.price, r.spot_price, r.zone) for r in group])
        for (itype, region, acc, count), group in groups.items()
    ]


def _offer(
    cloud: str,
    region: str,
    instance_type: str,
    acc: str,
    count: int,
    zone_prices: list[tuple[float | None, float | None, str | None]],
) -> Offer:
    on_demand, od_zone = _cheapest((p, z) for p, _, z in zone_prices)
    spot, spot_zone = _cheapest((s, z) for _, s, z in zone_prices)
    return Offer(
        cloud=cloud,
        region=region,
        instance_type=instance_type,
        accelerator=acc,
        accelerator_count=count,
        on_demand_price_usd_per_hour=on_demand,
        spot_price_usd_per_hour=spot,
        on_demand_zone=od_zone,
        spot_zone=spot_zone,
    )


def _gcp_offers(rows: list[_Row]) -> list[Offer]:
    """GCP: pair each GPU row with its host VM row in the same zone, as SkyPilot does."""
    hosts: dict[tuple[str, str], list[_Row]] = {}
    for row in rows:
        if row.instance_type and row.zone:
            hosts.setdefault((row.region.lower(), row.zone.lower()), []).append(row)
    groups: dict[tuple[str, str, str, int], list[tuple[float | None, float | None, str | None]]] = {}
    for row in rows:
        count = _whole_count(row.accelerator_count)
        if row.instance_type or not row.accelerator or count is None or not row.has_gpu_info or row.price is None:
            continue
        host = _gcp_host(row.accelerator, count, hosts.get((row.region.lower(), (row.zone or "").lower()), []))
        if host is None or host.price is None:
            continue
        price = row.price + host.price  # both present: SkyPilot drops rows without either price
        spot = None if row.spot_price is None or host.spot_price is None else row.spot_price + host.spot_price
        groups.setdefault((host.instance_type, row.region, row.accelerator, count), []).append((price, spot, row.zone))
    return [
        _offer("gcp", region, itype, acc, count, zone_prices)
        for (itype, region, acc, count), zone_prices in groups.items()
    ]


def _gcp_host(acc: str, count: int, zone_hosts: list[_Row]) -> _Row | None:
    """SkyPilot's `_get_host_instance_type`: the cheapest allowed host VM in the GPU's zone."""
    if acc in GCP_ACC_HOST_TYPES:
        allowed = GCP_ACC_HOST_TYPES[acc].get(count)
        if allowed is None:
            return None
        candidates = [h for h in zone_hosts if h.instance_type in allowed]
    else:
        cpus = GCP_N1_HOST_CPUS.get(acc, GCP_N1_HOST_CPUS["DEFAULT"]).get(count)
        if cpus is None:
            return None
        memory_gb = cpus * GCP_HOST_MEMORY_GB_PER_CPU
        candidates = [
            h
            for h in zone_hosts
            if h.instance_type.startswith(GCP_N1_FAMILIES)
            and h.vcpus is not None
            and h.memory_gb is not None
            and h.vcpus >= cpus
            and h.memory_gb >= memory_gb
        ]
    best: _Row | None = None
    for host in candidates:
        if host.price is not None and (best is None or best.price is None or host.price < best.price):
            best = host
    return best


# ---------------------------------------------------------------- embedded table


def embedded_catalog_date() -> str:
    """The 'prices as of' date written in the embedded table's header."""
    for line in _embedded_lines():
        if line.startswith("# prices-as-of:"):
            return line.split(":", 1)[1].strip()
        if not line.startswith("#"):
            break
    return "unknown date"


def _embedded_lines() -> Iterator[str]:
    with EMBEDDED_CATALOG.open(encoding="utf-8") as f:
        yield from (line.rstrip("\n") for line in f)


def load_embedded_catalog(*, clouds: Iterable[str] = CLOUDS, notice: str | None = None) -> Catalog:
    """skygreen's own small price table, for a machine with no SkyPilot catalog at all.

    Its rows are already whole offers (GCP host and GPU summed), one per region.
    """
    clouds = tuple(clouds)
    data = [line for line in _embedded_lines() if line and not line.startswith("#")]
    offers = []
    for rec in csv.DictReader(data):
        if rec["cloud"] not in clouds:
            continue
        offers.append(
            Offer(
                cloud=rec["cloud"],
                region=rec["region"],
                instance_type=rec["instance_type"],
                accelerator=rec["accelerator"],
                accelerator_count=int(rec["accelerator_count"]),
                on_demand_price_usd_per_hour=_float(rec["price_usd_per_hour"]),
                spot_price_usd_per_hour=_float(rec["spot_price_usd_per_hour"]),
                on_demand_zone=rec["zone"] or None,
                spot_zone=rec["zone"] or None,
            )
        )
    regions: dict[str, set[str]] = {}
    for offer in offers:
        regions.setdefault(offer.cloud, set()).add(offer.region)
    return Catalog(
        offers=tuple(offers),
        source=f"skygreen embedded price table ({embedded_catalog_date()})",
        embedded=True,
        regions={c: tuple(sorted(r)) for c, r in regions.items()},
        notices=(notice,) if notice else (),
    )
