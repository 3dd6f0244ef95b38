"""GPT-2 small (124M) language-model training with gradient accumulation to a 0.5M-token batch.

GPT-3's small model trained with 0.5M tokens per optimizer step; one GPU holds 8 to 32
sequences of 1024 tokens. The task file asks for `batch: {effective: 512, micro: auto}`: the
runtime finds the largest micro-batch that fits the GPU it landed on and accumulates the rest
(512 sequences x 1024 tokens = 524,288 tokens per step, on any GPU and any number of them).

The model is built from a `transformers` GPT2Config (random weights, nothing downloaded); the
tokenizer is GPT-2's byte-level BPE and the corpus FineWeb-Edu's 10B-token sample, as in
Karpathy's llm.c and build-nanogpt reproductions, both through the hub. Tokenizing 10B tokens
is CPU-hours of work: it happens once (`textdata.prepare_text`, `skygreen.data`) and every
later start streams the uint16 shards from the bucket.

`SKYGREEN_TASK_SIZE=small` (set by `skygreen smoke`) trains a 2-layer, 64-wide GPT on 64-token
blocks of the shipped sample with a BPE tokenizer trained on it, batch 16: the same code path
in about a minute on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from typing import Any

import numpy as np
import torch

import skygreen.runtime as sg
from common import Rows, task_size
from textdata import TextData, prepare_text

FINEWEB_EDU = TextData(
    name="fineweb-edu-10bt-gpt2",
    dataset="HuggingFaceFW/fineweb-edu",
    dataset_config="sample-10BT",
    split="train",
    revision="main",
    text_column="text",
    tokenizer="gpt2",
    tokenizer_kind="bytelevel-bpe",
    block_size=1024,
    separator_token="<|endoftext|>",
)
SIZES: dict[str, dict[str, Any]] = {
    # 19,073 steps x 524,288 tokens = 10B tokens; GPT-3 small's learning rate and schedule.
    "full": dict(
        embd=768,
        layers=12,
        heads=12,
        block=1024,
        steps=19_073,
        lr=6e-4,
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dedup",
        type=float,
        default=None,
        metavar="THRESHOLD",
        help="drop near-duplicate documents (MinHash Jaccard >= THRESHOLD); off by default "
        "(FineWeb-Edu is already deduplicated upstream)",
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the size's)")
    return parser.parse_args()


def build_model(vocab_size: int, size: dict):
    from transformers import GPT2Config, GPT2LMHeadModel

    pad = size["vocab_pad"]  # a vocabulary rounded up to a multiple of 64 runs faster on tensor cores
    config = GPT2Config(
        vocab_size=(vocab_size + pad - 1) // pad * pad,
        n_positions=size["block"],
        n_embd=size["embd"],
        n_layer=size["layers"],
        n_head=size["heads"],
    )
    return GPT2LMHeadModel(config)


def load_text(size_name: str, size: dict, *, dedup: float | None) -> tuple[Any, int, Rows, Rows]:
    """(tokens, vocabulary size, training rows, validation rows) of FineWeb-Edu at this size."""
    data, tokenizer = prepare_text(
        dataclasses.replace(FINEWEB_EDU, block_size=size["block"]), size=size_name, dedup=dedup
    )
    val_rows = min(size["val_rows"], len(data) // 4)
    return (
        data,
        tokenizer.get_vocab_size(),
        Rows(data, 0, len(data) - val_rows),
        Rows(data, len(data) - val_rows, len(data)),
    )


def make_optimizer(model: torch.nn.Module, size: dict) -> torch.optim.AdamW:
    """GPT-3's AdamW: weight decay 0.1 on matrices only, betas (0.9, 0.95). Build it after the
    model is sharded, if it is: it holds the parameters it is given."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=size["lr"],
        betas=(0.9, 0.95),
        eps=1e-8,
    )


def make_scheduler(optimizer: torch.optim.Optimizer, size: dict, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over the size's `warmup` steps, then cosine decay to 10% at `steps`."""
    warmup = size["warmup"]

    def lr_factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)


@torch.no_grad()
def evaluate(run: sg.Run, val: Rows) -> float:
    run.model.eval()
    losses = []
    for start in range(0, len(val), 16):
        ids = torch.stack([torch.as_tensor(val[i]) for i in range(start, min(start + 16, len(val)))]).to(run.device)
        with run.autocast():
            losses.append(run.model(input_ids=ids, labels=ids).loss.float().item())
    run.model.train()
    return float(np.mean(losses))


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)  # every stream the process draws from, for runs that repeat exactly
    random.seed(0)
    np.random.seed(0)
    size_name = task_size()
    size = SIZES[size_name]
    steps = args.steps or size["steps"]
    data, vocab_size, train, val = load_text(size_name, size, dedup=args.dedup)

    model = build_model(vocab_size, size)
    optimizer = make_optimizer(model, size)
    scheduler = make_scheduler(optimizer, size, steps)
    run = sg.Run(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        dataset=train,
        extra_state={"data": data},
        effective_batch=size.get("batch"),
    )  # small: 16 whatever the task file says
    with run:
        for step in run.steps(steps):
            with step:
                for ids in step.micro_batches():
                    with step.autocast():
                        loss = run.model(input_ids=ids, labels=ids).loss  # labels shift inside the model
                    step.backward(loss)
                step.clip_grad_norm_(1.0)
                step.optimizer_step()
            if run.step_index % size["eval_every"] == 0 or run.step_index == steps:
                val_loss = evaluate(run, val)
                run.report(val_loss=val_loss)
                if run.rank == 0:
                    print(
                        f"step {run.step_index} epoch {run.epoch} accumulation {run.accum_steps} "
                        f"train_loss {loss.item():.4f} val_loss {val_loss:.4f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
