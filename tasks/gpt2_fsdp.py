"""GPT-2 medium (355M) under FSDP2: every transformer block sharded over the ranks, sharded
asynchronous checkpoints that reshard when the run resumes on another number of GPUs.

The model is wrapped with `fully_shard` (`skygreen.runtime.fsdp.shard`: each block, then the
root) before it is given to `sg.Run`, which recognises it: no DDP, gradient reduce-scatter only
on the last micro-step of each accumulation window, clipping over the sharded gradients and
checkpoints through `skygreen.runtime.sharded`. The precision the runtime picked for the GPU
becomes FSDP2's `MixedPrecisionPolicy` (bf16 compute, fp32 gradient reduction and master
weights).

Model, data, tokenizer, optimizer, schedule and evaluation are `gpt2.py`'s. `SKYGREEN_TASK_SIZE=small` (set by
`skygreen smoke`) trains a 2-layer, 64-wide GPT on 64-token blocks of the shipped sample.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import skygreen.runtime as sg
from common import task_size
from gpt2 import SIZES as GPT2_SIZES
from gpt2 import build_model, evaluate, load_text, make_optimizer, make_scheduler, parse_args
from skygreen.runtime.fsdp import shard, task_precision
from skygreen.task.settings import SMOKE_ENV

SIZES: dict[str, dict[str, Any]] = {
    # GPT-2 medium; GPT-3 medium's learning rate (3e-4) and the 10B-token schedule of gpt2.py.
    "full": dict(
        embd=1024,
        layers=24,
        heads=16,
        block=1024,
        steps=19_073,
        lr=3e-4,
        warmup=715,
        val_rows=1024,
        eval_every=250,
        vocab_pad=64,
    ),
    "small": GPT2_SIZES["small"],  # the same small model as gpt2.py's smoke test
}


def start_process_group() -> torch.device:
    """Join the ranks torchrun started (one process alone when started without it)."""
    on_gpu = torch.cuda.is_available() and os.environ.get(SMOKE_ENV) != "1"
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29512")
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    random.seed(0)
    np.random.seed(0)
    device = start_process_group()
    size_name = task_size()
    size = SIZES[size_name]
    steps = args.steps or size["steps"]
    data, vocab_size, train, val = load_text(size_name, size, dedup=args.dedup)

    model = build_model(vocab_size, size).to(device)
    compute = task_precision(device)  # the task's precision, `auto` resolved for this GPU
    shard(model, blocks=model.transformer.h, precision=compute)
    optimizer = make_optimizer(model, size)  # over the sharded parameters
    scheduler = make_scheduler(optimizer, size, steps)
    run = sg.Run(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        dataset=train,
        extra_state={"data": data},
        effective_batch=size.get("batch"),
        precision=compute,
    )
    try:
        with run:
            for step in run.steps(steps):
                with step:
                    for ids in step.micro_batches():
                        loss = run.model(input_ids=ids, labels=ids).loss  # labels shift inside the model
                        step.backward(loss)
                    step.clip_grad_norm_(1.0)
                    step.optimizer_step()
                if run.step_index % size["eval_every"] == 0 or run.step_index == steps:
                    val_loss = evaluate(run, val)
                    run.report(val_loss=val_loss)
                    if run.rank == 0:
                        print(
                            f"step {run.step_index} epoch {run.epoch} ranks {run.world_size} accumulation "
                            f"{run.accum_steps} train_loss {loss.item():.4f} val_loss {val_loss:.4f}",
                            flush=True,
                        )
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
