"""NVML (the `pynvml` module of NVIDIA's nvidia-ml-py) behind one adapter with an error table.

Every NVML call the runtime makes goes through `NvmlGpu`, which turns the library's errors
into `NvmlError` with a `reason` from `REASONS`: no permission, not supported (an energy
counter before Volta, power limits on some cloud GPUs), GPU lost, library missing; any other
NVML error reads as "failed". Callers decide per reason (warn and meter only, or stop).

pynvml is imported when a GPU is first opened, never at module level: the laptop and CPU
runs never load it. `lib` stands for the pynvml module, so tests hand in a fake that raises
the real library's errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from skygreen.errors import NvmlError

T = TypeVar("T")

REASONS: dict[str, tuple[str, str]] = {
    # NVML return code: (reason, what it means, for the message)
    "NVML_ERROR_NO_PERMISSION": ("permission", "not permitted (changing power limits needs root)"),
    "NVML_ERROR_NOT_SUPPORTED": ("not supported", "this GPU or its driver does not support it"),
    "NVML_ERROR_GPU_IS_LOST": ("gpu lost", "the GPU fell off the bus or stopped responding"),
    "NVML_ERROR_LIBRARY_NOT_FOUND": ("library missing", "libnvidia-ml (the NVIDIA driver) was not found"),
    "NVML_ERROR_DRIVER_NOT_LOADED": ("library missing", "the NVIDIA driver is not loaded"),
    "NVML_ERROR_FUNCTION_NOT_FOUND": ("not supported", "the installed driver is too old for this call"),
}


def translate(error: BaseException, lib: Any, doing: str) -> NvmlError:
    """The `NvmlError` for an error of NVML's while `doing` something (the cause stays attached)."""
    code = getattr(error, "value", None)
    for name, (reason, meaning) in REASONS.items():
        if code is not None and code == getattr(lib, name, object()):
            return NvmlError(f"NVML: cannot {doing}: {meaning} ({error})", reason=reason)
    return NvmlError(f"NVML: cannot {doing}: {error}", reason="failed")


class NvmlGpu:
    """One GPU as NVML sees it."""

    def __init__(self, handle: Any, lib: Any) -> None:
        self.handle = handle
        self.lib = lib

    @classmethod
    def by_uuid(cls, uuid: str, lib: Any = None) -> NvmlGpu:
        """The GPU with this UUID (as torch reports it, without the `GPU-` prefix)."""
        if lib is None:
            try:
                import pynvml
            except ImportError as e:
                raise NvmlError(
                    "NVML: the pynvml module is not installed\n  fix: pip install nvidia-ml-py",
                    reason="library missing",
                ) from e
            lib = pynvml
        gpu = cls(None, lib)
        gpu._call("initialise", lib.nvmlInit)
        gpu.handle = gpu._call(f"find GPU-{uuid}", lib.nvmlDeviceGetHandleByUUID, f"GPU-{uuid}")
        return gpu

    def total_energy_mj(self) -> int:
        """The GPU's total energy counter since the driver loaded, in millijoules (Volta and newer)."""
        return int(
            self._call("read the total energy counter", self.lib.nvmlDeviceGetTotalEnergyConsumption, self.handle)
        )

    def power_limit_w(self) -> float:
        """The power limit in force, in watts (read only)."""
        return self._call("read the power limit", self.lib.nvmlDeviceGetPowerManagementLimit, self.handle) / 1000.0

    def power_w(self) -> float:
        """The board's power draw now, in watts."""
        return self._call("read the power draw", self.lib.nvmlDeviceGetPowerUsage, self.handle) / 1000.0

    def _call(self, doing: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except getattr(self.lib, "NVMLError", Exception) as e:
            raise translate(e, self.lib, doing) from e
