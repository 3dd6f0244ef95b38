"""How a model is trained: full fine-tuning, LoRA or QLoRA, and with which optimizer.

LoRA (Hu et al., arXiv 2106.09685) adds, to each adapted matrix W (d_out x d_in), two matrices of
rank r: r*(d_in + d_out) trainable parameters. QLoRA (Dettmers et al., arXiv 2305.14314) keeps the
frozen base in 4-bit NF4 with double quantization: 4 bits + 8/64 + 32/(64*256) bits of constants
= 4.127 bits, about 0.516 bytes per parameter of the quantized linears.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.memory.shape import ModelShape

METHODS: tuple[str, ...] = ("full", "lora", "qlora")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw8bit", "sgd", "adafactor")
LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers LoRA may adapt, as PEFT names them in Llama-style models."""
ALL_LINEAR = "all-linear"
"""PEFT's `target_modules="all-linear"`: every linear of every layer."""
DEFAULT_LORA_R = 16
DEFAULT_LORA_TARGETS: tuple[str, ...] = ("q_proj", "v_proj")
"""PEFT's own default for Llama models (its `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`)."""

NF4_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8
"""NF4 storage plus double-quantized constants (QLoRA paper, section 3): 0.516 bytes."""
OPTIMIZER_STATE_BYTES: dict[str, float] = {"adamw": 8.0, "adamw8bit": 2.0, "sgd": 4.0, "adafactor": 0.0}
"""Optimizer state per trainable parameter: AdamW's fp32 momentum and variance (ZeRO paper, K=12
with the master copy); bitsandbytes' 8-bit AdamW keeps both in one byte each; SGD with momentum one
fp32 buffer; Adafactor (HF default, no momentum) factors the second moment into a row and a column
vector, negligible next to the weights."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Method:
    """The training method, with the defaults the task file documents."""

    kind: str = "full"
    lora_r: int = DEFAULT_LORA_R
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        if self.kind not in METHODS:
            raise ValueError(f"Method.kind must be one of {METHODS}, got {self.kind!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Method.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.lora_r < 1:
            raise ValueError(f"Method.lora_r must be >= 1, got {self.lora_r}")
        unknown = [t for t in self.lora_targets if t not in (*LORA_TARGETS, ALL_LINEAR)]
        if unknown or not self.lora_targets:
            raise ValueError(f"Method.lora_targets must name some of {LORA_TARGETS} or {ALL_LINEAR!r}, got {unknown}")

    @property
    def adapters(self) -> bool:
        """LoRA or QLoRA: the base is frozen and only the adapters train."""
        return self.kind != "full"


def lora_params(shape: ModelShape, method: Method) -> int:
    """Trainable adapter parameters: r*(d_in + d_out) per adapted matrix per layer. A target the
    model lacks (gate_proj in GPT-2) adapts nothing. Llama-2-7B: r=16 on q,k,v,o 16,777,216;
    r=64 on all linears 159,907,840."""
    linears = shape.linear_shapes()
    names = (
        linears if ALL_LINEAR in method.lora_targets else {t: linears[t] for t in method.lora_targets if t in linears}
    )
    per_layer = sum(method.lora_r * (linears[name][0] + linears[name][1]) for name in names)
    return shape.layers * per_layer


def trainable_params(shape: ModelShape | None, params: float, method: Method) -> float:
    """What the optimizer updates: every parameter for full fine-tuning, the adapters otherwise
    (which needs the shape; without one, LoRA is taken at 1% of the parameters, a typical r=16
    on attention for 7B models is 0.25%, r=64 on all linears 2.4%)."""
    if not method.adapters:
        return params
    if shape is None:
        return params * 0.01
    return float(lora_params(shape, method))
