"""A run's energy, facility energy, CO2e and cap, and the energy statement.

The kWh and CO2e are `skygreen.ledger.energy`'s, segment by segment: each segment's boards x
its cloud's PUE, at its region's grid intensity. A run that moved between clouds is priced where
each part ran, and the statement names every region with its share. A run on this machine
(`--local`) has no cloud: PUE 1.0 and the carbon table's overall median marked `assumed`.

GPU energy is what the runtime metered by the method it names: `nvml-counter`,
`power-sampling`, `simulated`, or `none` with the reason (a CPU run).

The statement follows the MIT Lincoln Lab study's call (arXiv 2205.09646) for papers to end
with an energy statement: GPU-hours, kWh on the GPUs and at the facility, kg CO2e, the power
cap and its measured saving, and the compute cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from skygreen.figures import amount, money, significant
from skygreen.ledger.energy import RunEnergy, pue_of, run_energy, segment_energy
from skygreen.ledger.records import Place
from skygreen.plan import carbon

J_PER_KWH = 3.6e6


@dataclass(frozen=True, kw_only=True, slots=True)
class EnergyReport:
    """A run's GPU and facility kWh, CO2e, cap and GPU-hours, as `skygreen status` shows them.

    `gpu_hours` is 0.0 when no GPU energy was metered (method `none`). `pue` and
    `g_co2e_per_kwh` are the run's effective figures (facility / boards, CO2e / facility): a run
    that moved between clouds has one per region in `regions`.
    """

    gpu_kwh: float
    facility_kwh: float
    pue: float
    co2e_kg: float
    g_co2e_per_kwh: float
    carbon_basis: str
    method: str
    """nvml-counter | power-sampling | simulated | none."""
    reason: str | None
    """Why `none`: no GPU, no NVML."""
    cap_w: float | None
    default_limit_w: float | None
    saving_vs_uncapped: float | None
    """Energy per step saved by the cap against the highest limit profiled (`auto` only)."""
    gpu_hours: float
    cloud: str | None
    """The cloud of the run's last region (None on this machine)."""
    region: str | None
    regions: list[dict[str, Any]] = field(default_factory=list)
    """`skygreen.ledger.energy.RegionShare` as JSON, each with its `label` and `share`."""

    def to_json(self) -> dict[str, Any]:
        """Every field as a JSON value; `EnergyReport(**data)` makes the report again."""
        return asdict(self)


def meta_energy(meta: Mapping[str, Any], *, cloud: str | None, region: str | None) -> RunEnergy:
    """A run without a ledger: the checkpoint's metered joules, all at the place its job reports."""
    energy_j = meta.get("energy_j")
    place = Place(cloud=(cloud or "local").lower(), region=region)
    return run_energy([segment_energy(place, None if energy_j is None else float(energy_j))])


def energy_report(meta: Mapping[str, Any], energy: RunEnergy, *, cloud: str | None = None) -> EnergyReport:
    """From a checkpoint manifest's meta (the runtime writes `energy_j`, `wall_s`, `power`) and the
    run's energy (`skygreen.ledger.energy.run_energy`, from its ledger or `meta_energy`).
    `cloud` is where a run that metered nothing stands (for its PUE)."""
    power = meta.get("power") or {}
    gpu_kwh = energy.gpu_energy_kwh or 0.0
    facility_kwh = energy.energy_kwh or 0.0
    co2e = energy.co2e_kg or 0.0
    last = energy.regions[-1] if energy.regions else None
    where = last.cloud if last else (cloud or "local").lower()
    pue = facility_kwh / gpu_kwh if gpu_kwh else (last.pue if last else pue_of(where))
    if facility_kwh:
        g_per_kwh = co2e * 1000.0 / facility_kwh
    else:
        g_per_kwh = last.g_co2e_per_kwh if last else carbon.intensity(where, "").g_co2e_per_kwh
    bases = sorted({r.carbon_basis for r in energy.regions}) or ["assumed"]
    method = power.get("method") or ("none" if not meta.get("energy_j") else "nvml-counter")
    reason = power.get("reason")
    if method == "none" and reason is None:
        reason = "this runtime recorded no GPU energy"
    on_gpu = method != "none"
    gpus = int(power.get("gpus") or meta.get("world_size") or 1)
    return EnergyReport(
        gpu_kwh=gpu_kwh,
        facility_kwh=facility_kwh,
        pue=pue,
        co2e_kg=co2e,
        g_co2e_per_kwh=g_per_kwh,
        carbon_basis=bases[0] if len(bases) == 1 else "mixed",
        method=method,
        reason=reason,
        cap_w=power.get("cap_w"),
        default_limit_w=power.get("default_limit_w"),
        saving_vs_uncapped=power.get("saving_vs_uncapped"),
        gpu_hours=float(meta.get("wall_s") or 0.0) / 3600.0 * gpus if on_gpu else 0.0,
        cloud=None if where == "local" else where,
        region=last.region if last and where != "local" else None,
        regions=[{**asdict(r), "label": r.label} for r in energy.regions],
    )


def cap_text(r: EnergyReport) -> str:
    """The cap in words: `150 W of 250 W default`, with the measured saving when `auto` profiled one.

    Without a cap: `none`, followed by the default limit when the run metered a GPU and it is known.
    """
    if r.cap_w is None:
        return (
            "none"
            if r.method == "none"
            else f"none (default limit {r.default_limit_w:g} W)"
            if r.default_limit_w
            else "none"
        )
    text = f"{r.cap_w:g} W of {r.default_limit_w:g} W default" if r.default_limit_w else f"{r.cap_w:g} W"
    if r.saving_vs_uncapped is not None:
        text += f", {100 * r.saving_vs_uncapped:.1f}% less energy per step than uncapped (measured)"
    return text


def energy_line(r: EnergyReport) -> str:
    """One line for `skygreen status RUN`."""
    if r.method == "none":
        return f"none: {r.reason}"
    simulated = " (simulated GPU)" if r.method == "simulated" else ""
    return (
        f"{amount(r.gpu_kwh)} kWh GPU x PUE {r.pue:.2f} = {amount(r.facility_kwh)} kWh facility, "
        f"{amount(r.co2e_kg)} kg CO2e ({r.g_co2e_per_kwh:.0f} g/kWh, {r.carbon_basis}); by {r.method}{simulated}"
    )


def statement(r: EnergyReport, *, run_id: str, compute_usd: float | None, cost_estimated: bool = False) -> str:
    """The energy statement paragraph, ready to paste into a paper. `compute_usd` is the GPU
    machines' cost alone (no controller, no storage): what the energy was bought with."""
    if r.method == "none":
        energy = f"No GPU energy was metered ({r.reason})."
    else:
        how = {"nvml-counter": "NVML's total-energy counter", "power-sampling": "sampled NVML power readings",
               "simulated": "a simulated GPU (skygreen's power model, not hardware)"}.get(r.method, r.method)  # fmt: skip
        energy = (
            f"It used {_q(r.gpu_hours)} GPU-hours and {_q(r.gpu_kwh)} kWh on the GPUs, measured with {how}; "
            f"with a power usage effectiveness of {r.pue:.2f} that is {_q(r.facility_kwh)} kWh at the facility, "
            f"or {_q(r.co2e_kg)} kg CO2e at {r.g_co2e_per_kwh:.0f} g CO2e/kWh ({_BASIS.get(r.carbon_basis, r.carbon_basis)})."
        )
    if r.method == "none":
        cap = ""
    else:
        cap = (
            f" The GPUs ran with a power cap of {cap_text(r)}."
            if r.cap_w is not None
            else " The GPUs ran without a power cap."
        )
    cost = "" if compute_usd is None else f" The compute cost {'about ' if cost_estimated else ''}{money(compute_usd)}."
    return f"Energy statement: training run {run_id} ran on {_where(r)}. {energy}{cap}{cost}"


def _where(r: EnergyReport) -> str:
    """`aws eu-south-2 (62% of the energy) and gcp asia-northeast3 (38%)`; one region alone by name."""
    if len(r.regions) > 1:
        parts = [f"{region['label']} ({100 * region['share']:.0f}%)" for region in r.regions]
        parts[0] = parts[0].replace("%)", "% of the energy)")
        return ", ".join(parts[:-1]) + " and " + parts[-1]
    if r.regions:
        return str(r.regions[0]["label"])
    return " ".join(p for p in (r.cloud, r.region) if p) if r.cloud else "a local machine"


def _q(value: float) -> str:
    """Three significant digits without exponents: 1,234, 12.3, 0.00123."""
    return significant(value, 3)


_BASIS = {
    "region": "the provider's figure for the region",
    "country": "the grid average of the region's country",
    "assumed": "an assumed figure: the region is not in skygreen's table",
    "mixed": "each region's own figure, weighted by its energy",
}
