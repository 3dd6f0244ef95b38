"""A LoRA fine-tune through peft driven by an HF `Trainer` with `SkygreenCallback()`, on CPU, for
tests/test_hf_lora.py: the tiny random-initialised Llama-style base of tasks/lora.py (its seed in
LORA_BASE_SEED), rank-4 adapters on q_proj and v_proj, HF_MAX_STEPS steps saved every
HF_SAVE_STEPS. At the end it writes the trained parameters to `final.pt` in its folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from transformers import Trainer, TrainingArguments

from skygreen.integrations.transformers import SkygreenCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tasks"))
import lora  # the task's own base and adapters


class Blocks(torch.utils.data.Dataset):
    """The LoRA task's token language as the Trainer's dicts."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    model = lora.lora_model(base_seed=int(os.environ.get("LORA_BASE_SEED", "0")))
    args = TrainingArguments(
        output_dir="out/hf-lora",
        max_steps=int(os.environ["HF_MAX_STEPS"]),
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_steps=int(os.environ["HF_SAVE_STEPS"]),
        logging_steps=1000,
        report_to=[],
        seed=0,
        dataloader_num_workers=0,
        use_cpu=True,
    )
    skygreen = SkygreenCallback()
    data = Blocks(lora.make_sequences(128, seed=1, vocab=model.config.vocab_size)[:, : lora.SEQ_LEN])
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[skygreen])
    trainer.train(resume_from_checkpoint=skygreen.resume_from_checkpoint)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.save(trained, "final.pt")


if __name__ == "__main__":
    main()
