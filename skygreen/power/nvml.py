"""The one adapter around NVML (`pynvml`, from NVIDIA's `nvidia-ml-py`).

NVML speaks milliwatts and millijoules; everything above this module speaks watts and joules
(`power_limit_w`, `energy_j`). Every NVML error is translated by `ERROR_TABLE` into one of
skygreen's `PowerError` classes with `raise ... from e`, so callers never see `pynvml`.

`pynvml` is imported lazily, on the first `Nvml()`: the CLI's start-up and planning paths never
load it. With `SKYGREEN_SIMULATED_GPU=<GPU name>` the library is `skygreen.power.simulated`
instead, a stand-in with the same functions, and every device says `simulated = True`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skygreen.errors import (
    GpuLostError,
    NvmlMissingError,
    PowerError,
    PowerNotSupportedError,
    PowerPermissionError,
    RuntimeSetupError,
)
from skygreen.power.simulated import SIMULATED_GPU_ENV, library

# NVML return codes (nvml.h); pynvml raises NVMLError with `.value` set to one of them.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

ERROR_TABLE: Mapping[int, tuple[type[PowerError], str]] = {
    NVML_ERROR_NO_PERMISSION: (
        PowerPermissionError,
        (
            "no permission to {action}\n  fix: run as root, or give the container CAP_SYS_ADMIN "
            "(docker run --cap-add SYS_ADMIN); reading power and energy needs no permission"
        ),
    ),
    NVML_ERROR_NOT_SUPPORTED: (PowerNotSupportedError, "{action}: not supported on this GPU or driver"),
    NVML_ERROR_GPU_IS_LOST: (GpuLostError, "{action}: the GPU is lost (fell off the bus or stopped answering)"),
    NVML_ERROR_LIBRARY_NOT_FOUND: (NvmlMissingError, "{action}: the NVML library (libnvidia-ml) is not installed"),
    NVML_ERROR_DRIVER_NOT_LOADED: (NvmlMissingError, "{action}: the NVIDIA driver is not loaded"),
    NVML_ERROR_INVALID_ARGUMENT: (PowerError, "{action}: NVML rejected the value (outside the GPU's allowed range?)"),
}


def translate(error: Exception, action: str) -> PowerError:
    """skygreen's error for an NVML error raised while doing `action`."""
    code = getattr(error, "value", None)
    cls, template = ERROR_TABLE.get(code, (PowerError, "{action} failed: NVML error {code}: {error}"))  # type: ignore[arg-type]
    return cls(template.format(action=action, code=code, error=error))


def load_library(environ: Mapping[str, str] | None = None) -> Any:
    """`pynvml`, or the simulated GPU when `SKYGREEN_SIMULATED_GPU` names one."""
    environ = os.environ if environ is None else environ
    if environ.get(SIMULATED_GPU_ENV):
        try:
            return library(environ)
        except ValueError as e:
            raise RuntimeSetupError(str(e)) from None
    try:
        import pynvml
    except ImportError as e:
        raise NvmlMissingError(
            "NVML is not available: the `pynvml` module is missing\n"
            "  fix: pip install nvidia-ml-py (part of skygreen[runtime])"
        ) from e
    return pynvml


class Nvml:
    """An initialised NVML library and the devices it sees."""

    def __init__(self, lib: Any = None, *, environ: Mapping[str, str] | None = None) -> None:
        self.lib = lib if lib is not None else load_library(environ)
        self.simulated = bool(getattr(self.lib, "SIMULATED", False))
        self._call("initialising NVML", self.lib.nvmlInit)

    def _call(self, action: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except PowerError:
            raise
        except Exception as e:
            if type(e).__name__.startswith("NVMLError") or hasattr(e, "value"):
                raise translate(e, action) from e
            raise

    def device_count(self) -> int:
        """How many GPUs NVML sees."""
        return int(self._call("counting GPUs", self.lib.nvmlDeviceGetCount))

    def device(self, index: int) -> Gpu:
        """The GPU at NVML index `index`, with its name and UUID read."""
        handle = self._call(f"opening GPU {index}", self.lib.nvmlDeviceGetHandleByIndex, index)
        return self._gpu(index, handle)

    def device_by_uuid(self, uuid: str) -> Gpu:
        """The GPU with this UUID, with its NVML index, name and UUID read."""
        handle = self._call(f"opening GPU {uuid}", self.lib.nvmlDeviceGetHandleByUUID, uuid)
        index = int(self._call(f"reading the index of GPU {uuid}", self.lib.nvmlDeviceGetIndex, handle))
        return self._gpu(index, handle)

    def devices(self) -> list[Gpu]:
        """Every GPU NVML sees, in index order."""
        return [self.device(i) for i in range(self.device_count())]

    def _gpu(self, index: int, handle: Any) -> Gpu:
        name = self._call(f"reading the name of GPU {index}", self.lib.nvmlDeviceGetName, handle)
        uuid = self._call(f"reading the UUID of GPU {index}", self.lib.nvmlDeviceGetUUID, handle)
        return Gpu(
            nvml=self,
            handle=handle,
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            simulated=self.simulated,
        )


@dataclass(kw_only=True, eq=False)
class Gpu:
    """One device, in watts and joules."""

    nvml: Nvml
    handle: Any
    index: int
    name: str
    uuid: str
    simulated: bool = False

    def _call(self, action: str, fn_name: str, *args: Any) -> Any:
        return self.nvml._call(f"{action} of GPU {self.index}", getattr(self.nvml.lib, fn_name), self.handle, *args)

    def power_limit_w(self) -> float:
        """The power limit in force now, in watts."""
        return self._call("reading the power limit", "nvmlDeviceGetPowerManagementLimit") / 1000.0

    def default_limit_w(self) -> float:
        """The board's default power limit, in watts: what it runs at when nobody caps it."""
        return self._call("reading the default power limit", "nvmlDeviceGetPowerManagementDefaultLimit") / 1000.0

    def limit_range_w(self) -> tuple[float, float]:
        """(min, max) power limit the board accepts."""
        low_mw, high_mw = self._call("reading the power limit range", "nvmlDeviceGetPowerManagementLimitConstraints")
        return low_mw / 1000.0, high_mw / 1000.0

    def set_power_limit_w(self, power_limit_w: float) -> None:
        """Needs root or CAP_SYS_ADMIN (`PowerPermissionError` otherwise); NVML takes whole milliwatts."""
        self._call(
            f"setting the power limit to {power_limit_w:g} W",
            "nvmlDeviceSetPowerManagementLimit",
            round(power_limit_w * 1000),
        )

    def energy_j(self) -> float:
        """The board's total energy since the driver loaded (Volta and newer; a counter that only grows)."""
        return self._call("reading the total energy counter", "nvmlDeviceGetTotalEnergyConsumption") / 1000.0

    def power_w(self) -> float:
        """The power the board draws now, in watts."""
        return self._call("reading the power draw", "nvmlDeviceGetPowerUsage") / 1000.0

    def synchronize(self) -> None:
        """Wait for the device's queued work. A real GPU's work is waited for by the framework
        (`torch.cuda.synchronize`); the simulated one makes its modelled slowdown felt here."""
        sync = getattr(self.nvml.lib, "skygreenSimSynchronize", None)
        if sync is not None:
            sync(self.handle)
