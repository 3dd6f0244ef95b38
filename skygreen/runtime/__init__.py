"""The in-container runtime: the user's own PyTorch loop, made cheap and hard to kill.

    import skygreen.runtime as sg

    run = sg.Run(model=model, optimizer=optimizer, scheduler=scheduler, dataset=train_set)
    for step in run.steps(total_steps):
        with step:
            for x, y in step.micro_batches():
                with step.autocast():
                    loss = F.cross_entropy(run.model(x), y)
                step.backward(loss)          # loss / accum_steps, scaled; no all-reduce until the last one
            step.clip_grad_norm_(1.0)        # unscales first
            step.optimizer_step()            # scaler step + update, zero_grad, scheduler
        if run.step_index % 100 == 0:
            run.report(val_loss=evaluate(run.model))

A trainer that owns its loop (a Hugging Face or Lightning callback, an FSDP script) uses the
same parts without a `Run`:

    services = sg.open_services(sg.RuntimeSettings.from_env(), device=device, world=sg.World.from_env(os.environ),
                                environ=os.environ)
    loaded = services.checkpointer.restore_state({"model": model, "optimizer": opt, "training": training})
    services.governor.start(); services.preemption.start()
    ...  # each step: services.governor.step_done(); services.preemption.sigterm; services.over_budget()
    services.checkpointer.save_state(step, {"model": model, "optimizer": opt, "training": training})
    services.close()

A model sharded with FSDP2 (`sg.shard(model, blocks=model.layers, precision=sg.task_precision(device))`)
goes to `Run` as it is (no DDP; sharded checkpoints); a loop of its own passes
`checkpointer=sg.open_sharded_checkpointer(settings, world=world)` to `open_services` and
`{**sg.sharded_states(model, opt), "training": training}` as the states.

Importing this package does not import torch: the laptop side reads `PREEMPTED_EXIT_CODE`
without paying torch's 2.3 s start-up; every other name loads its module on first use.
"""

from __future__ import annotations

from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.lazy_names import lazy_getattr

_LAZY = {
    "Run": "skygreen.runtime.run",
    "Step": "skygreen.runtime.step",
    "StepParts": "skygreen.runtime.step",
    "RunServices": "skygreen.runtime.services",
    "open_services": "skygreen.runtime.services",
    "open_checkpointer": "skygreen.runtime.services",
    "open_stopper": "skygreen.runtime.services",
    "open_schedule": "skygreen.runtime.services",
    "Checkpointer": "skygreen.runtime.checkpointer",
    "Loaded": "skygreen.runtime.checkpointer",
    "TrainingState": "skygreen.runtime.state",
    "BatchShape": "skygreen.runtime.state",
    "StateGroup": "skygreen.runtime.state",
    "Stateful": "skygreen.runtime.state",
    "World": "skygreen.runtime.ranks",
    "open_governor": "skygreen.runtime.power",
    "PowerGovernor": "skygreen.power.governor",
    "RunBook": "skygreen.runtime.run_book",
    "EarlyStopper": "skygreen.runtime.early_stop",
    "PreemptionWatch": "skygreen.runtime.preemption",
    "RuntimeSettings": "skygreen.task.settings",
    "shard": "skygreen.runtime.fsdp",
    "task_precision": "skygreen.runtime.fsdp",
    "sharded_states": "skygreen.runtime.fsdp",
    "ShardedCheckpointer": "skygreen.runtime.sharded",
    "open_sharded_checkpointer": "skygreen.runtime.sharded",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "PREEMPTED_EXIT_CODE",
    "BatchShape",
    "Checkpointer",
    "EarlyStopper",
    "Loaded",
    "PowerGovernor",
    "PreemptionWatch",
    "Run",
    "RunBook",
    "RunServices",
    "RuntimeSettings",
    "ShardedCheckpointer",
    "StateGroup",
    "Stateful",
    "Step",
    "StepParts",
    "TrainingState",
    "World",
    "open_checkpointer",
    "open_governor",
    "open_schedule",
    "open_services",
    "open_sharded_checkpointer",
    "open_stopper",
    "shard",
    "sharded_states",
    "task_precision",
]
