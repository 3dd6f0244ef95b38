"""A small deterministic training job on CPU for the runtime's tests.

Imported by the in-process tests, and run by `torchrun --nproc-per-node 2` for the DDP tests:

    torchrun --nproc-per-node 2 tests/ddp_train.py BUCKET RUN_ID TOTAL_STEPS MICRO [CRASH_STEP CRASH_MICRO]

The model has dropout and the loop draws from python's `random` and numpy, so all three RNG
streams matter to the result; the dataset size does not divide the effective batch, so
accumulation windows straddle epoch boundaries.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from skygreen.runtime.run import Run
from skygreen.task.settings import RuntimeSettings

DATASET_LEN = 42
FEATURES = 6
CLASSES = 3
STEP_SLEEP_S = float(os.environ.get("DDP_TEST_STEP_SLEEP_S", "0"))
"""Slows each step down, so that a signal sent by a test lands in the middle of the run."""


class Crash(Exception):
    """Stands in for the process dying at a chosen micro-step."""


def dataset(length: int = DATASET_LEN) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(length, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return torch.utils.data.TensorDataset(x, y)


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, CLASSES)
    )


def settings(bucket, run_id: str = "run", **overrides) -> RuntimeSettings:
    values: dict[str, Any] = dict(
        run_id=run_id, bucket=str(bucket), precision="fp32", effective_batch=12, micro_batch=3, checkpoint_every_steps=2
    )
    values.update(overrides)
    return RuntimeSettings(**values)


def train(
    run_settings: RuntimeSettings,
    total_steps: int,
    *,
    crash_at: tuple[int, int] | None = None,
    dataset_len: int = DATASET_LEN,
    metrics: dict[int, float] | None = None,
    hooks=None,
    environ=None,
    trace: list | None = None,
    noise: bool = True,
    setup_run=None,
) -> Run:
    """Train to `total_steps` (resuming from the bucket); raise `Crash` at (step, micro-step)."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    net = model()
    rank = int(os.environ.get("RANK", "0"))
    if rank:  # same initial weights, but each rank its own dropout masks and noise
        torch.manual_seed(rank)
        random.seed(rank)
        np.random.seed(rank)
    if hooks:
        hooks(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    run = Run(
        model=net,
        optimizer=optimizer,
        scheduler=scheduler,
        dataset=dataset(dataset_len),
        settings=run_settings,
        seed=7,
        environ=environ if environ is not None else {k: v for k, v in os.environ.items() if k != "SKYGREEN_SMOKE"},
    )
    if setup_run:
        setup_run(run)
    with run:
        for step in run.steps(total_steps):
            with step:
                for i, (x, y) in enumerate(step.micro_batches()):
                    if crash_at == (step.index, i):
                        raise Crash(f"crash at step {step.index} micro-step {i}")
                    if noise:
                        x = x + 0.01 * random.random() + 0.01 * float(np.random.rand())
                    with step.autocast():
                        loss = F.cross_entropy(run.model(x), y)
                    step.backward(loss)
                    if trace is not None:
                        trace.append((step.index, run.micro_batch, x.shape[0]))
                step.clip_grad_norm_(1.0)
                step.optimizer_step()
            if STEP_SLEEP_S:
                time.sleep(STEP_SLEEP_S)
            if metrics and step.index in metrics:
                run.report(val_loss=metrics[step.index])
    return run


def _oom_above(limit: int):
    """Fail like a GPU that holds `limit` samples (the autotune test's stand-in for a small GPU)."""

    def install(net):
        def hook(module, inputs):
            if inputs[0].shape[0] > limit:
                raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {inputs[0].shape[0]} MiB")

        net[0].register_forward_pre_hook(hook)

    return install


def _count_allreduces(counts: list[int]):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(state, bucket):
        counts.append(1)
        return allreduce_hook(state, bucket)

    return lambda run: run.model.register_comm_hook(None, hook)


if __name__ == "__main__":
    # argv: BUCKET RUN_ID TOTAL_STEPS MICRO [CRASH_STEP CRASH_MICRO]; MICRO is a number or "auto".
    # DDP_TEST_OOM_RANK1_ABOVE=N: rank 1 runs out of memory above N samples per micro-batch.
    # DDP_TEST_COUNT_ALLREDUCE=1: print how many gradient all-reduces DDP ran.
    bucket, run_id, total, micro = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    crash = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else None
    rank = int(os.environ.get("RANK", "0"))
    oom = os.environ.get("DDP_TEST_OOM_RANK1_ABOVE")
    counts: list[int] = []
    try:
        run = train(
            settings(bucket, run_id, micro_batch=None if micro == "auto" else int(micro)),
            total,
            crash_at=crash,
            hooks=_oom_above(int(oom)) if oom and rank == 1 else None,
            setup_run=_count_allreduces(counts) if os.environ.get("DDP_TEST_COUNT_ALLREDUCE") else None,
        )
        print(f"rank {rank} micro {run.micro_batch} accum {run.accum_steps} allreduces {len(counts)}", flush=True)
    except Crash:
        sys.exit(3)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
