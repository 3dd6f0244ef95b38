"""Rank GPU offers by what the whole run will cost, not by price per hour.

A pure function of plain records: the task's `skygreen:` section, a `Catalog` of offers and
the estimate model (`skygreen.cost`). Every offer that meets the constraints becomes a
`Candidate` with its estimated hours, cost, energy and CO2e; candidates are sorted by the
objective (cost, time, energy or carbon; ties broken by cost, then by name so the order is
stable). When nothing matches, the constraints are relaxed one at a time to say which one to
loosen, and by how much.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from skygreen.bill.bucket import BucketPlace
from skygreen.bill.bucket_places import SetPlaces, plan_buckets
from skygreen.checkpoint.interval import PREEMPTION_RATE_PER_HOUR
from skygreen.errors import NoOfferError, SpecError, did_you_mean
from skygreen.memory.estimate import MemoryEstimate
from skygreen.memory.step import StepTime
from skygreen.plan import carbon
from skygreen.plan.candidate import Candidate, Plan, with_compute
from skygreen.plan.catalog import CLOUDS, Catalog, Offer
from skygreen.plan.constraints import Constraints
from skygreen.plan.cost import (
    DEFAULT_CHECKPOINT_COST_S,
    DEFAULT_RESTART_S,
    DEFAULT_TRANSFER_GB_PER_S,
    RunModel,
)
from skygreen.plan.data_cost import price_offer
from skygreen.plan.explain import METRIC, assumptions, explain, money, night_hint
from skygreen.plan.fit import describe_model, fit_notice, fitted_shape, memory_notice, smallest_fit, task_nodes
from skygreen.plan.memory import checkpoint_gb
from skygreen.plan.set_copies import with_copies
from skygreen.plan.speed import communication_notice, offer_step, step_json
from skygreen.power.policy import DEFAULT_ETA
from skygreen.task.spec import TaskSpec


def run_model(
    spec: TaskSpec,
    *,
    measured_speed: Mapping[str, float] | None = None,
    measured_transfer_gb_per_s: float | None = None,
    measured_changeover_s: Mapping[str, float] | None = None,
    measured_checkpoint_gb: float | None = None,
    bucket: BucketPlace | None = None,
    bucket_set: SetPlaces | None = None,
) -> RunModel:
    """The estimate model for a task: its work, speeds, nodes, preemption and checkpoint settings.

    Speeds: the built-in table, overridden by the task's `speed:`, overridden in turn by
    throughput measured in earlier runs of the task (`measured_speed`) where known. With a
    `model`, the checkpoint's size and the bucket's transfer rate per node (measured, else
    `DEFAULT_TRANSFER_GB_PER_S`) set the save and restore times. Changeovers measured by
    earlier runs ("cloud/GPU" or "cloud" -> seconds) replace the flat restart where known.
    With the bucket's place (`bucket`) each offer's bill counts the bytes its checkpoints move.
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
        checkpoint_gb=_checkpoint_gb(spec, measured_checkpoint_gb),
        checkpoint_sharded=green.model is not None and green.model.sharding == "fsdp",
        upload_gb_per_s=measured_transfer_gb_per_s or DEFAULT_TRANSFER_GB_PER_S,
        download_gb_per_s=measured_transfer_gb_per_s or DEFAULT_TRANSFER_GB_PER_S,
        measured_changeover_s=dict(measured_changeover_s or {}),
        bucket=None if bucket is None else bucket.place,
        bucket_set=bucket_set,
        keep=green.checkpoint.keep,
    )


def _checkpoint_gb(spec: TaskSpec, measured_gb: float | None) -> float | None:
    """The size earlier runs of the task committed (a LoRA adapter's, say) where known, else the
    estimate from the model's size; None without either."""
    if measured_gb is not None:
        return measured_gb
    green = spec.green
    return None if green.model is None else checkpoint_gb(green.model, half_precision=green.checkpoint.half_precision)


def candidates_for(catalog: Catalog, constraints: Constraints, model: RunModel) -> list[Candidate]:
    """Every offer x (spot, on-demand) that passes the constraints, estimated, unsorted."""
    out = []
    for offer in catalog.offers:
        if not constraints.admits_offer(offer):
            continue
        shape = (model.num_nodes, None) if constraints.model is None else fitted_shape(constraints, offer)
        if shape is None:
            continue
        nodes, memory = shape
        shaped = model if nodes == model.num_nodes else replace(model, num_nodes=nodes)
        step = None
        if constraints.model is not None:
            step = offer_step(constraints.model, offer, nodes=nodes, effective_batch=constraints.effective_batch,
                              known_speed=model.speed)  # fmt: skip
        for spot in constraints.spot_options():
            candidate = make_candidate(offer, spot, shaped, memory=memory, step=step)
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


def make_candidate(
    offer: Offer,
    spot: bool,
    model: RunModel,
    *,
    memory: MemoryEstimate | None = None,
    step: StepTime | None = None,
) -> Candidate | None:
    """The offer priced for one run on `model.num_nodes` nodes, or None when it has no such price
    or cannot finish; with the model's memory per GPU and its step's communication where known."""
    price = offer.price_usd_per_hour(spot)
    if price is None:
        return None
    priced = price_offer(
        model,
        cloud=offer.cloud,
        region=offer.region,
        gpu=offer.accelerator,
        gpus_per_node=offer.accelerator_count,
        spot=spot,
        price_usd_per_hour=price,
        efficiency=None if step is None else step.efficiency,
    )
    if priced is None:
        return None
    est = priced.estimate
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
        est_cost_usd=priced.bill.total,
        energy_kwh=est.energy_kwh,
        co2e_kg=carbon.co2e_kg(est.energy_kwh, offer.cloud, offer.region),
        num_nodes=model.num_nodes,
        compute_hours=est.compute_hours,
        expected_preemptions=est.expected_preemptions,
        checkpoint_interval_s=est.checkpoint_interval_s,
        memory_per_gpu_gb=None if memory is None else memory.as_dict()["high"],
        memory_gb_per_gpu=None if memory is None else memory.as_dict(),
        step=step_json(step),
        restart_s=est.restart_s,
        checkpoint_save_s=est.checkpoint_save_s,
        cost_usd=priced.bill.to_json(),
        bytes_moved_gb=0.0 if priced.traffic is None else priced.traffic.moved_gb,
        checkpoint_save_usd=priced.save_usd,
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


def make_plan(
    spec: TaskSpec,
    catalog: Catalog,
    *,
    measured_speed: Mapping[str, float] | None = None,
    measured_transfer_gb_per_s: float | None = None,
    measured_changeover_s: Mapping[str, float] | None = None,
    measured_checkpoint_gb: float | None = None,
    bucket_region: str | Mapping[str, str | None] | None = None,
) -> Plan:
    """Rank the catalog's offers for a task; `NoOfferError` says which constraint to relax.
    `bucket_region` is the region the checkpoint bucket reports, where it could be read."""
    green = spec.green
    check_regions(spec, catalog)
    bucket, places = plan_buckets(
        green.checkpoint.bucket, stated_region=green.checkpoint.region, read=bucket_region, source=spec.source
    )
    model = run_model(
        spec,
        measured_speed=measured_speed,
        measured_transfer_gb_per_s=measured_transfer_gb_per_s,
        measured_changeover_s=measured_changeover_s,
        measured_checkpoint_gb=measured_checkpoint_gb,
        bucket=bucket,
        bucket_set=places,
    )
    constraints = Constraints.from_spec(green, num_nodes=task_nodes(spec))
    candidates = candidates_for(catalog, constraints, model)
    extra: tuple[str, ...] = ()
    if green.deadline is not None:
        from skygreen.deadline import cost as deadline

        kept, dropped = [], {}
        for c in candidates:
            priced = deadline.assess(c, deadline_h=green.deadline, restart_s=c.restart_s)
            if isinstance(priced, tuple):
                dropped[c.label] = priced
                continue
            kept.append(with_compute(c, priced.est_cost_usd, est_hours=priced.est_hours,
                                     on_demand_hours=priced.on_demand_hours, deadline_source=priced.source))  # fmt: skip
        if not kept and dropped:
            raise NoOfferError(deadline.no_offer_message(green.deadline, dropped, source=spec.source))
        traced = [f"{c.cloud} {c.accelerator}" for c in kept if c.deadline_source == "traces"]
        candidates, extra = kept, (deadline.assumption(green.deadline, traced, dropped),)
    ranked = rank(candidates, green.objective)
    if not ranked:
        raise NoOfferError(no_offer_message(spec, catalog, constraints, model))
    if places is not None and model.checkpoint_gb is not None:
        copied = with_copies(ranked, places, model, limit=green.max_candidates, strategy=green.recovery.strategy)
        ranked = rank(copied, green.objective)
    return Plan(
        candidates=tuple(ranked),
        objective=green.objective,
        best_per_cloud=best_per_cloud(ranked),
        reason=explain(ranked, green.objective),
        assumptions=assumptions(model, green, measured_speed=measured_speed, best=ranked[0]) + extra,
        night_hint=night_hint(ranked[0]),
        notices=(
            *spec.notices,
            *work_notice(spec),
            *data_notice(spec, bucket, places),
            *memory_notice(catalog, constraints),
            *fit_notice(catalog, constraints, ranked[0]),
            *communication_notice(ranked),
            *catalog.notices,
        ),
        catalog_source=catalog.source,
        offers_considered=len(catalog.offers),
    )


def data_notice(spec: TaskSpec, bucket: BucketPlace | None, places: SetPlaces | None = None) -> tuple[str, ...]:
    """What the data bill could not know: an assumed bucket region, or no checkpoint size."""
    if bucket is None:
        return ()
    note = bucket.note if places is None else places.note
    notes = [note] if note else []
    if spec.green.model is None:
        notes.append(
            "no skygreen.model: the checkpoint's size is unknown, so transfer, storage and requests are not "
            "counted; set model: {params: N} to price the bytes each save moves"
        )
    return tuple(notes)


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
    if constraints.model is not None:
        lines.append(f"  model: {describe_model(constraints)}; {smallest_fit(catalog, constraints)}")
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
