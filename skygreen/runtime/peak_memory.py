"""The peak memory a rank's training steps take, measured, for the ledger beside the plan's estimate.

On a GPU: CUDA's caching allocator's `max_memory_allocated` over the measured steps, the tensors'
peak (no CUDA context, no reserved-but-free blocks), which the plan's `tensors` term estimates
(`skygreen.memory.planned`). On CPU (and on a simulated GPU, whose training runs on the CPU),
where torch keeps no allocator statistics: the bytes of the tensors already resident when the
window opens (parameters, buffers, gradients, optimizer state) plus the growth of the process's
resident set (RSS) over the steps, its high-water mark (`VmHWM`, reset by writing 5 to
`/proc/self/clear_refs`) less its size when the window opened, after glibc's `malloc_trim` handed
freed heap pages back (else memory the steps reuse from resident pages would not show as growth). That counts what the steps
allocate (activations, logits, gradients, a first step's optimizer state) as the allocator would,
and also what the host adds around them (the data loader's batches, Python objects): an upper
bound of the same quantity, stated as such in the ledger (`measure`). Without `/proc` (macOS)
nothing is measured on CPU.

The window opens at the first step of the VM's life that runs at its final micro-batch (after
`micro: auto`'s probe) and spans `PEAK_STEPS` optimizer steps; every rank measures its own and
the runtime records the largest (`skygreen.runtime.run`), the GPU that decides whether a run fits.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

PEAK_STEPS = 2
"""Optimizer steps measured: the first allocates the optimizer's state, the second runs with it."""
CUDA_MEASURE = "cuda max_memory_allocated"
CPU_MEASURE = "cpu resident tensors + RSS growth"
_PROC = Path("/proc/self")
log = logging.getLogger("skygreen.runtime")


def resident_tensor_bytes(module: Any, optimizer: Any) -> int:
    """Bytes of the tensors a training step keeps between steps: parameters, their gradients,
    buffers and the optimizer's state, each storage counted once."""
    import torch

    seen: set[int] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if not isinstance(t, torch.Tensor):
            return
        if hasattr(t, "to_local"):  # an FSDP2 shard (DTensor): this rank's part
            t = t.to_local()
        if t.device.type != "cpu":
            return
        try:
            key, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        except RuntimeError:  # a tensor subclass without a plain storage
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += size

    for p in module.parameters():
        add(p)
        add(p.grad)
    for b in module.buffers():
        add(b)
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                add(value)
    return total


def _status_kb(field: str) -> int | None:
    try:
        text = (_PROC / "status").read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def _trim_heap() -> None:
    """glibc's `malloc_trim(0)`: free pages of the heap go back to the system; nothing elsewhere."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): the growth may then miss reused pages
        pass


class HostPeak:
    """The CPU measure: resident tensors when the window opens plus the RSS high-water growth."""

    measure = CPU_MEASURE

    def __init__(self, resident_bytes: Callable[[], int]) -> None:
        self._resident_bytes = resident_bytes
        self._start_rss_kb: int | None = None
        self._base_bytes = 0

    @classmethod
    def available(cls) -> bool:
        """Whether this system lets a process read and reset its peak RSS (Linux >= 4.0)."""
        return _status_kb("VmHWM") is not None and (_PROC / "clear_refs").exists()

    def start(self) -> None:
        """Reset the high-water mark to the RSS now and note the tensors already resident.

        Freed heap memory is first handed back to the system (glibc's `malloc_trim`): memory the
        steps would otherwise reuse from pages already resident would not show as growth.
        """
        _trim_heap()
        try:
            (_PROC / "clear_refs").write_text("5")
        except OSError:
            self._start_rss_kb = None
            return
        try:
            self._base_bytes = self._resident_bytes()
        except Exception as e:  # a measure never stops training
            log.warning("peak memory not measured: the resident tensors could not be counted (%s)", e)
            self._start_rss_kb = None
            return
        self._start_rss_kb = _status_kb("VmRSS")

    def peak_bytes(self) -> int | None:
        """The measure since `start`; None where the peak could not be reset or read."""
        peak_kb = _status_kb("VmHWM")
        if self._start_rss_kb is None or peak_kb is None:
            return None
        return self._base_bytes + max(0, peak_kb - self._start_rss_kb) * 1024


class CudaPeak:
    """The GPU measure: the caching allocator's peak of allocated bytes since `start`."""

    measure = CUDA_MEASURE

    def __init__(self, device: Any) -> None:
        self.device = device

    def start(self) -> None:
        """`torch.cuda.reset_peak_memory_stats`."""
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int | None:
        """`torch.cuda.max_memory_allocated` since `start`."""
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))


class PeakWindow:
    """`PEAK_STEPS` optimizer steps of one life, measured once.

    Args:
        meter: `CudaPeak` or `HostPeak`, or None where nothing can measure (the window stays shut).
        steps: optimizer steps to measure.
    """

    def __init__(self, meter: CudaPeak | HostPeak | None, *, steps: int = PEAK_STEPS) -> None:
        self.meter = meter
        self.steps = steps
        self._counted: int | None = None
        """Steps measured so far; None before the window opens."""
        self.done = meter is None

    def before_step(self, *, ready: bool) -> None:
        """Open the window at the first step that runs `ready` (at its final micro-batch)."""
        if not self.done and self._counted is None and ready and self.meter is not None:
            self.meter.start()
            self._counted = 0

    def after_step(self) -> int | None:
        """Count one optimizer step; at the window's last, close it and return the peak in bytes
        (-1 where the meter could not read one, so every rank still joins the reduction)."""
        if self.done or self._counted is None or self.meter is None:
            return None
        self._counted += 1
        if self._counted < self.steps:
            return None
        self.done = True
        peak = self.meter.peak_bytes()
        return -1 if peak is None else peak


def peak_window(device: Any, module: Any, optimizer: Any) -> PeakWindow:
    """The window for a run on `device`: CUDA's allocator on a GPU, the host's RSS on CPU."""
    if getattr(device, "type", None) == "cuda":
        return PeakWindow(CudaPeak(device))
    if getattr(device, "type", None) == "cpu" and HostPeak.available():
        return PeakWindow(HostPeak(lambda: resident_tensor_bytes(module, optimizer)))
    return PeakWindow(None)
