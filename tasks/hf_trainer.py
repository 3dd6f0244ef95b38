"""A GPT-2 trained by an unchanged Hugging Face `Trainer`, with skygreen's callback added.

The model is built from a small `GPT2Config` (no download) and trains on offline data: byte
tokens of a text generated here from a fixed seed, so the task runs anywhere, laptops and
air-gapped tests included. Swap in your own model and dataset; the skygreen part is the three
marked lines.

SKYGREEN_TASK_SIZE=small (set by the smoke test) shrinks the model; HF_MAX_STEPS,
HF_SAVE_STEPS, HF_SAVE_TOTAL_LIMIT and HF_DROPOUT override the length, the save interval, the
number of checkpoint folders the Trainer keeps on disk and the dropout.
"""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from skygreen.integrations.transformers import SkygreenCallback  # skygreen (1/3)

SMALL = os.environ.get("SKYGREEN_TASK_SIZE", "full") == "small"
BLOCK = 32 if SMALL else 128
DROPOUT = float(os.environ.get("HF_DROPOUT", "0.1"))
WORDS = ["the", "spot", "market", "sells", "spare", "gpus", "cheaply", "and", "takes", "them", "back", "at", "notice"]


class ByteBlocks(torch.utils.data.Dataset):
    """Fixed blocks of byte tokens from a text drawn once from a seeded generator."""

    def __init__(self, blocks: int, seed: int = 0) -> None:
        rng = torch.Generator().manual_seed(seed)
        picks = torch.randint(len(WORDS), (blocks * BLOCK,), generator=rng).tolist()
        data = " ".join(WORDS[i] for i in picks).encode()[: blocks * BLOCK]
        self.tokens = torch.tensor(list(data), dtype=torch.long).view(blocks, BLOCK)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    config = GPT2Config(
        vocab_size=256,
        n_positions=BLOCK,
        n_embd=32 if SMALL else 256,
        n_layer=2 if SMALL else 6,
        n_head=2 if SMALL else 8,
        resid_pdrop=DROPOUT,
        embd_pdrop=DROPOUT,
        attn_pdrop=DROPOUT,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir="out/hf-trainer",
        max_steps=int(os.environ.get("HF_MAX_STEPS", "2000")),
        per_device_train_batch_size=8,
        learning_rate=3e-4,
        save_steps=int(os.environ.get("HF_SAVE_STEPS", "200")),
        save_total_limit=int(os.environ["HF_SAVE_TOTAL_LIMIT"]) if "HF_SAVE_TOTAL_LIMIT" in os.environ else None,
        eval_strategy="steps",
        eval_steps=int(os.environ.get("HF_SAVE_STEPS", "200")),
        logging_steps=10,
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
    )
    skygreen = SkygreenCallback()  # skygreen (2/3)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=ByteBlocks(512),
        eval_dataset=ByteBlocks(32, seed=1),
        callbacks=[skygreen],
    )
    trainer.train(resume_from_checkpoint=skygreen.resume_from_checkpoint)  # skygreen (3/3)
    trainer.save_model("out/hf-trainer/final")


if __name__ == "__main__":
    main()
