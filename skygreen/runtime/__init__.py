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

Importing this package does not import torch: the laptop side reads `PREEMPTED_EXIT_CODE`
without paying torch's 2.3 s start-up.
"""

from __future__ import annotations

from typing import Any

from skygreen.exit_codes import PREEMPTED_EXIT_CODE

_LAZY = {"Run": "skygreen.runtime.run", "Step": "skygreen.runtime.step"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'skygreen.runtime' has no attribute {name!r}")


__all__ = ["PREEMPTED_EXIT_CODE", "Run", "Step"]
