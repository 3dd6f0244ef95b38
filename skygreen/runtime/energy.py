"""GPU energy, metered from NVML's total-energy counter, accumulated as `energy_j` in checkpoints.

The cumulative counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules, Volta and newer)
is read at checkpoint boundaries; power polling samples too little of the runtime to be
trusted (arXiv 2312.02741). Without a GPU, or without the counter, the meter reads 0 J and
says so once: the counter slot stays in the checkpoint for when it can be filled.
"""

from __future__ import annotations

import logging
from typing import Any

from skygreen.errors import NvmlError
from skygreen.runtime.nvml import NvmlGpu

log = logging.getLogger("skygreen.runtime")


class EnergyMeter:
    """Joules used by one GPU since the last `take_j`."""

    def __init__(self, gpu: NvmlGpu | None = None) -> None:
        self._gpu = gpu
        self._last_mj = self._read_mj()

    @classmethod
    def for_device(cls, device: Any) -> EnergyMeter:
        """A meter for a torch device: NVML's counter on a GPU, a meter reading 0 J elsewhere."""
        if device.type != "cuda":
            return cls()
        import torch

        try:
            gpu = NvmlGpu.by_uuid(str(torch.cuda.get_device_properties(device).uuid))
        except NvmlError as e:  # no NVML library, no permission, GPU lost
            log.warning("GPU energy metering unavailable (%s); energy_j stays 0", e)
            return cls()
        return cls(gpu)

    def _read_mj(self) -> int | None:
        if self._gpu is None:
            return None
        try:
            return self._gpu.total_energy_mj()
        except NvmlError as e:  # "not supported" on pre-Volta GPUs
            log.warning("NVML total energy counter unavailable (%s); energy_j stays 0", e)
            self._gpu = None
            return None

    def take_j(self) -> float:
        """Joules since the last call (0 where there is no counter)."""
        now = self._read_mj()
        if now is None or self._last_mj is None:
            return 0.0
        used_mj, self._last_mj = now - self._last_mj, now
        return max(used_mj, 0) / 1000.0
