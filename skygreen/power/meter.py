"""GPU energy per device: NVML's total-energy counter, else sampled power integrated on a thread.

The counter (`nvmlDeviceGetTotalEnergyConsumption`, Volta and newer) is the source of truth:
power readings on A100/H100 sample only about a quarter of the runtime (arXiv 2312.02741), so
polling is the fallback for boards and vGPUs without the counter (codecarbon #1316 reports 0 kWh
there instead), and the method used is always reported. A simulated GPU reports `simulated`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from skygreen.errors import PowerError, PowerNotSupportedError

if TYPE_CHECKING:
    from skygreen.power.nvml import Gpu

log = logging.getLogger("skygreen.power")

METHODS = ("nvml-counter", "power-sampling", "simulated", "none")
SAMPLE_INTERVAL_S = 0.1


class GpuEnergyMeter:
    """Joules one GPU used since the meter started; `read_j()` is cumulative."""

    def __init__(self, gpu: Gpu, *, sample_interval_s: float = SAMPLE_INTERVAL_S, clock=time.monotonic) -> None:
        self.gpu = gpu
        self._clock = clock
        self._sampled_j = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_j: float | None
        try:
            self._start_j = gpu.energy_j()
            self.measured_by = "nvml-counter"
        except PowerNotSupportedError:
            self._start_j = None
            self.measured_by = "power-sampling"
            self._interval_s = sample_interval_s
            self._last = (self._clock(), gpu.power_w())
            self._thread = threading.Thread(target=self._sample_loop, name="skygreen-power-sampler", daemon=True)
            self._thread.start()
            log.info("GPU %d has no energy counter: integrating its power every %g s", gpu.index, sample_interval_s)

    @property
    def method(self) -> str:
        """`nvml-counter`, `power-sampling`, or `simulated` for a simulated GPU."""
        return "simulated" if self.gpu.simulated else self.measured_by

    def read_j(self) -> float:
        """Joules the GPU used since the meter started.

        With the counter, a fresh NVML read (an NVML error is raised as a `PowerError`); with
        power sampling, the integral so far after one more sample (a failed sample is skipped).
        """
        if self._start_j is not None:
            return max(self.gpu.energy_j() - self._start_j, 0.0)
        self._sample()
        with self._lock:
            return self._sampled_j

    def _sample(self) -> None:
        try:
            now, power_w = self._clock(), self.gpu.power_w()
        except PowerError:
            return
        with self._lock:
            then, last_w = self._last
            self._sampled_j += max(now - then, 0.0) * (power_w + last_w) / 2.0
            self._last = (now, power_w)

    def _sample_loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def close(self) -> None:
        """Stop the power-sampling thread, waiting up to 2 s for it; nothing to stop with the counter."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
