"""What a checkpoint of a `Run` holds, and how it goes back into the run.

The shared state every rank agrees on: model, optimizer, scheduler, GradScaler, progress,
early-stopping state, batch shape, counters, the power profile and the user's extra objects. Each rank's RNG is
saved apart, as its own blob (see `skygreen.runtime.checkpointer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skygreen.runtime.run import Run


def training_state(run: Run) -> dict[str, Any]:
    """The shared state of `run` at its current step boundary (an FSDP model's is sharded)."""
    if run.sharded:  # keyed by parameter name, sharded DTensors: the sharded checkpointer reshards them
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(run.module, run.optimizer)
    else:
        model, optimizer = run.module.state_dict(), run.optimizer.state_dict()
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": run.scheduler.state_dict() if run.scheduler is not None else None,
        "scaler": run.scaler.state_dict(),
        "progress": {"step": run.step_index, "samples_seen": run.samples_seen},
        "early_stop": run.stopper.state_dict() if run.stopper is not None else None,
        "batch": {
            "effective": run.effective_batch,
            "micro": run.micro_batch,
            "micro_auto": run.micro_auto,
            "device_name": run.facts.name,
        },
        "counters": dict(run.counters),
        "power": run.power.state_dict(),
        "extra": {name: obj.state_dict() for name, obj in run.extra_state.items()},
    }


def load_training_state(run: Run, state: Mapping[str, Any]) -> None:
    """Put a checkpoint's shared state back into `run` (the batch shape is the run's to decide)."""
    if run.sharded:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(run.module, run.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        run.module.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
    if run.scheduler is not None and state.get("scheduler") is not None:
        run.scheduler.load_state_dict(state["scheduler"])
    if run.precision.grad_scaler and state["scaler"]:
        run.scaler.load_state_dict(state["scaler"])
    run.step_index = int(state["progress"]["step"])
    run.samples_seen = int(state["progress"]["samples_seen"])
    if run.stopper is not None and state.get("early_stop") is not None:
        run.stopper.load_state_dict(state["early_stop"])
    for name, obj in run.extra_state.items():
        if name in state.get("extra", {}):
            obj.load_state_dict(state["extra"][name])
    run.counters.update(state["counters"])
    run.saved_power = state.get("power")
