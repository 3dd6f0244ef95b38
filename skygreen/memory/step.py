"""One training step's time on an offer: compute against communication over its links.

Compute per GPU per micro-batch = FLOPs / (the GPU's dense bf16 peak x MFU): 6 x params x tokens
for full training (Kaplan et al. 2020, arXiv 2001.08361: 2 forward + 4 backward), 4 x params x
tokens when the base is frozen (LoRA and QLoRA skip the weight gradients), + 2 x params x tokens
when activation checkpointing runs the forward again. The peak is the A100's 312 TFLOP/s (NVIDIA
A100 datasheet) times the GPU's relative speed (`skygreen.gpus`), at `MFU` = 0.4, a typical
model FLOPs utilisation of FSDP fine-tuning (the Ultra-Scale Playbook reports 30-50%).

Communication (ring collectives, NCCL; the Playbook's data-parallel section): DDP all-reduces the
gradients once per optimizer step, 2(N-1)/N of their bytes per GPU; FSDP FULL_SHARD all-gathers the
weights in the forward and again in the backward and reduce-scatters the gradients, every
micro-batch, (N-1)/N of the bytes each (3 x in all for full training, ZeRO paper section 7). Over
several nodes the collectives run hierarchically: the node's GPUs split the buffer over NVLink or
PCIe, then each node's network carries its whole share: (n-1)/n x bytes / network per node. Links
reach `LINK_EFFICIENCY` of their nominal rate (NCCL's bus bandwidth on NVSwitch A100s is about
230 of 300 GB/s).

Communication overlaps the backward pass (PyTorch DDP's bucketed all-reduce, Li et al., VLDB 2020;
FSDP's prefetch does the same for the gathers), which is 2/3 of a step's FLOPs: only the part of
the communication longer than that shows. The step's efficiency = compute / (compute + exposed).
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.memory.interconnect import Interconnect
from skygreen.memory.method import NF4_BYTES_PER_PARAM, Method

A100_BF16_FLOPS = 312e12
MFU = 0.4
LINK_EFFICIENCY = 0.75
OVERLAP_FRACTION = 2.0 / 3.0


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTime:
    """Seconds per optimizer step on one GPU of the run, and the fraction of it that trains."""

    compute_s: float
    communication_s: float
    exposed_s: float

    @property
    def efficiency(self) -> float:
        """compute / (compute + exposed communication): 1.0 when the network keeps up."""
        return self.compute_s / (self.compute_s + self.exposed_s)

    @property
    def communication_bound(self) -> bool:
        """More time communicating than computing."""
        return self.communication_s > self.compute_s


def compute_s(*, params: float, method: Method, tokens: int, checkpointing: bool, relative_speed: float) -> float:
    """Seconds of compute for `tokens` tokens on one GPU (see the module docstring)."""
    flops_per_token = (4.0 if method.adapters else 6.0) + (2.0 if checkpointing else 0.0)
    return flops_per_token * params * tokens / (A100_BF16_FLOPS * relative_speed * MFU)


def collective_s(buffer_bytes: float, *, gpus_per_node: int, nodes: int, link: Interconnect) -> float:
    """One all-gather or reduce-scatter of a buffer of `buffer_bytes`, hierarchical over nodes."""
    intra = (gpus_per_node - 1) / gpus_per_node * buffer_bytes / (link.intra_node_gb_per_s * 1e9)
    inter = (nodes - 1) / nodes * buffer_bytes / (link.network_gb_per_s * 1e9) if nodes > 1 else 0.0
    return (intra + inter) / LINK_EFFICIENCY


def communication_s(
    *,
    params: float,
    trainable: float,
    method: Method,
    sharded: bool,
    accumulation: int,
    gpus_per_node: int,
    nodes: int,
    link: Interconnect,
) -> float:
    """Seconds of communication per optimizer step of `accumulation` micro-batches."""
    if gpus_per_node * nodes <= 1:
        return 0.0
    grad_bytes = trainable * (4.0 if method.adapters else 2.0)
    reduce = collective_s(grad_bytes, gpus_per_node=gpus_per_node, nodes=nodes, link=link)
    if not sharded:
        return 2 * reduce  # an all-reduce: reduce-scatter then all-gather
    weight_bytes = params * (NF4_BYTES_PER_PARAM if method.kind == "qlora" else 2.0)
    gather = collective_s(weight_bytes, gpus_per_node=gpus_per_node, nodes=nodes, link=link)
    return accumulation * (2 * gather + reduce)


def step_time(
    *,
    params: float,
    trainable: float,
    method: Method,
    sharded: bool,
    tokens_per_micro_batch: int,
    accumulation: int,
    checkpointing: bool,
    relative_speed: float,
    gpus_per_node: int,
    nodes: int,
    link: Interconnect,
) -> StepTime:
    """An optimizer step's compute and communication on one GPU of `gpus_per_node` x `nodes`."""
    compute = accumulation * compute_s(params=params, method=method, tokens=tokens_per_micro_batch,
                                       checkpointing=checkpointing, relative_speed=relative_speed)  # fmt: skip
    comm = communication_s(params=params, trainable=trainable, method=method, sharded=sharded,
                           accumulation=accumulation, gpus_per_node=gpus_per_node, nodes=nodes, link=link)  # fmt: skip
    exposed = max(0.0, comm - OVERLAP_FRACTION * compute)
    return StepTime(compute_s=compute, communication_s=comm, exposed_s=exposed)
