"""Rank GPU offers by what the whole run will cost, not by price per hour.

A pure function of plain records: the task's `skygreen:` section, a `Catalog` of offers and
the estimate model (`skygreen.cost`). Every offer that meets the constraints becomes a
`Candidate` with its estimated hours, cost, energy and CO2e; candidates are sorted by the
objective (cost, time, energy or carbon; ties broken by cost, then by name so the order is
stable). When nothing matches, the constraints are relaxed one at a time to say which one to
loosen, and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace

from skygreen.checkpoint.interval import PREEMPTION_RATE_PER_HOUR
from skygreen.errors import NoOfferError, SpecError, did_you_mean
from skygreen.gpus import GPUS
from skygreen.plan import carbon
from skygreen.plan.catalog import CLOUDS, Catalog, Offer
from skygreen.plan.cost import (
    DEFAULT_CHECKPOINT_COST_S,
    DEFAULT_RESTART_S,
    RunModel,
    estimate,
)
from skygreen.plan.explain import METRIC, assumptions, explain, money, night_hint
from skygreen.power.policy import DEFAULT_ETA
from skygreen.spec import OBJECTIVES, GreenSpec, TaskSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One offer the job could run on, with what the run is expected to take there."""

    cloud: str
    region: str
    zone: str | None
    """The cheapest zone when the catalog has zones (AWS: a zone ID such as "use1-az1"), else None."""
    instance_type: str
    """For GCP: the host VM type (e.g. "a2-highgpu-1g")."""
    accelerator: str
    accelerator_count: int
    """GPUs per node."""
    spot: bool
    price_usd_per_hour: float
    """The price of this offer per node (the spot price when spot), equal to SkyPilot's."""
    on_demand_price_usd_per_hour: float | None
    spot_price_usd_per_hour: float | None
    est_hours: float
    """Wall hours including the expected preemption overhead."""
    est_cost_usd: float
    """For the whole run, all nodes."""
    energy_kwh: float
    co2e_kg: float
    num_nodes: int = 1
    compute_hours: float = 0.0
    """Hours of uninterrupted training; est_hours minus this is the spot overhead."""
    expected_preemptions: float = 0.0
    checkpoint_interval_s: float | None = None
    on_demand_hours: float = 0.0
    """Under a deadline: expected hours a spot run spends on its on-demand fallback."""
    deadline_source: str | None = None
    """Under a deadline, where the expected cost of a spot run came from: "traces" or "model"."""

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {self.cloud!r}")
        if self.accelerator_count < 1 or self.num_nodes < 1:
            raise ValueError("accelerator_count and num_nodes must be >= 1")
        for name in ("price_usd_per_hour", "est_hours", "est_cost_usd", "energy_kwh", "co2e_kg"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")

    @property
    def label(self) -> str:
        """A short human name: `aws us-east-1 g6.xlarge (L4x1, spot)`."""
        kind = "spot" if self.spot else "on-demand"
        nodes = f" x{self.num_nodes} nodes" if self.num_nodes > 1 else ""
        return f"{self.cloud} {self.region} {self.instance_type} ({self.accelerator}x{self.accelerator_count}{nodes}, {kind})"

    def to_json(self) -> dict:
        """Every field under its own name, values as they are (all plain JSON values); no `label`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The ranked candidates, best first, and what the ranking assumed."""

    candidates: tuple[Candidate, ...]
    objective: str
    best_per_cloud: Mapping[str, Candidate] = field(default_factory=dict)
    reason: tuple[str, ...] = ()
    """One or two sentences on why the winner won."""
    assumptions: tuple[str, ...] = ()
    night_hint: str = ""
    """One sourced line: what starting the winner at the region's night would save, for a job that can wait."""
    notices: tuple[str, ...] = ()
    catalog_source: str = ""
    offers_considered: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}")
        if not self.candidates:
            raise ValueError("a plan has at least one candidate")

    @property
    def best(self) -> Candidate:
        """The winner: the first candidate (a plan always has one)."""
        return self.candidates[0]

    def to_json(self) -> dict:
        """The plan for `skygreen plan --json`: every field but `offers_considered`, the catalog's
        source under the key `catalog`."""
        return {
            "candidates": [c.to_json() for c in self.candidates],
            "objective": self.objective,
            "best_per_cloud": {cloud: c.to_json() for cloud, c in self.best_per_cloud.items()},
            "reason": list(self.reason),
            "assumptions": list(self.assumptions),
            "night_hint": self.night_hint,
            "notices": list(self.notices),
            "catalog": self.catalog_source,
        }


# ---------------------------------------------------------------- constraints


@dataclass(frozen=True, kw_only=True, slots=True)
class Constraints:
    """The filters of the `skygreen:` section, in a form that can be relaxed one at a time."""

    gpu_names: tuple[str, ...] | None
    min_memory_gb: float | None
    gpu_count: int | None
    """None: any number of GPUs per node (only used when relaxing)."""
    clouds: tuple[str, ...]
    regions: tuple[str, ...] | None
    max_price_per_hour: float | None
    budget_usd: float | None
    spot: bool
    on_demand: bool

    @classmethod
    def from_spec(cls, green: GreenSpec) -> Constraints:
        """The section's filters; with `precision: bf16` and no GPU list, only GPUs with bf16 tensor
        cores. On-demand is allowed when `spot` is off or `on_demand_fallback` is on."""
        names = green.gpus.names
        if names is None and green.precision == "bf16":  # the runtime refuses bf16 on older GPUs
            names = tuple(name for name, info in GPUS.items() if info.bf16)
        return cls(
            gpu_names=names,
            min_memory_gb=green.gpus.min_memory_gb,
            gpu_count=green.gpu_count,
            clouds=green.clouds,
            regions=green.regions,
            max_price_per_hour=green.max_price_per_hour,
            budget_usd=green.budget_usd,
            spot=green.spot,
            on_demand=(not green.spot) or green.on_demand_fallback,
        )

    def admits_offer(self, offer: Offer) -> bool:
        """The filters that need no estimate."""
        if offer.cloud not in self.clouds or offer.accelerator not in GPUS:
            return False
        if self.gpu_names is not None and offer.accelerator not in self.gpu_names:
            return False
        if self.min_memory_gb is not None and GPUS[offer.accelerator].memory_gb < self.min_memory_gb:
            return False
        if self.gpu_count is not None and offer.accelerator_count != self.gpu_count:
            return False
        return self.regions is None or offer.region in self.regions

    def spot_options(self) -> tuple[bool, ...]:
        """The markets to price each offer on: True for spot, False for on-demand, spot first."""
        return tuple(s for s, allowed in ((True, self.spot), (False, self.on_demand)) if allowed)


def run_model(spec: TaskSpec, *, measured_speed: Mapping[str, float] | None = None) -> RunModel:
    """The estimate model for a task: its work, speeds, nodes, preemption and checkpoint settings.

    Speeds: the built-in table, overridden by the task's `speed:`, overridden in turn by
    throughput measured in earlier runs of the task (`measured_speed`) where known.
    """
    green = spec.green
    rates = dict(PREEMPTION_RATE_PER_HOUR)
    rates.update(green.preemption.rate_per_hour)
    restart_min = green.preemption.restart_minutes
    return RunModel(
        work_gpu_hours=green.work.gpu_hours,
        work_on=green.work.gpu,
        speed={**green.speed, **(measured_speed or {})},
        num_nodes=spec.num_nodes,
        preemption_rate_per_hour=rates,
        restart_s=DEFAULT_RESTART_S if restart_min is None else restart_min * 60.0,
        checkpoint_cost_s=DEFAULT_CHECKPOINT_COST_S,
        checkpoint_interval_s=green.checkpoint.every_s,
        power_cap_mode=green.power.mode,
        power_cap_value=green.power.cap_w if green.power.mode == "watts" else green.power.cap_fraction,
        power_eta=DEFAULT_ETA if green.power.eta is None else green.power.eta,
    )


def candidates_for(catalog: Catalog, constraints: Constraints, model: RunModel) -> list[Candidate]:
    """Every offer x (spot, on-demand) that passes the constraints, estimated, unsorted."""
    out = []
    for offer in catalog.offers:
        if not constraints.admits_offer(offer):
            continue
        for spot in constraints.spot_options():
            candidate = make_candidate(offer, spot, model)
            if candidate is None:
                continue
            if (
                constraints.max_price_per_hour is not None
                and candidate.price_usd_per_hour > constraints.max_price_per_hour
            ):
                continue
            if constraints.budget_usd is not None and candidate.est_cost_usd > constraints.budget_usd:
                continue
            out.append(candidate)
    return out


def make_candidate(offer: Offer, spot: bool, model: RunModel) -> Candidate | None:
    """The offer priced for one run, or None when it has no such price or cannot finish."""
    price = offer.price_usd_per_hour(spot)
    if price is None:
        return None
    est = estimate(model, cloud=offer.cloud, gpu=offer.accelerator, gpus_per_node=offer.accelerator_count, spot=spot)
    if est is None:
        return None
    return Candidate(
        cloud=offer.cloud,
        region=offer.region,
        zone=offer.zone(spot),
        instance_type=offer.instance_type,
        accelerator=offer.accelerator,
        accelerator_count=offer.accelerator_count,
        spot=spot,
        price_usd_per_hour=price,
        on_demand_price_usd_per_hour=offer.on_demand_price_usd_per_hour,
        spot_price_usd_per_hour=offer.spot_price_usd_per_hour,
        est_hours=est.est_hours,
        est_cost_usd=price * est.est_hours * model.num_nodes,
        energy_kwh=est.energy_kwh,
        co2e_kg=carbon.co2e_kg(est.energy_kwh, offer.cloud, offer.region),
        num_nodes=model.num_nodes,
        compute_hours=est.compute_hours,
        expected_preemptions=est.expected_preemptions,
        checkpoint_interval_s=est.checkpoint_interval_s,
    )


# ---------------------------------------------------------------- ranking


def sort_key(objective: str) -> Callable[[Candidate], tuple]:
    """Best first: the objective, then cost, then time, then names (a stable, total order)."""
    metric = METRIC[objective]

    def key(c: Candidate) -> tuple:
        return (metric(c), c.est_cost_usd, c.est_hours, c.cloud, c.region, c.instance_type, not c.spot)

    return key


def rank(candidates: Iterable[Candidate], objective: str) -> list[Candidate]:
    """The candidates best first by `sort_key(objective)`; a `KeyError` for an unknown objective."""
    return sorted(candidates, key=sort_key(objective))


def best_per_cloud(ranked: Iterable[Candidate]) -> dict[str, Candidate]:
    """cloud -> its first candidate in `ranked` (so its best, when `ranked` is sorted); clouds with
    no candidate are absent."""
    best: dict[str, Candidate] = {}
    for c in ranked:
        best.setdefault(c.cloud, c)
    return best


def make_plan(spec: TaskSpec, catalog: Catalog, *, measured_speed: Mapping[str, float] | None = None) -> Plan:
    """Rank the catalog's offers for a task; `NoOfferError` says which constraint to relax."""
    green = spec.green
    check_regions(spec, catalog)
    model = run_model(spec, measured_speed=measured_speed)
    constraints = Constraints.from_spec(green)
    candidates = candidates_for(catalog, constraints, model)
    extra: tuple[str, ...] = ()
    if green.deadline is not None:
        from skygreen.deadline import cost as deadline

        kept, dropped = [], {}
        for c in candidates:
            priced = deadline.assess(c, deadline_h=green.deadline, restart_s=model.restart_s)
            if isinstance(priced, tuple):
                dropped[c.label] = priced
                continue
            kept.append(replace(c, est_hours=priced.est_hours, est_cost_usd=priced.est_cost_usd,
                                on_demand_hours=priced.on_demand_hours, deadline_source=priced.source))  # fmt: skip
        if not kept and dropped:
            raise NoOfferError(deadline.no_offer_message(green.deadline, dropped, source=spec.source))
        traced = [f"{c.cloud} {c.accelerator}" for c in kept if c.deadline_source == "traces"]
        candidates, extra = kept, (deadline.assumption(green.deadline, traced, dropped),)
    ranked = rank(candidates, green.objective)
    if not ranked:
        raise NoOfferError(no_offer_message(spec, catalog, constraints, model))
    return Plan(
        candidates=tuple(ranked),
        objective=green.objective,
        best_per_cloud=best_per_cloud(ranked),
        reason=explain(ranked, green.objective),
        assumptions=assumptions(model, green, measured_speed=measured_speed) + extra,
        night_hint=night_hint(ranked[0]),
        notices=(*spec.notices, *work_notice(spec), *catalog.notices),
        catalog_source=catalog.source,
        offers_considered=len(catalog.offers),
    )


def work_notice(spec: TaskSpec) -> tuple[str, ...]:
    """Without `skygreen.work` every estimate is for a default job size: say so, since the
    cost figures otherwise look like figures about the user's job."""
    if spec.work_given:
        return ()
    work = spec.green.work
    notice = (
        f"no skygreen.work in the task: every estimate is for {work.gpu_hours:g} GPU-hour on one {work.gpu}; "
        f"set work: {{gpu_hours: N, gpu: {work.gpu}}} to size your job"
    )
    return (notice,)


def check_regions(spec: TaskSpec, catalog: Catalog) -> None:
    """Unknown region names are a typo far more often than a constraint: say so, with a near miss."""
    green = spec.green
    if green.regions is None:
        return
    known = sorted({r for regions in catalog.regions.values() for r in regions})
    for i, region in enumerate(green.regions):
        if region in known:
            continue
        near = did_you_mean(region, known)
        hint = f"did you mean {near!r}?" if near else "use a region the catalog lists"
        if catalog.embedded:
            hint += " (the embedded price table lists only a few regions; `skygreen catalog update` fetches all)"
        shown = ", ".join(known[:40]) + (", ..." if len(known) > 40 else "")
        raise SpecError(
            f"skygreen.regions[{i}]", f"unknown region {region!r}", allowed=shown, hint=hint, source=spec.source
        )


# ---------------------------------------------------------------- no offer


_RELAXATIONS: tuple[tuple[str, str, Callable[[Constraints], Constraints | None]], ...] = (
    ("skygreen.max_price_per_hour", "max price per hour",
     lambda c: replace(c, max_price_per_hour=None) if c.max_price_per_hour is not None else None),
    ("skygreen.budget_usd", "budget",
     lambda c: replace(c, budget_usd=None) if c.budget_usd is not None else None),
    ("skygreen.regions", "regions",
     lambda c: replace(c, regions=None) if c.regions is not None else None),
    ("skygreen.clouds", "clouds",
     lambda c: replace(c, clouds=CLOUDS) if set(c.clouds) != set(CLOUDS) else None),
    ("skygreen.gpu_count", "GPUs per node",
     lambda c: replace(c, gpu_count=None) if c.gpu_count is not None else None),
    ("skygreen.gpus", "GPU models",
     lambda c: replace(c, gpu_names=None) if c.gpu_names is not None else None),
    ("skygreen.gpus.min_memory_gb", "GPU memory floor",
     lambda c: replace(c, min_memory_gb=None) if c.min_memory_gb is not None else None),
    ("skygreen.spot", "spot only",
     lambda c: replace(c, on_demand=True) if not c.on_demand else (replace(c, spot=True) if not c.spot else None)),
)  # fmt: skip


def no_offer_message(spec: TaskSpec, catalog: Catalog, constraints: Constraints, model: RunModel) -> str:
    """Which single constraint, relaxed, would let offers through, and what the best one is."""
    where = f"{spec.source}: " if spec.source else ""
    lines = [f"{where}no offer in the catalog ({catalog.source}) matches the task's constraints"]
    lines.append(f"  constraints: {describe(constraints)}")
    fixes = []
    for path, _, relax in _RELAXATIONS:
        relaxed = relax(constraints)
        if relaxed is None:
            continue
        found = rank(candidates_for(catalog, relaxed, model), spec.green.objective)
        if found:
            fixes.append(
                f"relax {path} ({_current(path, constraints)}): then the best offer is {found[0].label}, "
                f"{money(found[0].price_usd_per_hour)}/h, est. {money(found[0].est_cost_usd)} for the run"
            )
    if fixes:
        lines.append("  fix: " + fixes[0])
        lines.extend("   or: " + f for f in fixes[1:])
    else:
        lines.append(
            "  fix: no single constraint relaxed alone finds an offer; loosen several of the above"
            + (" or run `skygreen catalog update` (the embedded price table is small)" if catalog.embedded else "")
        )
    return "\n".join(lines)


def _current(path: str, c: Constraints) -> str:
    value = {
        "skygreen.max_price_per_hour": c.max_price_per_hour,
        "skygreen.budget_usd": c.budget_usd,
        "skygreen.regions": list(c.regions or ()),
        "skygreen.clouds": list(c.clouds),
        "skygreen.gpu_count": c.gpu_count,
        "skygreen.gpus": list(c.gpu_names or ()),
        "skygreen.gpus.min_memory_gb": c.min_memory_gb,
        "skygreen.spot": "spot only" if not c.on_demand else "on-demand only",
    }[path]
    return f"now {value}"


def describe(c: Constraints) -> str:
    """The constraints on one line, for the no-offer message. GPUs, gpu_count, clouds and the market
    are always shown; min_memory_gb, regions, max_price_per_hour and budget_usd only when set."""
    parts = [f"gpus {list(c.gpu_names) if c.gpu_names else 'any'}"]
    if c.min_memory_gb is not None:
        parts.append(f"min_memory_gb {c.min_memory_gb:g}")
    parts.append(f"gpu_count {c.gpu_count}")
    parts.append(f"clouds {list(c.clouds)}")
    if c.regions is not None:
        parts.append(f"regions {list(c.regions)}")
    if c.max_price_per_hour is not None:
        parts.append(f"max_price_per_hour {c.max_price_per_hour:g}")
    if c.budget_usd is not None:
        parts.append(f"budget_usd {c.budget_usd:g}")
    parts.append("spot and on-demand" if c.spot and c.on_demand else ("spot only" if c.spot else "on-demand only"))
    return ", ".join(parts)
