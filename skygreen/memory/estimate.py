"""GPU memory per GPU for training a transformer: model states, activations, logits, overhead.

    peak per GPU ~ model states / shards + activations(s, b) + logits(s, b, V) + context + allocator slack

as DeepSpeed's estimators, the EleutherAI cookbook (`calc/calc_transformer_mem.py`) and the
Ultra-Scale Playbook add the terms (the true peak is the larger of the backward and the optimizer
step peaks; adding them assumes gradient accumulation keeps gradients live while the next
micro-batch runs). GB are 1e9 bytes.

Model states, bytes per parameter (ZeRO paper, Rajbhandari et al., arXiv 1910.02054, section 3.1):
mixed precision keeps bf16 weights (2) and gradients (2), an fp32 master copy (4) and the
optimizer's state (AdamW 8, `skygreen.memory.method.OPTIMIZER_STATE_BYTES`): 16 for AdamW; fp32
training keeps no master copy (4 + 4 + 8 = 16). LoRA freezes the base at 2 bytes per parameter
and trains fp32 adapters (PEFT's default): 4 + 4 + optimizer state each. QLoRA stores the base's
linears in NF4 (0.516 bytes, `NF4_BYTES_PER_PARAM`), embeddings, head and norms in bf16.
FSDP FULL_SHARD (ZeRO-3) divides all of it over the run's GPUs and gathers the current and the
prefetched unit whole in bf16: + 2 x 2 bytes x the largest unit, DeepSpeed's `4 * largest_layer`
(`deepspeed/runtime/zero/stage3.py`, `estimate_zero3_model_states_mem_needs`, whose 18 bytes per
parameter also count fp32 gradients, PR #5099). DDP keeps all of it on every GPU.

Activations (Korthikanti et al., arXiv 2205.05198, section 4): a GPT layer stores
`s*b*h*(34 + 5*a*s/h)` bytes in 16-bit. Restated for Llama-style layers (SwiGLU, GQA, no
dropout): per token per layer 4h (norm inputs) + 2h (QKV input) + 2h (Q) + 4h_kv (K, V) + 2h
(attention output) + 2h (MLP input) + 8i (gate, up, silu, product) = 12h + 4h_kv + 8i; GPT-2
style layers use the paper's 34h. Flash attention / SDPA never stores the a*s^2 scores; eager
attention adds 5a*s per token per layer as the paper counts it (softmax output, dropout mask and
output), up to 7a*s when autocast keeps the softmax in fp32 (the high end). With full activation
checkpointing (HF `gradient_checkpointing`) only each layer's input (2h per token per layer)
stays, plus one layer's full set during its backward. QLoRA's `prepare_model_for_kbit_training`
upcasts the norms, so the residual stream and the checkpoints are fp32 (x2).

Logits and loss (absent from the paper; vram.asmirnov.xyz, ms-swift #6966, transformers #38452):
s*b*V*f bytes, f = 10 (bf16 logits 2 + fp32 upcast 4 + fp32 log-softmax 4), 6 to 16 over the
range (16 in HF's loss path at the backward peak).

Overhead no formula carries: the CUDA context and kernels, 0.5-1.5 GB (HF's model memory
anatomy measured 1.34 GB; the Playbook says 1-2 GB), NCCL's buffers 0.3-1.0 GB with several GPUs,
and the caching allocator's slack, 5-15% of the tensors (torchtune #1185).
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.memory.method import NF4_BYTES_PER_PARAM, OPTIMIZER_STATE_BYTES, Method, trainable_params
from skygreen.memory.shape import ModelShape

GB = 1e9
LOGITS_BYTES_PER_ELEMENT = (6.0, 10.0, 16.0)
"""(low, central, high) bytes per logit: bf16 logits + fp32 log-softmax; + fp32 upcast; HF's loss path."""
CONTEXT_GB = (0.5, 1.0, 1.5)
"""CUDA context and kernels per GPU (low, central, high)."""
NCCL_GB = (0.3, 0.65, 1.0)
"""NCCL communicators and buffers per GPU when a run has several GPUs."""
ALLOCATOR_SLACK = (0.05, 0.10, 0.15)
"""The caching allocator's reserved-but-unallocated memory, as a fraction of the tensors."""
EAGER_SCORE_BYTES = (5.0, 5.0, 7.0)
"""Bytes per a*s per token per layer that eager attention keeps (Korthikanti's 5; 7 with fp32 softmax)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What one GPU runs per micro-batch, and how."""

    seq_len: int = 2048
    micro_batch: int = 1
    activation_checkpointing: bool = True
    flash_attention: bool = True
    precision: str = "auto"
    """auto | bf16 | fp16 | fp32 (`skygreen.task.spec.PRECISIONS`); all but fp32 train in mixed precision."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEstimate:
    """One GPU's memory, by term, in GB; `low` and `high` bound the peak."""

    states: float
    activations: float
    logits: float
    overhead: float
    low: float
    high: float

    @property
    def total(self) -> float:
        """The central estimate: the four terms added."""
        return self.states + self.activations + self.logits + self.overhead

    def as_dict(self) -> dict[str, float]:
        """The `memory_gb_per_gpu` record of `plan --json`, rounded to MB."""
        return {k: round(getattr(self, k), 3) for k in ("states", "activations", "logits", "overhead", "low", "high")}


def _mixed(precision: str) -> bool:
    return precision != "fp32"


def state_bytes(*, params: float, shape: ModelShape | None, method: Method, precision: str) -> float:
    """Weights, gradients, master copy and optimizer state of the whole model, unsharded."""
    half = 2.0 if _mixed(precision) else 4.0
    optimizer = OPTIMIZER_STATE_BYTES[method.optimizer]
    if not method.adapters:
        master = 4.0 if _mixed(precision) else 0.0
        return params * (half + half + master + optimizer)
    adapters = trainable_params(shape, params, method) * (4.0 + 4.0 + optimizer)
    if method.kind == "lora":
        return params * half + adapters
    quantized = params if shape is None else float(shape.layers * shape.linear_params_per_layer)
    return quantized * NF4_BYTES_PER_PARAM + (params - quantized) * half + adapters


def gathered_bytes(shape: ModelShape | None, params: float, precision: str) -> float:
    """What FSDP holds unsharded beside the shards: the current and the prefetched unit, 16-bit
    (DeepSpeed's 4 x largest layer). Without a shape, a unit is taken as 1/32 of the model."""
    unit = params / 32 if shape is None else shape.largest_unit_params
    return 2 * unit * (2.0 if _mixed(precision) else 4.0)


def activation_bytes(shape: ModelShape, method: Method, work: Workload, *, eager_bytes: float = 5.0) -> float:
    """Activations saved for the backward pass on one GPU (see the module docstring)."""
    s, b, h = work.seq_len, work.micro_batch, shape.hidden
    if shape.style == "llama":
        per_token_layer = 12.0 * h + 4.0 * shape.kv_dim + 8.0 * shape.intermediate
    else:
        per_token_layer = 34.0 * h
    if not work.flash_attention:
        per_token_layer += eager_bytes * shape.heads * s
    scale = 1.0 if _mixed(work.precision) else 2.0
    if not work.activation_checkpointing:
        return shape.layers * s * b * per_token_layer * scale
    checkpoint = 2.0 * h * (2.0 if method.kind == "qlora" or not _mixed(work.precision) else 1.0)
    return (shape.layers * s * b * checkpoint + s * b * per_token_layer) * scale


def estimate_memory(
    *,
    params: float,
    shape: ModelShape | None,
    method: Method,
    work: Workload,
    total_gpus: int,
    sharded: bool,
    activation_gb: float | None = None,
) -> MemoryEstimate:
    """One GPU's memory for a run on `total_gpus` GPUs, states sharded over them when `sharded`.

    Without a shape, activations are `activation_gb` (0 when not given) and logits 0: the
    estimate then counts what the task says and no more.

    Raises:
        ValueError: for fewer than one GPU.
    """
    if total_gpus < 1:
        raise ValueError(f"total_gpus must be >= 1, got {total_gpus}")
    states = state_bytes(params=params, shape=shape, method=method, precision=work.precision)
    if sharded and total_gpus > 1:
        states = states / total_gpus + gathered_bytes(shape, params, work.precision)
    acts: tuple[float, ...]
    if activation_gb is not None:
        acts = (activation_gb * GB,) * 3
    elif shape is None:
        acts = (0.0, 0.0, 0.0)
    else:
        acts = tuple(activation_bytes(shape, method, work, eager_bytes=e) for e in EAGER_SCORE_BYTES)
    tokens = work.seq_len * work.micro_batch
    logits = tuple(0.0 if shape is None else tokens * shape.vocab * f for f in LOGITS_BYTES_PER_ELEMENT)
    bounds = []
    for i in range(3):
        tensors = states + acts[i] + logits[i]
        fixed = CONTEXT_GB[i] * GB + (NCCL_GB[i] * GB if total_gpus > 1 else 0.0)
        bounds.append((tensors, fixed + ALLOCATOR_SLACK[i] * tensors))
    return MemoryEstimate(
        states=states / GB,
        activations=acts[1] / GB,
        logits=logits[1] / GB,
        overhead=bounds[1][1] / GB,
        low=sum(bounds[0]) / GB,
        high=sum(bounds[2]) / GB,
    )
