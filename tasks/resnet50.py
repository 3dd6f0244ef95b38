"""ResNet-50 image classification: channels-last and mixed precision, the memory-bound classic.

The model is torchvision's `resnet50()` (random weights) when torchvision is installed, else
`resnet_local.resnet50()`, the same architecture written out (same layers, same parameter
names, 25,557,032 parameters), so the task runs where torchvision cannot be installed.

Data, prepared once (`skygreen.data`): ImageNet-1k from the hub (`ILSVRC/imagenet-1k`, a gated
dataset: accept its terms and give the task an `HF_TOKEN` secret), each JPEG decoded once and
resized (short side to 160 px, centre crop) into uint8 shards; every later start and every
resume streams the shards instead of decoding 1.28M JPEGs again. Augmentation (random resized
crop and horizontal flip) runs per image on the accelerator from torch's checkpointed
generator, so resume stays exact.

`SKYGREEN_TASK_SIZE=small` (set by `skygreen smoke`) trains a one-block-per-stage ResNet on
synthetic 32 px images of 10 classes that the script draws itself, batch 16: the same code
path in about a minute on a CPU.
"""

from __future__ import annotations

import math
import os
import random
import sys
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import skygreen.runtime as sg
from common import Rows, task_size
from resnet_local import resnet, resnet50
from skygreen.data.shards import ShardSpec, ShardWriter, prepare

SIZES: dict[str, dict[str, Any]] = {
    "full": dict(
        image=160,
        classes=1000,
        steps=90 * 1_281_167 // 1024,
        lr=1.024,
        warmup=5 * 1251,
        val_rows=10_000,
        eval_every=1251,
        label_smoothing=0.1,
    ),
    "small": dict(
        batch=16,
        image=32,
        classes=10,
        steps=60,
        lr=0.2,
        warmup=5,
        val_rows=64,
        eval_every=20,
        label_smoothing=0.0,
        rows=512,
    ),
}
IMAGENET = {"dataset": "ILSVRC/imagenet-1k", "split": "train", "revision": "main"}
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def build_model(size_name: str, classes: int) -> torch.nn.Module:
    if size_name == "small":
        return resnet(layers=(1, 1, 1, 1), width=16, num_classes=classes)
    try:
        import torchvision

        return torchvision.models.resnet50(weights=None, num_classes=classes)
    except Exception as e:  # not installed, or a build that does not match this torch
        print(f"resnet50: torchvision unavailable ({type(e).__name__}); using resnet_local.resnet50", file=sys.stderr)
        return resnet50(num_classes=classes)


# -- data ----------------------------------------------------------------------------------


def prepare_images(size_name: str, size: dict):
    if size_name == "small":
        spec = ShardSpec(
            name="synthetic-images",
            source={"synthetic": "class-coloured noise", "seed": 0, "rows": size["rows"]},
            config={"image": size["image"], "classes": size["classes"]},
            rows_per_shard=128,
        )
        return prepare(spec, lambda writer: _synthetic(writer, size))
    spec = ShardSpec(
        name="imagenet1k",
        source=IMAGENET,
        config={"resize_short": size["image"], "crop": size["image"]},
        rows_per_shard=8192,
    )
    return prepare(spec, lambda writer: _imagenet(writer, size["image"]))


def _synthetic(writer: ShardWriter, size: dict) -> None:
    """Images whose class sets a colour and a stripe frequency, under noise: learnable, not trivial."""
    rng = np.random.default_rng(0)
    rows, side, classes = size["rows"], size["image"], size["classes"]
    labels = rng.integers(0, classes, rows)
    colours = rng.uniform(40, 215, (classes, 3))
    x = np.arange(side)
    for start in range(0, rows, 128):
        y = labels[start : start + 128]
        stripes = np.sin(np.outer(y + 1, x) * math.pi / side)[:, None, :, None] * 30
        images = colours[y][:, None, None, :] + stripes + rng.normal(0, 25, (len(y), side, side, 3))
        writer.add({"image": np.clip(images, 0, 255).astype(np.uint8), "label": y.astype(np.int16)})


def _imagenet(writer: ShardWriter, side: int) -> None:
    try:
        import datasets
    except ModuleNotFoundError as e:
        sys.exit(f"error: the full-size task needs '{e.name}': pip install 'skygreen[tasks]' pillow")
    try:
        corpus = datasets.load_dataset(
            IMAGENET["dataset"],
            split=IMAGENET["split"],
            revision=IMAGENET["revision"],
            token=os.environ.get("HF_TOKEN"),
        )
    except Exception as e:
        sys.exit(
            f"error: could not load {IMAGENET['dataset']}: {type(e).__name__}: {e}\n"
            "  fix: accept the dataset's terms on the hub and pass HF_TOKEN (secrets: HF_TOKEN), "
            "or set SKYGREEN_TASK_SIZE=small"
        )
    resize_into(writer, corpus, side)


_WORK: dict[str, Any] = {}  # the dataset being resized, inherited by the worker processes (fork)
CHUNK_ROWS = 1024


def resize_into(writer: ShardWriter, corpus: Any, side: int, *, workers: int | None = None) -> None:
    """Decode and resize every image once, on every core, in order (chunks come back in order)."""
    _WORK["corpus"] = corpus
    chunks = [(start, min(start + CHUNK_ROWS, len(corpus)), side) for start in range(0, len(corpus), CHUNK_ROWS)]
    workers = workers or os.cpu_count() or 1
    try:
        if workers > 1:
            import multiprocessing

            with multiprocessing.get_context("fork").Pool(workers) as pool:
                for images, labels in pool.imap(_resize_chunk, chunks):
                    writer.add({"image": images, "label": labels})
        else:
            for images, labels in map(_resize_chunk, chunks):
                writer.add({"image": images, "label": labels})
    finally:
        _WORK.clear()


def _resize_chunk(chunk: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    start, stop, side = chunk
    rows = _WORK["corpus"][start:stop]
    images = np.stack([_resize(image, side) for image in rows["image"]])
    return images, np.asarray(rows["label"], dtype=np.int16)


def _resize(image: Any, side: int) -> np.ndarray:
    """Short side to `side` pixels, then the centre `side` x `side` crop, as uint8 RGB."""
    from PIL import Image

    image = image.convert("RGB")
    scale = side / min(image.size)
    size = (max(side, round(image.width * scale)), max(side, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    return np.asarray(image.crop((left, top, left + side, top + side)), dtype=np.uint8)


def augment(images: torch.Tensor) -> torch.Tensor:
    """Random resized crop (8%-100% of the area, aspect 3/4-4/3) and flip, per image, on the device."""
    n = images.shape[0]
    dev = images.device
    area = torch.empty(n, device=dev).uniform_(0.08, 1.0)
    log_ratio = torch.empty(n, device=dev).uniform_(math.log(3 / 4), math.log(4 / 3))
    sx = torch.sqrt(area * torch.exp(log_ratio)).clamp(max=1.0)
    sy = torch.sqrt(area / torch.exp(log_ratio)).clamp(max=1.0)
    tx = (torch.rand(n, device=dev) * 2 - 1) * (1 - sx)
    ty = (torch.rand(n, device=dev) * 2 - 1) * (1 - sy)
    flip = torch.where(torch.rand(n, device=dev) < 0.5, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx * flip, tx, sy, ty
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def to_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 NHWC rows -> normalised float NCHW in channels-last memory (NHWC underneath)."""
    x = images.permute(0, 3, 1, 2).float()
    x = (x - _MEAN.to(x.device)) / _STD.to(x.device)
    return x.contiguous(memory_format=torch.channels_last)


@torch.no_grad()
def evaluate(run: sg.Run, val: Rows) -> tuple[float, float]:
    run.model.eval()
    losses, correct = [], 0
    for start in range(0, len(val), 256):
        rows = [val[i] for i in range(start, min(start + 256, len(val)))]
        x = to_input(torch.as_tensor(np.stack([r[0] for r in rows])).to(run.device))
        y = torch.as_tensor(np.stack([r[1] for r in rows])).long().to(run.device)
        with run.autocast():
            logits = run.model(x)
        losses.append(F.cross_entropy(logits.float(), y, reduction="sum").item())
        correct += int((logits.argmax(1) == y).sum())
    run.model.train()
    return sum(losses) / len(val), correct / len(val)


def main() -> None:
    torch.manual_seed(0)  # every stream the process draws from, for runs that repeat exactly
    random.seed(0)
    np.random.seed(0)
    size_name = task_size()
    size = SIZES[size_name]
    steps = int(os.environ.get("RESNET_STEPS", size["steps"]))
    data = prepare_images(size_name, size)
    val_rows = min(size["val_rows"], len(data) // 8)
    train, val = Rows(data, 0, len(data) - val_rows), Rows(data, len(data) - val_rows, len(data))

    model = build_model(size_name, size["classes"]).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # no weight decay on batch-norm and biases
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": 5e-5}, {"params": no_decay, "weight_decay": 0.0}],
        lr=size["lr"],
        momentum=0.875,
        nesterov=False,
    )
    warmup = size["warmup"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    )
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
                for images, labels in step.micro_batches():
                    x = augment(to_input(images)).contiguous(memory_format=torch.channels_last)
                    with step.autocast():
                        loss = F.cross_entropy(run.model(x), labels.long(), label_smoothing=size["label_smoothing"])
                    step.backward(loss)
                step.optimizer_step()
            if run.step_index % size["eval_every"] == 0 or run.step_index == steps:
                val_loss, top1 = evaluate(run, val)
                run.report(val_loss=val_loss)
                if run.rank == 0:
                    print(
                        f"step {run.step_index} epoch {run.epoch} train_loss {loss.item():.4f} "
                        f"val_loss {val_loss:.4f} top1 {top1:.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
