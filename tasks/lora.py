"""A LoRA fine-tune through peft on a tiny random-initialised Llama-style model, on CPU.

The base is `LlamaForCausalLM` built from `lora_llama.json` beside this script with a fixed seed
(a stand-in for a downloaded base: the same weights at every start, which is what the
checkpoint's base digest checks). peft puts rank-4 adapters on `q_proj` and `v_proj`; only they
train, so `sg.Run` checkpoints only them, their AdamW state and the base's identity
(`skygreen.runtime.frozen_base`). The data is the tiny task's token language, generated from a
fixed seed. At the end rank 0 writes the adapter's weights to `out/lora/final.pt`.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import skygreen.runtime as sg

CONFIG = Path(__file__).with_name("lora_llama.json")
SEQ_LEN = 32
STEPS = int(os.environ.get("LORA_STEPS", "200"))
BASE_SEED = int(os.environ.get("LORA_BASE_SEED", "0"))
FINAL = Path("out/lora/final.pt")


def make_sequences(count: int, seed: int, vocab: int) -> torch.Tensor:
    """Sequences that follow `next = (a * prev + b) % vocab`, each with its own (a, b)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(1, 6, (count, 1), generator=g)
    b = torch.randint(0, vocab, (count, 1), generator=g)
    tokens = torch.empty(count, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, :1] = torch.randint(0, vocab, (count, 1), generator=g)
    for t in range(1, SEQ_LEN + 1):
        tokens[:, t : t + 1] = (a * tokens[:, t - 1 : t] + b) % vocab
    return tokens


class Sequences(torch.utils.data.Dataset):
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[i]
        return row[:-1], row[1:]


def lora_model(base_seed: int = BASE_SEED) -> Any:
    """The random-initialised base from the config, with LoRA adapters on q_proj and v_proj."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_json_file(str(CONFIG))
    config._name_or_path = f"tiny-llama-random-seed{base_seed}"
    torch.manual_seed(base_seed)
    base = LlamaForCausalLM(config)
    adapters = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return get_peft_model(base, adapters)


def main() -> None:
    model = lora_model()
    torch.manual_seed(0)  # every stream the process draws from, for runs that repeat exactly
    random.seed(0)
    np.random.seed(0)
    vocab = model.config.vocab_size
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    run = sg.Run(model=model, optimizer=optimizer, dataset=Sequences(make_sequences(512, seed=1, vocab=vocab)))
    with run:
        for step in run.steps(STEPS):
            with step:
                for x, y in step.micro_batches():
                    with step.autocast():
                        logits = run.model(input_ids=x).logits
                        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
                    step.backward(loss)
                step.optimizer_step()
            if run.rank == 0 and run.step_index % 20 == 0:
                print(f"step {run.step_index} train_loss {loss.item():.4f}", flush=True)
    if run.rank == 0:
        FINAL.parent.mkdir(parents=True, exist_ok=True)
        trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
        torch.save(trainable, FINAL)


if __name__ == "__main__":
    main()
