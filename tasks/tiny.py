"""The tiny example task: a small causal transformer learning a deterministic token language.

About a minute on 2 CPU cores, checkpointing every few seconds, so that a run can be killed
and resumed by hand (`skygreen up tasks/tiny.yaml --local`, then `kill -9`, then
`skygreen resume RUN`) and end exactly where an uninterrupted one would.

The data is generated here from a fixed seed: each sequence follows `next = (a * prev + b) % V`
with its own (a, b) and occasional noise tokens, so the model has a real pattern to learn
and the validation loss falls. Everything about the run (batch, precision, checkpoints,
early stopping) comes from the task file through the `SKYGREEN_*` environment.
"""

from __future__ import annotations

import math
import os
import random

import numpy as np
import torch
import torch.nn.functional as F

import skygreen.runtime as sg

VOCAB = 32
SEQ_LEN = 32
TRAIN_SEQUENCES = 2048
VAL_SEQUENCES = 256
STEPS = int(os.environ.get("TINY_STEPS", "600"))
EVAL_EVERY = int(os.environ.get("TINY_EVAL_EVERY", "50"))


def make_sequences(count: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(1, 6, (count, 1), generator=g)
    b = torch.randint(0, VOCAB, (count, 1), generator=g)
    tokens = torch.empty(count, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, :1] = torch.randint(0, VOCAB, (count, 1), generator=g)
    for t in range(1, SEQ_LEN + 1):
        tokens[:, t : t + 1] = (a * tokens[:, t - 1 : t] + b) % VOCAB
    noise = torch.rand(count, SEQ_LEN + 1, generator=g) < 0.05
    tokens[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=g)
    return tokens


class Sequences(torch.utils.data.Dataset):
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[i]
        return row[:-1], row[1:]


class TinyGPT(torch.nn.Module):
    def __init__(self, d_model: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, d_model)
        self.pos = torch.nn.Parameter(torch.zeros(SEQ_LEN, d_model))
        layer = torch.nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout=0.1, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, VOCAB)
        self.mask: torch.Tensor
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(SEQ_LEN), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
        return self.head(h)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


@torch.no_grad()
def evaluate(run: sg.Run, val: torch.Tensor) -> float:
    run.model.eval()
    x, y = val[:, :-1].to(run.device), val[:, 1:].to(run.device)
    with run.autocast():
        loss = lm_loss(run.model(x), y).item()
    run.model.train()
    return loss


def main() -> None:
    torch.manual_seed(0)  # every stream the process draws from, for runs that repeat exactly
    random.seed(0)
    np.random.seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warmup = 20
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, STEPS) / STEPS))
    )
    val = make_sequences(VAL_SEQUENCES, seed=2)
    run = sg.Run(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        dataset=Sequences(make_sequences(TRAIN_SEQUENCES, seed=1)),
    )
    with run:
        for step in run.steps(STEPS):
            with step:
                for x, y in step.micro_batches():
                    with step.autocast():
                        loss = lm_loss(run.model(x), y)
                    step.backward(loss)
                step.clip_grad_norm_(1.0)
                step.optimizer_step()
            if run.step_index % EVAL_EVERY == 0 or run.step_index == STEPS:
                val_loss = evaluate(run, val)
                run.report(val_loss=val_loss)
                if run.rank == 0:
                    print(
                        f"step {run.step_index} epoch {run.epoch} train_loss {loss.item():.4f} val_loss {val_loss:.4f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
