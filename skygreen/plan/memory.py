"""How much GPU memory a model's training state needs, and how big its checkpoint is.

Pure arithmetic on the task's `model:` section (`skygreen.spec.ModelSpec`), after the ZeRO paper
(Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
SC'20, arXiv 1910.02054, section 3.1): AdamW training holds, per parameter,

    mixed precision (fp16/bf16): 2 (half weights) + 2 (half gradients)
                                 + 4 (fp32 master weights) + 4 (momentum) + 4 (variance) = 16 bytes
    fp32:                        4 (weights) + 4 (gradients) + 4 (momentum) + 4 (variance) = 16 bytes

so 16 x params bytes whatever the precision (`auto` included). DDP keeps all of it on every GPU;
FSDP (ZeRO stage 3) shards it over every GPU of the run: 16 x params / (GPUs x nodes). The
task's activation memory per GPU comes on top, unsharded. A GPU holds the total when it fits in
`USABLE_FRACTION` of its nominal memory (the rest: the CUDA context, the allocator's
fragmentation, communication buffers).

The checkpoint stores what resuming needs: the fp32 weights (or fp16/bf16 ones with
`checkpoint.half_precision`) and the two AdamW moments, 12 bytes per parameter (10 with half
precision weights); gradients are not saved. GB here are 1e9 bytes, as the paper counts them.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.spec import ModelSpec

GB = 1e9
WEIGHT_BYTES = {"fp16": 2, "bf16": 2, "auto": 2, "fp32": 4}
"""Bytes of the weights and gradients the forward and backward passes use, per parameter;
`auto` trains in mixed precision wherever the GPU has tensor cores."""
MASTER_BYTES = {"fp16": 4, "bf16": 4, "auto": 4, "fp32": 0}
"""fp32 master weights kept beside half-precision ones; none when training in fp32."""
ADAM_MOMENT_BYTES = 8
"""Momentum and variance, fp32 each."""
USABLE_FRACTION = 0.9
CHECKPOINT_WEIGHT_BYTES = {None: 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryNeed:
    """The memory one GPU needs for a model on a given number of GPUs, in GB (1e9 bytes)."""

    state_gb: float
    """Weights, gradients and optimizer states on this GPU (a shard under FSDP)."""
    activation_gb: float
    total_gpus: int
    sharding: str

    @property
    def per_gpu_gb(self) -> float:
        """Everything this GPU holds: its state plus the activations."""
        return self.state_gb + self.activation_gb

    def fits(self, gpu_memory_gb: float) -> bool:
        """True when the need fits in the usable part of a GPU of `gpu_memory_gb`."""
        return self.per_gpu_gb <= gpu_memory_gb * USABLE_FRACTION


def bytes_per_param(precision: str) -> int:
    """Training state bytes per parameter under AdamW at `precision` (16 for all of them, see
    the module docstring); a `KeyError` for an unknown precision."""
    weights = WEIGHT_BYTES[precision]
    return weights + weights + MASTER_BYTES[precision] + ADAM_MOMENT_BYTES


def memory_need(model: ModelSpec, *, precision: str, total_gpus: int) -> MemoryNeed:
    """What each of `total_gpus` GPUs holds for `model` (state sharded over all of them under
    FSDP, whole under DDP), plus the task's activation memory.

    Raises:
        ValueError: for fewer than one GPU.
    """
    if total_gpus < 1:
        raise ValueError(f"total_gpus must be >= 1, got {total_gpus}")
    state_gb = model.params * bytes_per_param(precision) / GB
    if model.sharding == "fsdp":
        state_gb /= total_gpus
    return MemoryNeed(
        state_gb=state_gb, activation_gb=model.activation_gb, total_gpus=total_gpus, sharding=model.sharding
    )


def checkpoint_gb(model: ModelSpec, *, half_precision: str | None = None) -> float:
    """The size of one full checkpoint, all shards together: weights plus the AdamW moments."""
    return model.params * (CHECKPOINT_WEIGHT_BYTES[half_precision] + ADAM_MOMENT_BYTES) / GB


def smallest_nodes(model: ModelSpec, *, precision: str, gpu_memory_gb: float, gpus_per_node: int) -> int | None:
    """The fewest nodes of `gpus_per_node` GPUs that hold the model, up to `model.max_nodes`;
    None when even that many cannot (always None under DDP when one GPU cannot)."""
    for nodes in range(1, model.max_nodes + 1):
        if memory_need(model, precision=precision, total_gpus=gpus_per_node * nodes).fits(gpu_memory_gb):
            return nodes
    return None
