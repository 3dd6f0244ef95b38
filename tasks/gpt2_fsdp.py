"""GPT-2 medium (355M) under FSDP2: every transformer block sharded over the ranks, sharded
asynchronous checkpoints that reshard when the run resumes on another number of GPUs.

The model is wrapped with `fully_shard` (`skygreen.runtime.fsdp.shard`: each block, then the
root) before it is given to `sg.Run`, which recognises it: no DDP, gradient reduce-scatter only
on the last micro-step of each accumulation window, clipping over the sharded gradients and
checkpoints through `skygreen.runtime.sharded`. The precision the runtime picked for the GPU
becomes FSDP2's `MixedPrecisionPolicy` (bf16 compute, fp32 gradient reduction and master
weights).

Data, tokenizer, schedule and evaluation are `gpt2.py`'s. `SKYGREEN_TASK_SIZE=small` (set by
`skygreen smoke`) trains a 2-layer, 64-wide GPT on 64-token blocks of the shipped sample.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import skygreen.runtime as sg
from common import Rows, task_size
from gpt2 import FINEWEB_EDU, build_model, evaluate, parse_args
from skygreen.runtime.fsdp import shard, task_precision
from skygreen.settings import SMOKE_ENV
from textdata import prepare_text

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
    "small": dict(
        batch=16,
        embd=64,
        layers=2,
        heads=2,
        block=64,
        steps=60,
        lr=3e-3,
        warmup=5,
        val_rows=16,
        eval_every=20,
        vocab_pad=8,
    ),
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
    data, tokenizer = prepare_text(
        dataclasses.replace(FINEWEB_EDU, block_size=size["block"]), size=size_name, dedup=args.dedup
    )
    val_rows = min(size["val_rows"], len(data) // 4)
    train, val = Rows(data, 0, len(data) - val_rows), Rows(data, len(data) - val_rows, len(data))

    model = build_model(tokenizer.get_vocab_size(), size).to(device)
    compute = task_precision(device)  # the task's precision, `auto` resolved for this GPU
    shard(model, blocks=model.transformer.h, precision=compute)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=size["lr"],
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    warmup = size["warmup"]

    def lr_factor(s: int) -> float:  # linear warm-up, cosine decay to 10%
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
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
