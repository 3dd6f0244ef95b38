"""GPU energy, metered from NVML's total-energy counter, accumulated as `energy_j` in checkpoints.

The cumulative counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules, Volta and newer)
is read at checkpoint boundaries; power polling samples too little of the runtime to be
trusted (arXiv 2312.02741). Without a GPU, or without the counter, the meter reads 0 J and
says so once: the counter slot stays in the checkpoint for when it can be filled.
"""

from __future__ import annotations

import logging

log = logging.getLogger("skygreen.runtime")


class EnergyMeter:
    """Joules used by one GPU since the last `take_j`."""

    def __init__(self, handle=None, nvml=None) -> None:
        self._handle = handle
        self._nvml = nvml
        self._last_mj = self._read_mj()

    @classmethod
    def for_device(cls, device) -> EnergyMeter:
        if device.type != "cuda":
            return cls()
        try:
            import pynvml

            pynvml.nvmlInit()
            import torch

            uuid = torch.cuda.get_device_properties(device).uuid
            handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            meter = cls(handle, pynvml)
        except Exception as e:  # no NVML library, no permission, no counter
            log.warning("GPU energy metering unavailable (%s); energy_j stays 0", e)
            return cls()
        return meter

    def _read_mj(self) -> int | None:
        if self._handle is None:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception as e:  # NVMLError_NotSupported on pre-Volta GPUs
            log.warning("NVML total energy counter unavailable (%s); energy_j stays 0", e)
            self._handle = None
            return None

    def take_j(self) -> float:
        now = self._read_mj()
        if now is None or self._last_mj is None:
            return 0.0
        used_mj, self._last_mj = now - self._last_mj, now
        return max(used_mj, 0) / 1000.0
