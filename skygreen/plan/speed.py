"""How fast a run goes on an offer's GPUs and links: each step's compute against its
communication (`skygreen.memory.step`), charged against the offer's interconnect
(`skygreen.memory.interconnect`), instead of a fixed loss per doubling of GPUs.

Speeds the task gives (`speed:`) or that earlier runs measured win: a GPU with one keeps it as it
was, since a measured throughput already carries the communication of the runs that measured it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from skygreen.gpus import GPUS
from skygreen.memory.interconnect import interconnect
from skygreen.memory.method import trainable_params
from skygreen.memory.step import StepTime, step_time
from skygreen.plan.candidate import Candidate
from skygreen.plan.catalog import Offer
from skygreen.task.spec import ModelSpec


def offer_step(
    model: ModelSpec,
    offer: Offer,
    *,
    nodes: int,
    effective_batch: int | None,
    known_speed: Mapping[str, float],
) -> StepTime | None:
    """One optimizer step of `model` on `nodes` nodes of the offer; None when the GPU's speed is
    given or measured (that speed stands) or the GPU is unknown."""
    gpu = offer.accelerator
    if gpu in known_speed or gpu not in GPUS:
        return None
    total = offer.accelerator_count * nodes
    per_step = model.micro_batch * total
    accumulation = max(1, math.ceil(effective_batch / per_step)) if effective_batch else 1
    return step_time(
        params=model.params,
        trainable=trainable_params(model.shape, model.params, model.method),
        method=model.method,
        sharded=model.sharding == "fsdp",
        tokens_per_micro_batch=model.seq_len * model.micro_batch,
        accumulation=accumulation,
        checkpointing=model.activation_checkpointing,
        relative_speed=GPUS[gpu].relative_speed,
        gpus_per_node=offer.accelerator_count,
        nodes=nodes,
        link=interconnect(offer.instance_type),
    )


def step_json(step: StepTime | None) -> dict[str, float] | None:
    """The `step` record of a candidate in `plan --json`: seconds per optimizer step and the
    fraction of it spent training."""
    if step is None:
        return None
    return {
        "compute_s": round(step.compute_s, 4),
        "communication_s": round(step.communication_s, 4),
        "exposed_communication_s": round(step.exposed_s, 4),
        "efficiency": round(step.efficiency, 4),
    }


def communication_notice(candidates: Iterable[Candidate]) -> tuple[str, ...]:
    """One line naming the offers whose GPUs would spend more time communicating than computing."""
    bound: dict[tuple[str, int], str] = {}
    for c in candidates:
        step = c.step
        if step and step["communication_s"] > step["compute_s"]:
            link = interconnect(c.instance_type)
            nodes = f" x{c.num_nodes} nodes" if c.num_nodes > 1 else ""
            where = f"{link.network_gbit_per_s:g} Gb/s {link.network}" if c.num_nodes > 1 else link.intra_node_link
            bound.setdefault(
                (c.instance_type, c.num_nodes),
                f"{c.accelerator}x{c.accelerator_count}{nodes} ({c.instance_type}, {where}: "
                f"{step['communication_s']:.3g} s communicating per {step['compute_s']:.3g} s of compute)",
            )
    if not bound:
        return ()
    shown = list(bound.values())
    more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
    return ("spend more time communicating than computing, so they rank by their slower step: "
            + "; ".join(shown[:3]) + more,)  # fmt: skip
