"""BERT-base masked-language-model pre-training on WikiText-103: the power-capping study's workload.

The model is built from a `transformers` BertConfig (random weights: pre-training, nothing to
download); the tokenizer is bert-base-uncased's WordPiece vocabulary and the corpus is
WikiText-103, both through the hub. Tokenizing and packing happen once
(`textdata.prepare_text`, `skygreen.data`): later starts and every resume after a preemption
stream the packed 128-token blocks from the bucket.

Masking follows BERT: 15% of the non-special tokens are chosen; of those 80% become [MASK],
10% a random token, 10% stay. It is drawn on the fly from torch's generator, which the
runtime checkpoints, so a resumed run masks exactly as an uninterrupted one.

`SKYGREEN_TASK_SIZE=small` (set by `skygreen smoke`) trains a 2-layer, 32-wide BERT on
32-token blocks of the shipped sample with a tokenizer trained on it, batch 16: the same code
path in about a minute on a CPU. `--dedup 0.8` removes near-duplicate documents first (off by default; see
`skygreen.data.text` before using it on curated data).
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

WIKITEXT_103 = TextData(
    name="wikitext103-bert",
    dataset="Salesforce/wikitext",
    dataset_config="wikitext-103-raw-v1",
    split="train",
    revision="main",
    text_column="text",
    tokenizer="bert-base-uncased",
    tokenizer_kind="wordpiece",
    block_size=128,  # BERT's phase-1 sequence length
    cls_token="[CLS]",
    separator_token="[SEP]",
)
SIZES: dict[str, dict[str, Any]] = {
    # BERT-base (110M parameters); 100k steps of 256 x 128 tokens = 3.3B tokens, ~27 epochs of WikiText-103.
    "full": dict(
        hidden=768,
        layers=12,
        heads=12,
        intermediate=3072,
        block=128,
        steps=100_000,
        lr=5e-4,
        warmup=10_000,
        val_rows=2048,
        eval_every=2000,
    ),
    "small": dict(
        batch=16,
        hidden=32,
        layers=2,
        heads=2,
        intermediate=64,
        block=32,
        steps=60,
        lr=2e-3,
        warmup=5,
        val_rows=16,
        eval_every=20,
    ),
}
MASK_FRACTION = 0.15


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dedup",
        type=float,
        default=None,
        metavar="THRESHOLD",
        help="drop near-duplicate documents (MinHash Jaccard >= THRESHOLD, e.g. 0.8); off by default",
    )
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the size's)")
    return parser.parse_args()


def build_model(vocab_size: int, size: dict):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=size["hidden"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        intermediate_size=size["intermediate"],
        max_position_embeddings=max(512, size["block"]),
        type_vocab_size=2,
    )
    return BertForMaskedLM(config)


def mask_tokens(
    ids: torch.Tensor, *, mask_id: int, vocab_size: int, special: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's 80/10/10 masking: (inputs, labels with -100 where nothing is predicted)."""

    def draw(p: float) -> torch.Tensor:
        return torch.rand(ids.shape, generator=generator, device=ids.device) < p

    chosen = draw(MASK_FRACTION) & ~torch.isin(ids, special)
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    to_mask = chosen & draw(0.8)
    to_random = chosen & ~to_mask & draw(0.5)
    randoms = torch.randint(vocab_size, ids.shape, generator=generator, device=ids.device)
    inputs = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    inputs = torch.where(to_random, randoms, inputs)
    return inputs, labels


@torch.no_grad()
def evaluate(run: sg.Run, val: Rows, token_ids: dict) -> float:
    run.model.eval()
    generator = torch.Generator().manual_seed(1234)  # the same masks at every evaluation
    ids = torch.stack([torch.as_tensor(val[i]) for i in range(len(val))])
    inputs, labels = mask_tokens(ids, generator=generator, **token_ids)
    losses = []
    for start in range(0, len(ids), 64):
        with run.autocast():
            out = run.model(
                input_ids=inputs[start : start + 64].to(run.device), labels=labels[start : start + 64].to(run.device)
            )
        losses.append(out.loss.float().item())
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
    data, tokenizer = prepare_text(
        dataclasses.replace(WIKITEXT_103, block_size=size["block"]), size=size_name, dedup=args.dedup
    )
    vocab_size = tokenizer.get_vocab_size()
    token_ids = {
        "mask_id": tokenizer.token_to_id("[MASK]"),
        "vocab_size": vocab_size,
        "special": torch.tensor([tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")]),
    }
    val_rows = min(size["val_rows"], len(data) // 4)
    train, val = Rows(data, 0, len(data) - val_rows), Rows(data, len(data) - val_rows, len(data))

    model = build_model(vocab_size, size)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=size["lr"],
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    warmup = size["warmup"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup)))
    )
    run = sg.Run(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        dataset=train,
        extra_state={"data": data},
        effective_batch=size.get("batch"),
    )  # small: 16 whatever the task file says
    special = token_ids["special"].to(run.device)
    with run:
        for step in run.steps(steps):
            with step:
                for ids in step.micro_batches():
                    inputs, labels = mask_tokens(
                        ids, mask_id=token_ids["mask_id"], vocab_size=vocab_size, special=special
                    )
                    with step.autocast():
                        loss = run.model(input_ids=inputs, labels=labels).loss
                    step.backward(loss)
                step.clip_grad_norm_(1.0)
                step.optimizer_step()
            if run.step_index % size["eval_every"] == 0 or run.step_index == steps:
                val_loss = evaluate(run, val, token_ids)
                run.report(val_loss=val_loss)
                if run.rank == 0:
                    print(
                        f"step {run.step_index} epoch {run.epoch} train_loss {loss.item():.4f} "
                        f"val_loss {val_loss:.4f} val_ppl {math.exp(min(val_loss, 20)):.1f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
