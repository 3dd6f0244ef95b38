"""What skygreen knows about training GPUs: memory, board power, speed, number formats.

The relative training speed is the throughput of mixed-precision PyTorch training of common
models (ResNet-50, BERT, GPT-2 class transformers) relative to one A100-40GB = 1.0, rounded to
two digits. It is a prior, not a measurement of the user's job: the task file can override it
(`skygreen.speed: {L4: 0.35}`), and a throughput measured by an earlier run of the same task
replaces it (see `skygreen cost`).

Sources (read 2026-11):
- Memory and board power (TDP): NVIDIA's product datasheets for each board; A10G is AWS's
  variant of the A10 with the A10's memory and a 300 W limit (AWS g5 documentation).
- Relative speed: Lambda's published "GPU benchmarks" for PyTorch training (fp16/bf16, single
  GPU; lambdalabs.com/gpu-benchmarks), NVIDIA's MLPerf Training submissions for H100 vs A100,
  and the ratio of dense fp16 tensor throughput where a board is absent from both (L4, L40S,
  A10G). Boards without tensor cores (P100, K80) use fp32 throughput.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    """One GPU model as SkyPilot's catalog names it."""

    name: str
    memory_gb: float
    tdp_w: float
    relative_speed: float
    """Training throughput relative to one A100-40GB."""
    bf16: bool
    """Native bfloat16 tensor cores (Ampere and newer)."""
    tensor_cores: bool
    """fp16 tensor cores (Volta and newer); without them mixed precision brings no speed."""
    released: int


GPUS: dict[str, GpuInfo] = {
    g.name: g
    for g in [
        GpuInfo(name="H200", memory_gb=141, tdp_w=700, relative_speed=2.4, bf16=True, tensor_cores=True, released=2024),
        GpuInfo(name="H100", memory_gb=80, tdp_w=700, relative_speed=2.2, bf16=True, tensor_cores=True, released=2022),
        GpuInfo(
            name="A100-80GB", memory_gb=80, tdp_w=400, relative_speed=1.1, bf16=True, tensor_cores=True, released=2020
        ),
        GpuInfo(name="A100", memory_gb=40, tdp_w=400, relative_speed=1.0, bf16=True, tensor_cores=True, released=2020),
        GpuInfo(name="L40S", memory_gb=48, tdp_w=350, relative_speed=0.8, bf16=True, tensor_cores=True, released=2023),
        GpuInfo(name="A10G", memory_gb=24, tdp_w=300, relative_speed=0.35, bf16=True, tensor_cores=True, released=2021),
        GpuInfo(name="A10", memory_gb=24, tdp_w=150, relative_speed=0.33, bf16=True, tensor_cores=True, released=2021),
        GpuInfo(name="L4", memory_gb=24, tdp_w=72, relative_speed=0.3, bf16=True, tensor_cores=True, released=2023),
        GpuInfo(
            name="V100", memory_gb=16, tdp_w=300, relative_speed=0.45, bf16=False, tensor_cores=True, released=2017
        ),
        GpuInfo(
            name="V100-32GB", memory_gb=32, tdp_w=300, relative_speed=0.45, bf16=False, tensor_cores=True, released=2018
        ),
        GpuInfo(name="T4", memory_gb=16, tdp_w=70, relative_speed=0.15, bf16=False, tensor_cores=True, released=2018),
        GpuInfo(
            name="P100", memory_gb=16, tdp_w=250, relative_speed=0.12, bf16=False, tensor_cores=False, released=2016
        ),
        GpuInfo(
            name="K80", memory_gb=12, tdp_w=300, relative_speed=0.05, bf16=False, tensor_cores=False, released=2014
        ),
    ]
}

GPU_NAMES: tuple[str, ...] = tuple(GPUS)


def canonical_gpu_name(name: str) -> str | None:
    """SkyPilot's spelling of a GPU name typed in any case, or None if unknown."""
    by_lower = {n.lower(): n for n in GPUS}
    return by_lower.get(str(name).lower())
