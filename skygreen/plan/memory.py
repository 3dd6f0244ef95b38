"""How much GPU memory a task's model needs per GPU, and how big its checkpoint is.

The plan's face of `skygreen.memory`: the task's `model:` section (`skygreen.task.spec.ModelSpec`) turned
into one GPU's memory by term (model states, activations, logits, overhead) with a low-high range.
A GPU holds the model when the high end fits its nominal memory; the rest is the headroom. The
terms and their sources are in `skygreen.memory.estimate`: AdamW in mixed precision holds 16 bytes
per parameter (ZeRO paper, arXiv 1910.02054, section 3.1), so a 7B full fine-tune needs 112 GB of
model states over the GPUs of an offer, sharded under FSDP (ZeRO stage 3), whole on each GPU
under DDP.

The checkpoint stores what resuming needs: the fp32 weights (or fp16/bf16 ones with
`checkpoint.half_precision`) and the two AdamW moments, 12 bytes per parameter (10 with half
precision weights); gradients are not saved. GB here are 1e9 bytes, as the paper counts them.
"""

from __future__ import annotations

from skygreen.memory.estimate import MemoryEstimate, Workload, estimate_memory
from skygreen.memory.method import OPTIMIZER_STATE_BYTES, trainable_params
from skygreen.memory.planned import PlannedMemory
from skygreen.task.spec import ModelSpec

GB = 1e9
WEIGHT_BYTES = {"fp16": 2, "bf16": 2, "auto": 2, "fp32": 4}
"""Bytes of the weights and gradients the forward and backward passes use, per parameter;
`auto` trains in mixed precision wherever the GPU has tensor cores."""
MASTER_BYTES = {"fp16": 4, "bf16": 4, "auto": 4, "fp32": 0}
"""fp32 master weights kept beside half-precision ones; none when training in fp32."""
ADAM_MOMENT_BYTES = 8
"""Momentum and variance, fp32 each."""
CHECKPOINT_WEIGHT_BYTES = {None: 4, "fp16": 2, "bf16": 2}


def bytes_per_param(precision: str) -> int:
    """Training state bytes per parameter under AdamW at `precision` (16 for all of them, see
    the module docstring); a `KeyError` for an unknown precision."""
    weights = WEIGHT_BYTES[precision]
    return weights + weights + MASTER_BYTES[precision] + ADAM_MOMENT_BYTES


def workload(model: ModelSpec, precision: str) -> Workload:
    """What one GPU runs per micro-batch, from the task's `model:` and `precision`."""
    return Workload(seq_len=model.seq_len, micro_batch=model.micro_batch, precision=precision,
                    activation_checkpointing=model.activation_checkpointing, flash_attention=model.flash_attention)  # fmt: skip


def memory_need(model: ModelSpec, *, precision: str, total_gpus: int) -> MemoryEstimate:
    """One GPU's memory for `model` on `total_gpus` GPUs (states sharded over all of them under
    FSDP, whole under DDP), by term and as a range.

    Raises:
        ValueError: for fewer than one GPU.
    """
    return estimate_memory(
        params=model.params,
        shape=model.shape,
        method=model.method,
        work=workload(model, precision),
        total_gpus=total_gpus,
        sharded=model.sharding == "fsdp",
        activation_gb=model.activation_gb,
    )


def planned_memory(model: ModelSpec | None, *, precision: str, total_gpus: int) -> PlannedMemory | None:
    """The estimate `skygreen up` hands the runtime for a run on `total_gpus` GPUs (the plan's
    first offer's, or the task's own count for a local run), to be met in the ledger by the peak
    the runtime measures; None for a task without `model:`."""
    if model is None:
        return None
    return PlannedMemory.of(memory_need(model, precision=precision, total_gpus=total_gpus), gpus=total_gpus)


def fits(need: MemoryEstimate, gpu_memory_gb: float) -> bool:
    """True when the high end of the estimate fits a GPU of `gpu_memory_gb` nominal GB."""
    return need.high <= gpu_memory_gb


def checkpoint_gb(model: ModelSpec, *, half_precision: str | None = None) -> float:
    """The size of one checkpoint, all shards together: what the optimizer updates and its state.
    A full fine-tune saves every weight and, with AdamW, both moments (12 bytes per parameter); a
    LoRA or QLoRA run saves its adapters alone (`skygreen.runtime.frozen_base` names the frozen base
    by its digest instead of saving it), megabytes where the full state is 84 GB for 7B. This size
    sets the save and restore times, the interval and the bytes the bill prices."""
    trained = trainable_params(model.shape, model.params, model.method)
    state_bytes = OPTIMIZER_STATE_BYTES[model.method.optimizer]
    return trained * (CHECKPOINT_WEIGHT_BYTES[half_precision] + state_bytes) / GB


def smallest_nodes(model: ModelSpec, *, precision: str, gpu_memory_gb: float, gpus_per_node: int) -> int | None:
    """The fewest nodes of `gpus_per_node` GPUs that hold the model, up to `model.max_nodes`;
    None when even that many cannot (always None under DDP when one GPU cannot)."""
    for nodes in range(1, model.max_nodes + 1):
        if fits(memory_need(model, precision=precision, total_gpus=gpus_per_node * nodes), gpu_memory_gb):
            return nodes
    return None
