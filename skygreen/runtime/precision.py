"""Which number format a run trains in, decided from plain facts about the device.

Mixed precision is the cheapest switch there is, but not everywhere: bf16 needs Ampere or
newer tensor cores; fp16 needs tensor cores (Volta and newer) to be faster, and a GradScaler
to keep small gradients from underflowing; before 2019 (Pascal, Kepler) there are no tensor
cores, mixed precision brings no speed and risks instability, so `auto` stays in fp32 there
and says so in one line. On CPU, bf16 autocast works but is only fast on CPUs with bf16
matrix units, so `auto` means fp32 there and an explicit fp16 becomes bf16 (CPU autocast has
no use for a loss scaler).

Pure: no torch import. The runtime turns a `PrecisionChoice` into autocast and a GradScaler.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.errors import RuntimeSetupError
from skygreen.gpus import GPUS, canonical_gpu_name
from skygreen.task.spec import PRECISIONS

DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceFacts:
    """What the precision decision needs to know about the device a rank trains on."""

    kind: str
    """cpu | cuda"""
    name: str = "cpu"
    """The device's own name, e.g. 'NVIDIA A100-SXM4-40GB'; recorded to notice a GPU change on resume."""
    bf16: bool = False
    """bf16 tensor cores (compute capability 8.0 and newer)."""
    tensor_cores: bool = False
    """fp16 tensor cores (compute capability 7.0 and newer)."""

    def __post_init__(self) -> None:
        if self.kind not in DEVICE_KINDS:
            raise ValueError(f"DeviceFacts.kind must be one of {DEVICE_KINDS}, got {self.kind!r}")


def cpu_facts() -> DeviceFacts:
    """The facts of a CPU: kind `cpu`, neither bf16 nor tensor cores."""
    return DeviceFacts(kind="cpu", name="cpu")


def cuda_facts(name: str, capability: tuple[int, int]) -> DeviceFacts:
    """Facts for a CUDA device from its compute capability (what torch reports)."""
    major, minor = capability
    return DeviceFacts(kind="cuda", name=name, bf16=(major, minor) >= (8, 0), tensor_cores=(major, minor) >= (7, 0))


def catalog_facts(gpu: str) -> DeviceFacts:
    """Facts for a GPU by its catalog name (`skygreen.gpus`), e.g. to preview a plan's precision."""
    name = canonical_gpu_name(gpu)
    if name is None:
        raise RuntimeSetupError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    info = GPUS[name]
    return DeviceFacts(kind="cuda", name=name, bf16=info.bf16, tensor_cores=info.tensor_cores)


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionChoice:
    """The number format a rank trains in, whether it needs a GradScaler, and what was asked for."""

    precision: str
    """bf16 | fp16 | fp32: the autocast dtype, or none for fp32."""
    grad_scaler: bool
    """fp16 only: scale the loss so that small gradients survive in half precision."""
    requested: str
    warning: str | None = None
    """One line for the log when the choice differs from what a user might expect."""

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"PrecisionChoice.precision must be bf16, fp16 or fp32, got {self.precision!r}")
        if self.grad_scaler and self.precision != "fp16":
            raise ValueError("a GradScaler is only used with fp16")


def choose_precision(requested: str, device: DeviceFacts) -> PrecisionChoice:
    """The format to train in for `requested` (auto | bf16 | fp16 | fp32) on `device`."""
    if requested not in PRECISIONS:
        raise RuntimeSetupError(f"precision: unknown value {requested!r}\n  allowed: {', '.join(PRECISIONS)}")
    if device.kind == "cpu":
        return _choose_on_cpu(requested)
    return _choose_on_gpu(requested, device)


def _choose_on_cpu(requested: str) -> PrecisionChoice:
    if requested in ("auto", "fp32"):
        return PrecisionChoice(precision="fp32", grad_scaler=False, requested=requested)
    warning = None
    if requested == "fp16":
        warning = "precision fp16 on CPU: training in bf16 autocast instead (CPU autocast needs no loss scaler)"
    return PrecisionChoice(precision="bf16", grad_scaler=False, requested=requested, warning=warning)


def _choose_on_gpu(requested: str, device: DeviceFacts) -> PrecisionChoice:
    if requested == "auto":
        if device.bf16:
            return PrecisionChoice(precision="bf16", grad_scaler=False, requested=requested)
        if device.tensor_cores:
            return PrecisionChoice(precision="fp16", grad_scaler=True, requested=requested)
        return PrecisionChoice(
            precision="fp32",
            grad_scaler=False,
            requested=requested,
            warning=f"precision auto: {device.name} has no tensor cores, so mixed precision would bring no "
            "speed and risk instability; training in fp32",
        )
    if requested == "bf16" and not device.bf16:
        raise RuntimeSetupError(
            f"precision bf16: {device.name} has no bf16 tensor cores (they start with Ampere, compute capability 8.0)\n"
            "  fix: use precision auto (fp16 with a loss scaler on this GPU) or fp16"
        )
    if requested == "fp16":
        warning = None
        if not device.tensor_cores:
            warning = f"precision fp16: {device.name} has no tensor cores; expect no speed-up over fp32"
        return PrecisionChoice(precision="fp16", grad_scaler=True, requested=requested, warning=warning)
    return PrecisionChoice(precision=requested, grad_scaler=False, requested=requested)
