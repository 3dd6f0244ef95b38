"""Grams of CO2e per kWh of electricity, by cloud region, for the `carbon` objective.

The table (`skygreen/data/carbon_intensity.csv`) is generated once from the codecarbon
package's data by `scripts/make_carbon_table.py`; its header says the sources and date. GCP
regions carry Google's own per-region figure; AWS and Azure regions carry the average of the
country they are in, which is coarser (a US region gets the US average). A region missing from
the table gets its cloud's median, and the plan says so.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "data" / "carbon_intensity.csv"


@dataclass(frozen=True, kw_only=True, slots=True)
class Intensity:
    """A region's grid carbon intensity, in grams of CO2e per kWh, and how it was found."""

    g_co2e_per_kwh: float
    basis: str
    """"region" (the provider's figure), "country" (the country's grid average) or
    "assumed" (the cloud's median: the region is not in the table)."""


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str], Intensity]:
    with TABLE.open(encoding="utf-8") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {
            (row["cloud"], row["region"]): Intensity(g_co2e_per_kwh=float(row["g_co2e_per_kwh"]), basis=row["basis"])
            for row in rows
        }


@lru_cache(maxsize=8)
def _cloud_median(cloud: str) -> float:
    values = [v.g_co2e_per_kwh for (c, _), v in _table().items() if c == cloud]
    return statistics.median(values or [v.g_co2e_per_kwh for v in _table().values()])


def intensity(cloud: str, region: str) -> Intensity:
    """The region's grid intensity, or the cloud's median marked `assumed`."""
    found = _table().get((cloud, region))
    if found is not None:
        return found
    return Intensity(g_co2e_per_kwh=_cloud_median(cloud), basis="assumed")


def co2e_kg(energy_kwh: float, cloud: str, region: str) -> float:
    """Kilograms of CO2e for `energy_kwh` drawn in the region, at its `intensity` (the cloud's
    median for a region not in the table)."""
    return energy_kwh * intensity(cloud, region).g_co2e_per_kwh / 1000.0
