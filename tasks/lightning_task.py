"""A small regression model trained by an unchanged PyTorch Lightning script, with skygreen's
callback added.

The data is generated here from a fixed seed, so the task runs anywhere, laptops and
air-gapped tests included. Swap in your own module and data; the skygreen part is the three
marked lines.

Resuming from an epoch-end checkpoint is bit-identical because the sampler shuffles by epoch
(`set_epoch`, which Lightning calls): Lightning restores the model, optimizer and loop
progress, not the global RNG nor a position inside an epoch. The saves the task's
`checkpoint.every` adds between epochs (auto: Daly's optimum) resume inside the epoch as
Lightning does for a loader that is not resumable (it warns), so not bit-identically.

SKYGREEN_TASK_SIZE=small (set by the smoke test) shrinks the model and data; LT_EPOCHS
overrides the number of epochs.
"""

from __future__ import annotations

import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from skygreen.integrations.lightning import SkygreenCallback  # skygreen (1/3)

SMALL = os.environ.get("SKYGREEN_TASK_SIZE", "full") == "small"
FEATURES = 16 if SMALL else 256
HIDDEN = 32 if SMALL else 1024
SAMPLES = 256 if SMALL else 65536
BATCH = 32 if SMALL else 256
OUT = "out/lightning"


class EpochShuffle(torch.utils.data.Sampler[int]):
    """A shuffle drawn from (seed, epoch): the same order for an epoch on every start."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = torch.Generator().manual_seed(self.seed * 10_000 + self.epoch)
        return iter(torch.randperm(self.size, generator=rng).tolist())

    def __len__(self) -> int:
        return self.size


def dataset(size: int, seed: int) -> torch.utils.data.TensorDataset:
    """y = sin(x @ w) + noise, drawn once from a seeded generator."""
    rng = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234))
    x = torch.randn(size, FEATURES, generator=rng)
    return torch.utils.data.TensorDataset(x, torch.sin(x @ w) + 0.1 * torch.randn(size, 1, generator=rng))


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 4, gamma=0.9)}


def main() -> None:
    torch.manual_seed(0)
    model = Regressor()
    train = dataset(SAMPLES, seed=0)
    loader = torch.utils.data.DataLoader(train, batch_size=BATCH, sampler=EpochShuffle(len(train)))
    val = torch.utils.data.DataLoader(dataset(SAMPLES // 8, seed=1), batch_size=BATCH)
    skygreen = SkygreenCallback()  # skygreen (2/3)
    trainer = L.Trainer(
        max_epochs=int(os.environ.get("LT_EPOCHS", "20")),
        accelerator="auto",
        precision="32-true",
        logger=False,
        enable_progress_bar=False,
        callbacks=[skygreen, ModelCheckpoint(dirpath=f"{OUT}/checkpoints", every_n_epochs=1, save_top_k=-1)],
        default_root_dir=OUT,
    )
    trainer.fit(model, loader, val, ckpt_path=skygreen.ckpt_path)  # skygreen (3/3)
    os.makedirs(OUT, exist_ok=True)  # a restart after the last checkpoint trains nothing and writes no folder
    torch.save(model.state_dict(), f"{OUT}/final.pt")


if __name__ == "__main__":
    main()
