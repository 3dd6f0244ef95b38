"""Fitting the task's model onto offers: how many nodes of an offer hold it and what each GPU
then holds, which offers could not, the smallest one that can, and the model's size on one line
(`skygreen.plan.rank` ranks the shapes and puts the words in notices and in the no-offer message;
the arithmetic is `skygreen.plan.memory`'s)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from skygreen.gpus import GPUS
from skygreen.plan.catalog import CLOUDS, Catalog, Offer
from skygreen.plan.memory import memory_need, smallest_nodes

if TYPE_CHECKING:
    from skygreen.plan.constraints import Constraints
    from skygreen.spec import TaskSpec


def task_nodes(spec: TaskSpec) -> int | None:
    """The task's own `num_nodes`, or None when it leaves the count to the plan."""
    return spec.num_nodes if "num_nodes" in spec.sky else None


def fitted_shape(constraints: Constraints, offer: Offer) -> tuple[int, float] | None:
    """(nodes, GB per GPU) of a run with the task's model on the offer: on the task's own
    `num_nodes`, or on the fewest nodes that hold the model; None when its GPUs cannot hold it
    or its ranks do not split the effective batch evenly."""
    model = constraints.model
    if model is None:
        raise ValueError("fitted_shape needs constraints with a model")
    memory_gb = GPUS[offer.accelerator].memory_gb
    per_node = offer.accelerator_count
    nodes = constraints.fixed_nodes or smallest_nodes(
        model, precision=constraints.precision, gpu_memory_gb=memory_gb, gpus_per_node=per_node
    )
    if nodes is None:
        return None
    need = memory_need(model, precision=constraints.precision, total_gpus=per_node * nodes)
    if not need.fits(memory_gb):
        return None
    batch = constraints.effective_batch
    if batch is not None and batch % (per_node * nodes):
        return None
    return nodes, need.per_gpu_gb


def memory_notice(catalog: Catalog, constraints: Constraints) -> tuple[str, ...]:
    """With a model: how many offers the plan dropped because their GPUs cannot hold it, and the
    smallest offer that can (fewest GPU-gigabytes in all)."""
    if constraints.model is None:
        return ()
    dropped = [o for o in catalog.offers if constraints.admits_offer(o) and fitted_shape(constraints, o) is None]
    if not dropped:
        return ()
    why = "cannot hold the model" + (" or split the effective batch" if constraints.effective_batch else "")
    return (f"dropped {len(dropped)} offers that {why}; {smallest_fit(catalog, constraints)}",)


def smallest_fit(catalog: Catalog, constraints: Constraints) -> str:
    """The offer shape with the least GPU memory in all that holds the model, in words, looked
    for in the whole catalog (any GPU, count, cloud or region)."""
    model = constraints.model
    if model is None:
        return ""
    anywhere = replace(constraints, gpu_names=None, min_memory_gb=None, gpu_count=None, clouds=CLOUDS, regions=None)
    best: tuple[float, str] | None = None
    for offer in catalog.offers:
        if offer.accelerator not in GPUS or offer.cloud not in CLOUDS:
            continue
        shape = fitted_shape(anywhere, offer)
        if shape is None:
            continue
        nodes, per_gpu_gb = shape
        total_gb = GPUS[offer.accelerator].memory_gb * offer.accelerator_count * nodes
        on_nodes = f" x{nodes} nodes" if nodes > 1 else ""
        text = (
            f"the smallest that holds it is {offer.accelerator}x{offer.accelerator_count}{on_nodes} "
            f"({per_gpu_gb:.3g} GB per GPU of {GPUS[offer.accelerator].memory_gb:g} GB, e.g. {offer.cloud} {offer.instance_type})"
        )
        if best is None or (total_gb, text) < best:
            best = (total_gb, text)
    if best is None:
        return f"no offer in the catalog holds it on up to {model.max_nodes} nodes (raise skygreen.model.max_nodes)"
    return best[1]


def describe_model(c: Constraints) -> str:
    """The model's memory on one line: parameters, sharding and what one GPU of one node needs."""
    model = c.model
    if model is None:
        return "none"
    one = memory_need(model, precision=c.precision, total_gpus=1)
    return (
        f"{model.params:.3g} parameters under {model.sharding.upper()}, "
        f"{one.state_gb:.3g} GB of weights, gradients and AdamW states in all"
        + (f" + {model.activation_gb:g} GB of activations per GPU" if model.activation_gb else "")
    )
