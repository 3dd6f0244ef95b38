"""Fitting the task's model onto offers: how many nodes of an offer hold it and what each GPU
then holds, which offers could not, the smallest one that can, and the model's size on one line
(`skygreen.plan.rank` ranks the shapes and puts the words in notices and in the no-offer message;
the arithmetic is `skygreen.plan.memory`'s)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from skygreen.gpus import GPUS
from skygreen.memory.estimate import MemoryEstimate
from skygreen.plan.catalog import CLOUDS, Catalog, Offer
from skygreen.plan.memory import fits, memory_need, smallest_nodes

if TYPE_CHECKING:
    from skygreen.plan.candidate import Candidate
    from skygreen.plan.constraints import Constraints
    from skygreen.task.spec import TaskSpec


def task_nodes(spec: TaskSpec) -> int | None:
    """The task's own `num_nodes`, or None when it leaves the count to the plan."""
    return spec.num_nodes if "num_nodes" in spec.sky else None


def fitted_shape(constraints: Constraints, offer: Offer) -> tuple[int, MemoryEstimate] | None:
    """(nodes, each GPU's memory) of a run with the task's model on the offer: on the task's own
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
    if not fits(need, memory_gb):
        return None
    batch = constraints.effective_batch
    if batch is not None and batch % (per_node * nodes):
        return None
    return nodes, need


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
        nodes, need = shape
        total_gb = GPUS[offer.accelerator].memory_gb * offer.accelerator_count * nodes
        on_nodes = f" x{nodes} nodes" if nodes > 1 else ""
        text = (
            f"the smallest that holds it is {offer.accelerator}x{offer.accelerator_count}{on_nodes} "
            f"({need.high:.3g} GB per GPU of {GPUS[offer.accelerator].memory_gb:g} GB, e.g. {offer.cloud} {offer.instance_type})"
            + _how_to_allow(constraints, offer)
        )
        if best is None or (total_gb, text) < best:
            best = (total_gb, text)
    if best is None:
        return f"no offer in the catalog holds it on up to {model.max_nodes} nodes (raise skygreen.model.max_nodes)"
    return best[1]


def _how_to_allow(constraints: Constraints, offer: Offer) -> str:
    """What to change in the task so that `offer` passes: its GPU in `gpus`, its count in `gpu_count`."""
    steps = []
    if constraints.gpu_names is not None and offer.accelerator not in constraints.gpu_names:
        steps.append(f"add {offer.accelerator} to skygreen.gpus")
    if constraints.gpu_count is not None and constraints.gpu_count != offer.accelerator_count:
        steps.append(f"set skygreen.gpu_count: {offer.accelerator_count}")
    if constraints.min_memory_gb is not None and GPUS[offer.accelerator].memory_gb < constraints.min_memory_gb:
        steps.append(f"lower skygreen.gpus.min_memory_gb to {GPUS[offer.accelerator].memory_gb:g}")
    return f"; to allow it, {' and '.join(steps)}" if steps else ""


def describe_model(c: Constraints) -> str:
    """The model's memory on one line: parameters, sharding and what one GPU of one node needs."""
    model = c.model
    if model is None:
        return "none"
    one = memory_need(model, precision=c.precision, total_gpus=1)
    return (
        f"{model.params:.3g} parameters, {model.method.kind} with {model.method.optimizer} under "
        f"{model.sharding.upper()}, {one.states:.3g} GB of weights, gradients and optimizer states in all; "
        f"on one GPU {one.low:.3g}-{one.high:.3g} GB"
    )


def fit_notice(catalog: Catalog, constraints: Constraints, best: Candidate | None) -> tuple[str, ...]:
    """The model's memory per GPU by term, the largest of the task's GPUs it does not fit and the
    smallest it fits (on one node of the task's GPU count, or one GPU), and the headroom the best
    offer keeps above the estimate's high end."""
    model = constraints.model
    if model is None:
        return ()
    count = constraints.gpu_count or 1
    need = memory_need(model, precision=constraints.precision, total_gpus=count)
    names = constraints.gpu_names or tuple(sorted({o.accelerator for o in catalog.offers if o.accelerator in GPUS}))
    sizes = sorted({(GPUS[n].memory_gb, n) for n in names if n in GPUS})
    too_small = [f"{n} ({gb:g} GB)" for gb, n in sizes if not fits(need, gb)]
    enough = [f"{n} ({gb:g} GB)" for gb, n in sizes if fits(need, gb)]
    on = f"{count} GPUs" if count > 1 else "one GPU"
    terms = (
        f"states {need.states:.3g}, activations {need.activations:.3g}, logits {need.logits:.3g}, "
        f"overhead {need.overhead:.3g}"
    )
    parts = [f"memory per GPU on {on}: {need.low:.3g}-{need.high:.3g} GB ({terms}); fitted on the high end"]
    if too_small:
        parts.append(f"among the task's GPUs it does not fit {too_small[-1]}")
    parts.append(f"the smallest it fits is {enough[0]}" if enough else f"it fits none of them on {on}")
    if best is not None and best.memory_per_gpu_gb is not None:
        gb = GPUS[best.accelerator].memory_gb
        parts.append(
            f"the best offer ({best.accelerator}x{best.accelerator_count}) keeps "
            f"{gb - best.memory_per_gpu_gb:.3g} GB of its {gb:g} GB free above the high end"
        )
    return ("; ".join(parts),)
