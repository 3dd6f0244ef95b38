"""A run's energy and CO2e, segment by segment: the one computation behind every figure shown.

    gpu_energy_kwh = the GPU boards' energy the runtime metered in the segment
    energy_kwh     = gpu_energy_kwh x PUE of the segment's cloud (the facility's energy)
    co2e_kg        = energy_kwh x grams CO2e per kWh of the segment's region / 1000

A run that moved between clouds is priced where each of its segments ran, never at its last
place: `status`, `cost`, `compare`, the report and the energy statement all read `run_energy`,
so each JSON key means one thing everywhere (`energy_kwh` the facility's, `gpu_energy_kwh` the
boards'). A run on this machine has no data centre: PUE 1.0. A cloud the PUE table lacks gets 1.2.

Pure: places and joules come in, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from skygreen.ledger.records import Place
from skygreen.plan import carbon
from skygreen.plan.cost import PUE

LOCAL_PUE = 1.0
UNKNOWN_CLOUD_PUE = 1.2
J_PER_KWH = 3.6e6


@dataclass(frozen=True, kw_only=True, slots=True)
class SegmentEnergy:
    """One segment's energy where it ran; the kWh and kg are None where nothing metered it."""

    cloud: str
    region: str | None
    gpu_energy_kwh: float | None
    energy_kwh: float | None
    """Facility energy: the boards' times `pue`."""
    co2e_kg: float | None
    pue: float
    g_co2e_per_kwh: float
    carbon_basis: str
    """`region`, `country` or `assumed` (`skygreen.plan.carbon.Intensity.basis`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RegionShare:
    """The part of a run's facility energy drawn in one cloud region."""

    cloud: str
    region: str | None
    energy_kwh: float
    co2e_kg: float
    share: float
    """Of the run's facility energy, 0..1."""
    pue: float
    g_co2e_per_kwh: float
    carbon_basis: str

    @property
    def label(self) -> str:
        """`aws eu-south-2`, or `a local machine`."""
        return "a local machine" if self.cloud == "local" else " ".join(p for p in (self.cloud, self.region) if p)


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnergy:
    """A run's metered energy summed over its segments, and each region's share of it."""

    gpu_energy_kwh: float | None
    energy_kwh: float | None
    co2e_kg: float | None
    regions: tuple[RegionShare, ...]
    """Every region the run drew metered energy in, in the order it first ran there."""

    def to_json(self) -> dict[str, Any]:
        """The sums and one entry per region (its `label` included)."""
        return {
            "gpu_energy_kwh": self.gpu_energy_kwh,
            "energy_kwh": self.energy_kwh,
            "co2e_kg": self.co2e_kg,
            "regions": [{**asdict(r), "label": r.label} for r in self.regions],
        }


def pue_of(cloud: str) -> float:
    """The cloud's power usage effectiveness: the provider's fleet figure, 1.0 on this machine."""
    cloud = cloud.lower()
    return LOCAL_PUE if cloud == "local" else PUE.get(cloud, UNKNOWN_CLOUD_PUE)


def segment_energy(place: Place, energy_j: float | None) -> SegmentEnergy:
    """One segment's board energy, facility energy and CO2e, at its own cloud's PUE and its own
    region's grid intensity."""
    cloud = place.cloud.lower()  # SkyPilot says "GCP", the tables say "gcp"
    pue = pue_of(cloud)
    intensity = carbon.intensity(cloud, place.region or "")
    gpu_kwh = None if energy_j is None else float(energy_j) / J_PER_KWH
    facility_kwh = None if gpu_kwh is None else gpu_kwh * pue
    return SegmentEnergy(
        cloud=cloud,
        region=place.region,
        gpu_energy_kwh=gpu_kwh,
        energy_kwh=facility_kwh,
        co2e_kg=None if facility_kwh is None else facility_kwh * intensity.g_co2e_per_kwh / 1000.0,
        pue=pue,
        g_co2e_per_kwh=intensity.g_co2e_per_kwh,
        carbon_basis=intensity.basis,
    )


def run_energy(segments: Iterable[SegmentEnergy]) -> RunEnergy:
    """The segments' sums (None where none was metered) and each region's share of the facility
    energy (a region whose segments metered nothing is left out)."""
    metered = [s for s in segments if s.energy_kwh is not None]
    if not metered:
        return RunEnergy(gpu_energy_kwh=None, energy_kwh=None, co2e_kg=None, regions=())
    gpu = sum(s.gpu_energy_kwh or 0.0 for s in metered)
    facility = sum(s.energy_kwh or 0.0 for s in metered)
    co2e = sum(s.co2e_kg or 0.0 for s in metered)
    by_region: dict[tuple[str, str | None], list[SegmentEnergy]] = {}
    for s in metered:
        by_region.setdefault((s.cloud, s.region), []).append(s)
    regions = tuple(
        RegionShare(
            cloud=cloud,
            region=region,
            energy_kwh=sum(s.energy_kwh or 0.0 for s in parts),
            co2e_kg=sum(s.co2e_kg or 0.0 for s in parts),
            share=sum(s.energy_kwh or 0.0 for s in parts) / facility if facility else 1.0 / len(by_region),
            pue=parts[0].pue,
            g_co2e_per_kwh=parts[0].g_co2e_per_kwh,
            carbon_basis=parts[0].carbon_basis,
        )
        for (cloud, region), parts in by_region.items()
    )
    return RunEnergy(gpu_energy_kwh=gpu, energy_kwh=facility, co2e_kg=co2e, regions=regions)
