"""A small deterministic FSDP2 training job on CPU (gloo) for the sharded-checkpoint tests.

    torchrun --nproc-per-node N tests/fsdp_train.py BUCKET RUN_ID TOTAL_STEPS OUT_DIR

The model is sharded with `skygreen.runtime.fsdp.shard` (each block, then the root) before it
is handed to `Run`. The effective batch (8 samples, micro-batch 1) is the same at every world
size, so the accumulation is 8 / N. Rank 0 appends one JSON line per optimizer step to
`OUT_DIR/steps.jsonl`: the step, the mean loss over the step's samples, the dataset indices
of every sample the step used on any rank, the gradient reduce-scatters FSDP ran on this rank,
and the gradient norm `step.clip_grad_norm_` returned beside the norm of the gathered gradients
before and after clipping; at the end it writes the gathered full weights to
`OUT_DIR/weights.pt`.

With `FSDP_TEST_MEMORY_MIB` (each rank's device memory in MiB, comma-separated) the micro-batch
is `auto` and each rank's "GPU" is a `skygreen.testing.FakeDeviceMemory` of that size, whose
forward holds `FAKE_BASE_MIB` plus `FAKE_SAMPLE_MIB` per sample.

With `FSDP_TEST_S3_ENDPOINTS` (one S3 endpoint per rank, comma-separated), rank r talks to
the r-th: a test puts a counting proxy in front of the bucket for each rank.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from skygreen.runtime import run as run_module
from skygreen.runtime.fsdp import shard
from skygreen.runtime.run import Run
from skygreen.task.settings import RuntimeSettings
from skygreen.testing import FakeDeviceMemory

DATASET_LEN = 44
FEATURES = 6
CLASSES = 3
MAX_GRAD_NORM = 0.5
FAKE_BASE_MIB = 1000
FAKE_SAMPLE_MIB = 100


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(DATASET_LEN, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return torch.utils.data.TensorDataset(x, y, torch.arange(DATASET_LEN))


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, CLASSES),
    )


REDUCE_SCATTERS = [0]


def count_reduce_scatters() -> None:
    """Count FSDP2's gradient reduce-scatters (an observer around the real collective)."""
    real = dist.reduce_scatter_single

    def counted(*args, **kwargs):
        REDUCE_SCATTERS[0] += 1
        return real(*args, **kwargs)

    dist.reduce_scatter_single = counted


def full_grad_norm(net: torch.nn.Module) -> float:
    """The global gradient norm from the gathered (unsharded) gradients."""
    grads = [cast(DTensor, p.grad).full_tensor() for p in net.parameters() if p.grad is not None]
    return sum(float(g.double().pow(2).sum()) for g in grads) ** 0.5


def main(bucket: str, run_id: str, total_steps: int, out_dir: Path) -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    count_reduce_scatters()
    rank = dist.get_rank()
    endpoints = os.environ.get("FSDP_TEST_S3_ENDPOINTS")
    if endpoints:
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoints.split(",")[rank]
    net = model()
    memory_mib = os.environ.get("FSDP_TEST_MEMORY_MIB")
    if memory_mib:
        fake = FakeDeviceMemory(
            capacity_bytes=int(memory_mib.split(",")[rank]) * 2**20,
            base_bytes=FAKE_BASE_MIB * 2**20,
            bytes_per_sample=FAKE_SAMPLE_MIB * 2**20,
        )
        fake.install(net[0])
        run_module.device_memory = lambda device: fake  # this "GPU" is the only device with statistics
    shard(net, blocks=model_blocks_of(net), precision="fp32")
    optimizer = torch.optim.AdamW(net.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    settings = RuntimeSettings(
        run_id=run_id,
        bucket=bucket,
        precision="fp32",
        effective_batch=8,
        micro_batch=None if memory_mib else 1,
        checkpoint_every_steps=int(os.environ.get("FSDP_TEST_EVERY", "2")),
    )
    environ = {k: v for k, v in os.environ.items() if k != "SKYGREEN_SMOKE"}
    run = Run(
        micro_batch="auto" if memory_mib else None,
        model=net,
        optimizer=optimizer,
        scheduler=scheduler,
        dataset=dataset(),
        settings=settings,
        seed=7,
        environ=environ,
    )
    log = out_dir / "steps.jsonl"
    with run:
        for step in run.steps(total_steps):
            loss_sum = torch.zeros(1)
            seen: list[int] = []
            with step:
                before = REDUCE_SCATTERS[0]
                for x, y, index in step.micro_batches():
                    loss = F.cross_entropy(run.model(x), y)
                    step.backward(loss)
                    loss_sum += loss.detach() * x.shape[0]
                    seen += index.tolist()
                reduce_scatters = REDUCE_SCATTERS[0] - before
                unclipped = full_grad_norm(net)
                norm = step.clip_grad_norm_(MAX_GRAD_NORM)
                clipped = full_grad_norm(net)
                step.optimizer_step()
            dist.all_reduce(loss_sum)
            every: list[list[int]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(every, seen)
            if rank == 0:
                line = {
                    "step": step.index,
                    "loss": loss_sum.item() / run.effective_batch,
                    "samples": sorted(i for part in every for i in part),
                    "world_size": dist.get_world_size(),
                    "accum": run.accum_steps,
                    "reduce_scatters": reduce_scatters,
                    "grad_norm": float(norm),
                    "grad_norm_gathered": unclipped,
                    "grad_norm_after_clip": clipped,
                }
                with open(log, "a") as f:
                    f.write(json.dumps(line) + "\n")
    full = {k: v.full_tensor() for k, v in net.state_dict().items()}
    if rank == 0:
        torch.save(full, out_dir / "weights.pt")


def model_blocks_of(net: torch.nn.Sequential) -> list[torch.nn.Module]:
    """The layers with weights: each is sharded on its own."""
    return [m for m in net if isinstance(m, torch.nn.Linear)]


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
