"""A run's energy, facility energy, CO2e and cap, from its checkpoint, and the energy statement.

    facility_kwh = gpu_kwh x PUE of the cloud (`skygreen.cost.PUE`: each provider's reported
                   fleet average; the one table skygreen has)
    co2e_kg      = facility_kwh x grams CO2e per kWh of the region (`skygreen.carbon`)

GPU energy is what the runtime metered (`energy_j` in the checkpoint's meta, summed over ranks
and launches) by the method it names: `nvml-counter`, `power-sampling`, `simulated`, or
`none` with the reason (a CPU run). A run on this machine (`--local`) has no cloud: PUE 1.0
(no data-centre overhead known) and the carbon table's overall median marked `assumed`.

The statement follows the MIT Lincoln Lab study's call (arXiv 2205.09646) for papers to end
with an energy statement: GPU-hours, kWh on the GPUs and at the facility, kg CO2e, the power
cap and its measured saving, and the cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from skygreen.figures import amount, significant
from skygreen.plan import carbon
from skygreen.plan.cost import PUE

LOCAL_PUE = 1.0
J_PER_KWH = 3.6e6


@dataclass(frozen=True, kw_only=True, slots=True)
class EnergyReport:
    """A run's GPU and facility kWh, CO2e, cap and GPU-hours, as `skygreen status` shows them.

    `gpu_hours` is 0.0 when no GPU energy was metered (method `none`).
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
    region: str | None

    def to_json(self) -> dict[str, Any]:
        """Every field as a JSON value; `EnergyReport(**data)` makes the report again."""
        return asdict(self)


def energy_report(meta: Mapping[str, Any], *, cloud: str | None, region: str | None) -> EnergyReport:
    """From a checkpoint manifest's meta (the runtime writes `energy_j`, `wall_s`, `power`)."""
    power = meta.get("power") or {}
    cloud = cloud.lower() if cloud else None  # SkyPilot reports "GCP", the tables say "gcp"
    gpu_kwh = float(meta.get("energy_j") or 0.0) / J_PER_KWH
    pue = PUE.get(cloud, LOCAL_PUE) if cloud else LOCAL_PUE
    intensity = carbon.intensity(cloud or "", region or "")
    facility_kwh = gpu_kwh * pue
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
        co2e_kg=facility_kwh * intensity.g_co2e_per_kwh / 1000.0,
        g_co2e_per_kwh=intensity.g_co2e_per_kwh,
        carbon_basis=intensity.basis,
        method=method,
        reason=reason,
        cap_w=power.get("cap_w"),
        default_limit_w=power.get("default_limit_w"),
        saving_vs_uncapped=power.get("saving_vs_uncapped"),
        gpu_hours=float(meta.get("wall_s") or 0.0) / 3600.0 * gpus if on_gpu else 0.0,
        cloud=cloud,
        region=region,
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


def statement(r: EnergyReport, *, run_id: str, cost_usd: float | None, cost_estimated: bool = False) -> str:
    """The energy statement paragraph, ready to paste into a paper."""
    where = f"{r.cloud} {r.region}" if r.cloud else "a local machine"
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
    cost = "" if cost_usd is None else f" The compute cost {'about ' if cost_estimated else ''}${cost_usd:,.2f}."
    return f"Energy statement: training run {run_id} ran on {where}. {energy}{cap}{cost}"


def _q(value: float) -> str:
    """Three significant digits without exponents: 1,234, 12.3, 0.00123."""
    return significant(value, 3)


_BASIS = {
    "region": "the provider's figure for the region",
    "country": "the grid average of the region's country",
    "assumed": "an assumed figure: the region is not in skygreen's table",
}
