"""The plan's words: each objective's value, why the winner won, what a night start would
save, and the assumptions under every estimate (`skygreen.plan.rank` puts them in the `Plan`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from skygreen.figures import amount, duration_h, usd, usd_per_hour
from skygreen.plan.cost import RunModel
from skygreen.task.spec import GreenSpec

if TYPE_CHECKING:
    from skygreen.plan.candidate import Candidate

METRIC: dict[str, Callable[[Candidate], float]] = {
    "cost": lambda c: c.est_cost_usd,
    "time": lambda c: c.est_hours,
    "energy": lambda c: c.energy_kwh,
    "carbon": lambda c: c.co2e_kg,
}


def objective_value(candidate: Candidate, objective: str) -> float:
    """The candidate's figure for the objective, lower is better: USD for cost, wall hours for time,
    kWh for energy, kg CO2e for carbon."""
    return METRIC[objective](candidate)


def money(value_usd: float) -> str:
    """Dollars as the plan prints them: significant digits, never `$0.00` for a small job."""
    return f"${usd(value_usd)}"


def _metric_text(c: Candidate, objective: str) -> str:
    split = f" (compute {money(c.compute_usd)} + data {money(c.data_usd)})" if c.data_usd > 0 else ""
    return {
        "cost": f"{money(c.est_cost_usd)}{split} in {duration_h(c.est_hours)}",
        "time": f"{duration_h(c.est_hours)} for {money(c.est_cost_usd)}",
        "energy": f"{amount(c.energy_kwh)} kWh for {money(c.est_cost_usd)}",
        "carbon": f"{amount(c.co2e_kg)} kg CO2e for {money(c.est_cost_usd)}",
    }[objective]


def explain(ranked: list[Candidate], objective: str) -> tuple[str, ...]:
    """Why the winner won: against the runner-up on another GPU or cloud, and against the
    offer with the lowest price per hour when that is a different one."""
    best = ranked[0]
    noun = {
        "cost": "estimated run cost",
        "time": "estimated time",
        "energy": "estimated energy",
        "carbon": "estimated CO2e",
    }[objective]
    lines = [f"{best.label} has the lowest {noun}: {_metric_text(best, objective)}."]
    rival = next((c for c in ranked[1:] if (c.cloud, c.accelerator) != (best.cloud, best.accelerator)), None)
    cheapest_hour = min(ranked, key=lambda c: (c.price_usd_per_hour * c.num_nodes, c.est_cost_usd))
    if cheapest_hour is not best and cheapest_hour.price_usd_per_hour < best.price_usd_per_hour:
        lines.append(
            f"The lowest price per hour, {cheapest_hour.label} at ${usd_per_hour(cheapest_hour.price_usd_per_hour)}/h, "
            f"would take {duration_h(cheapest_hour.est_hours)} and cost {money(cheapest_hour.est_cost_usd)}."
        )
    elif rival is not None:
        b, r = objective_value(best, objective), objective_value(rival, objective)
        more = f" (+{(r / b - 1) * 100:.0f}%)" if b > 0 else ""
        lines.append(f"Next best on another GPU or cloud: {rival.label}, {_metric_text(rival, objective)}{more}.")
    if (
        best.spot
        and best.on_demand_price_usd_per_hour is not None
        and best.price_usd_per_hour >= best.on_demand_price_usd_per_hour
    ):
        lines.append(
            "Its spot price is not below its on-demand price; `on_demand_fallback: true` lets on-demand compete."
        )
    return tuple(lines)


NIGHT_SAVING_RANGE = (0.10, 0.33)
"""Energy saved by running at night or in winter (lower cooling load): the MIT Lincoln Lab
study (arXiv 2205.09646, seed 004). A range from one site, not a per-region forecast."""


def night_hint(best: Candidate) -> str:
    """The plan's line on a night start in the winner's region: `NIGHT_SAVING_RANGE` of its
    estimated energy, in kWh. Given for every plan; the range is one study's, not the region's."""
    low, high = NIGHT_SAVING_RANGE
    kwh = f"{amount(low * best.energy_kwh)}-{amount(high * best.energy_kwh)}"  # never 0.000 for a small job
    return (
        f"Can it wait? Started at night in {best.region} it would use {low:.0%}-{high:.0%} less energy "
        f"(~{kwh} kWh; night and winter runs, arXiv 2205.09646)."
    )


def _cap_assumption(green: GreenSpec) -> str:
    power = green.power
    if power.mode == "off":
        return "cap off: 1.0"
    if power.mode == "auto":
        return "cap auto: about 0.84, the limit auto keeps on skygreen.power.model"
    cap = f"{power.cap_w:g} W" if power.mode == "watts" else f"{power.cap_fraction:g} of the default limit"
    return f"cap {cap}: skygreen.power.model, from 0.863 at 0.6 of a V100's limit, arXiv 2205.09646"


def _restart_assumption(model: RunModel) -> str:
    """The restart: the flat default, or provisioning plus the changeovers earlier runs measured."""
    from skygreen.plan.cost import PROVISION_S

    if not model.measured_changeover_s:
        return f"restart {model.restart_s / 60:g} min (no changeover measured yet)"
    measured = ", ".join(f"{where} {s / 60:.3g} min" for where, s in sorted(model.measured_changeover_s.items()))
    return (
        f"restart {PROVISION_S / 60:g} min provisioning (Can't Be Late, NSDI'24) + the changeover measured by earlier "
        f"runs of this task ({measured}; elsewhere {model.restart_s / 60:g} min)"
    )


def _model_assumption(model: RunModel, green: GreenSpec, best: Candidate) -> str:
    """The memory and checkpoint line of a task with `skygreen.model`, with the winner's figures."""
    from skygreen.plan.cost import DEFAULT_TRANSFER_GB_PER_S, HOST_COPY_GB_PER_S

    spec = green.model
    if spec is None:
        return ""
    where = "sharded over every GPU (FSDP, ZeRO stage 3)" if spec.sharding == "fsdp" else "whole on every GPU (DDP)"
    rate = (
        "the default" if model.upload_gb_per_s == DEFAULT_TRANSFER_GB_PER_S else "measured by earlier runs of this task"
    )
    memory = f"{best.memory_per_gpu_gb:.3g} GB per GPU on the best offer" if best.memory_per_gpu_gb is not None else ""
    method = spec.method
    trained = (
        "full fine-tune"
        if method.kind == "full"
        else f"{method.kind} r={method.lora_r} on {', '.join(method.lora_targets)}"
    )
    return (
        f"model: {spec.params:.3g} parameters, {trained}, {method.optimizer} in {green.precision} precision, "
        f"states {where} (skygreen.memory: ZeRO arXiv 1910.02054, Korthikanti arXiv 2205.05198, QLoRA arXiv 2305.14314)"
        + ("" if spec.shape else " (no shape: activations only as activation_gb gives them, no logits)")
        + f"; {memory} ({best.accelerator}x{best.accelerator_count}"
        + (f" x{best.num_nodes} nodes" if best.num_nodes > 1 else "")
        + f"), the high end of the estimate fits the GPU's nominal memory; up to {spec.max_nodes} nodes; "
        f"checkpoint {model.checkpoint_gb or 0:.3g} GB at {model.upload_gb_per_s:g} GB/s per node ({rate}): "
        f"{best.checkpoint_save_s:.3g} s blocking per save (host copy at {HOST_COPY_GB_PER_S:g} GB/s per GPU), "
        f"restart {best.restart_s / 60:.3g} min with the restore"
    )


def assumptions(
    model: RunModel,
    green: GreenSpec,
    *,
    measured_speed: Mapping[str, float] | None = None,
    best: Candidate | None = None,
) -> tuple[str, ...]:
    """The lines under every estimate: the work and where the speeds came from; preemption
    rates, restart time and checkpoint interval; the energy and carbon model with the power cap;
    with `skygreen.model` (and the winner `best`), its memory per GPU and checkpoint size."""
    rates = ", ".join(f"{c} {r:g}/h" for c, r in sorted(model.preemption_rate_per_hour.items()))
    if model.checkpoint_interval_s is not None:
        interval = f"every {model.checkpoint_interval_s:g} s"
    elif green.checkpoint.every_steps is not None:
        interval = f"every {green.checkpoint.every_steps} steps (estimated as Daly's optimum: step time unknown)"
    elif model.bucket is not None and model.checkpoint_gb is not None:
        interval = (
            "auto (the least expected total cost: a save's stall and dollars against the work a preemption loses)"
        )
    else:
        interval = "auto (Daly's optimum)"
    if green.trainer == "folder":  # `checkpoint.every` is refused there: the script saves when it saves
        interval = f"on the script's own cadence, estimated as {interval}"
    measured = ", ".join(f"{gpu} {v:.3g}" for gpu, v in sorted((measured_speed or {}).items()))
    return (
        (
            (
                f"work: {model.work_gpu_hours:g} GPU-hours on {model.work_on}; relative speeds from skygreen.gpus (the shipped prior)"
                + (" with the task's overrides" if green.speed else "")
                + (f"; measured by earlier runs of this task: {measured}" if measured else "; none measured yet")
            ),
            (
                f"spot preemptions per node-hour: {rates}; {_restart_assumption(model)}; "
                f"checkpoint {interval}, "
                + (
                    f"{model.checkpoint_cost_s:g} s blocking per save"
                    if model.checkpoint_gb is None
                    else "save and restore times from the checkpoint's size (model line)"
                )
            ),
            (
                f"energy: TDP x 0.8 x PUE x the power cap's ratio ({_cap_assumption(green)}); "
                "carbon: grid g CO2e/kWh per region (codecarbon data)"
            ),
        )
        + ((_model_assumption(model, green, best),) if green.model is not None and best is not None else ())
        + ((_data_assumption(model, green, best),) if model.bucket is not None and best is not None else ())
    )


def _data_assumption(model: RunModel, green: GreenSpec, best: Candidate) -> str:
    """The data bill's line: where the bucket is, what the best offer's saves move and cost."""
    bucket = model.bucket
    if bucket is None:
        return ""
    where = f"data: bucket {green.checkpoint.bucket} in {bucket.label}"
    if model.bucket_set is not None:
        where = (
            f"data: a bucket per place ({', '.join(f'{m.key}: {p.place.label}' for m, p in model.bucket_set.buckets)}), "
            "each offer priced against its nearest, plus one copy of the checkpoint per expected move "
            "(its expected preemptions x the share of the launch's places another bucket serves)"
        )
    if model.checkpoint_gb is None:
        return f"{where}; checkpoint size unknown (no skygreen.model): transfer, storage and requests not counted"
    interval = (
        f"every {duration_h(best.checkpoint_interval_s / 3600)}"
        if best.checkpoint_interval_s
        else "never (no preemptions)"
    )
    return (
        f"{where}; the best offer saves {interval}, {money(best.checkpoint_save_usd)} a save in transfer and requests, "
        f"{amount(best.bytes_moved_gb)} GB moved in all; rates from skygreen/bill/data (list prices with their sources; "
        "egress tiers are monthly and account-wide, so an estimate), storage for the kept checkpoints over the run only"
    )
