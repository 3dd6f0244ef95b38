"""Batch autotune: the largest micro-batch that fits, with the effective batch held fixed.

Like Composer's `device_train_microbatch_size='auto'` and unlike batch-size finders that
change the real batch: the recipe (effective batch, learning rate) stays the user's, only the
split into micro-batches x accumulation steps changes. The runtime starts at the whole
per-rank batch and halves on out-of-memory during the first `OOM_PROBE_STEPS` optimizer
steps (the second one includes the optimizer's state, allocated by the first update).

A model sharded with FSDP2 over several ranks cannot be probed that way (an out-of-memory
error on one rank leaves the others in a collective); `MemoryProbe` measures and extrapolates
instead, and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

OOM_PROBE_STEPS = 2

_OOM_PATTERNS = (
    "out of memory",
    "cuda error: out of memory",
    "cudnn_status_not_supported",
    "defaultcpuallocator: can't allocate",
)


def is_out_of_memory(error: BaseException) -> bool:
    """An allocator failure: torch's OutOfMemoryError type first, known messages second."""
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return True
    if isinstance(error, RuntimeError):
        text = str(error).lower()
        return any(p in text for p in _OOM_PATTERNS)
    return False


def smaller_micro_batch(micro: int, per_rank_batch: int) -> int | None:
    """The largest divisor of the per-rank batch at most half of `micro`; None below 1.

    A divisor, so that micro-batches x accumulation steps is exactly the per-rank batch.
    """
    for candidate in range(micro // 2, 0, -1):
        if per_rank_batch % candidate == 0:
            return candidate
    return None


def reset_scaler_stage(scaler: Any) -> None:
    """Forget a half-done unscale of an abandoned step (GradScaler has no public reset)."""
    if scaler.is_enabled():
        from collections import defaultdict

        from torch.amp.grad_scaler import _refresh_per_optimizer_state

        scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


# ---------------------------------------------------------------------------------------
# Under FSDP2 on more than one rank: measure, extrapolate, agree (never provoke an OOM)

FIT_FRACTION = 0.9
"""The share of a device's memory the predicted peak may take: room for the allocator's
fragmentation and for what a linear fit misses."""


class DeviceMemory(Protocol):
    """The memory figures of one device the probe reads (CUDA's allocator statistics)."""

    def reset_peak(self) -> None:
        """Start a new peak measurement."""
        ...

    def peak_bytes(self) -> int:
        """The most bytes allocated at once since `reset_peak`."""
        ...

    def capacity_bytes(self) -> int:
        """The device's total memory."""
        ...


@dataclass(frozen=True, slots=True)
class CudaMemory:
    """`DeviceMemory` of one CUDA device, from the caching allocator's statistics."""

    device: Any

    def reset_peak(self) -> None:
        """`torch.cuda.reset_peak_memory_stats`."""
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        """`torch.cuda.max_memory_allocated`."""
        import torch

        return int(torch.cuda.max_memory_allocated(self.device))

    def capacity_bytes(self) -> int:
        """The device's total memory."""
        import torch

        return int(torch.cuda.get_device_properties(self.device).total_memory)


def device_memory(device: Any) -> DeviceMemory | None:
    """The memory statistics of `device`; None where there are none (CPU)."""
    return CudaMemory(device) if getattr(device, "type", None) == "cuda" else None


class MemoryProbe:
    """`micro: auto` for a model sharded with FSDP2 over several ranks, without ever running a
    micro-batch that might not fit.

    Why not the DDP probe (try, catch the OOM, agree, halve): under FSDP2 a forward and a
    backward are chains of collectives, an all-gather before each sharded block and a
    reduce-scatter after. An allocation can fail on one rank between any two of them (in the
    activations, or in FSDP's own all-gather buffer, after any hook could have warned the
    others); the other ranks are by then waiting in the next collective, which never
    completes. NCCL cannot leave a collective without tearing the communicator down, so no
    agreement after the fact can be reached, and hooks that all-reduce an OOM flag before each
    block (Composer's way) still miss an OOM inside FSDP's own buffers. So this probe never runs
    a size it has not predicted to fit:

    - the first three optimizer steps run at small micro-batches every rank can hold (micro 1 for
      the warm-up step, which also allocates the optimizer's states, then micro 1 and the next
      divisor of the per-rank batch, each measured): real training steps on the step's own
      samples, with the effective batch kept, so probing costs no extra step;
    - each rank fits its peak memory over a whole step, `peak = base + per_sample x micro`, and
      takes the largest micro-batch whose predicted peak is within `FIT_FRACTION` of its device;
    - one all-reduce (MIN) makes every rank take the smallest of those, rounded down to a divisor
      of the per-rank batch. A rank with less free memory (another process on its GPU, a smaller
      card in a mixed node) thus sets the micro-batch for all.

    The prediction is a straight line through two points; what a line misses (the allocator's
    rounding, a peak that is not linear in the batch) is what `FIT_FRACTION` leaves room for. An
    out-of-memory error that happens anyway is not caught: it ends the run on every rank
    (torchrun stops the others) rather than leaving them in a collective.

    Args:
        per_rank_batch: samples per optimizer step on each rank.
        meter: this rank's device memory statistics.
        fraction: the share of the device's memory the predicted peak may take.
    """

    def __init__(self, *, per_rank_batch: int, meter: DeviceMemory, fraction: float = FIT_FRACTION) -> None:
        if per_rank_batch < 1:
            raise ValueError(f"per_rank_batch must be at least 1, got {per_rank_batch}")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.per_rank_batch = per_rank_batch
        self.meter = meter
        self.fraction = fraction
        second = next((d for d in range(2, per_rank_batch + 1) if per_rank_batch % d == 0), None)
        self.schedule: tuple[int, ...] = () if second is None else (1, 1, second)
        """The micro-batch of each probing step: warm-up, then the two measured sizes."""
        self.peaks: dict[int, int] = {}
        """Measured peak bytes by micro-batch size."""
        self._step = 0

    @property
    def done(self) -> bool:
        """Every probing step ran."""
        return self._step >= len(self.schedule)

    def micro_for_next_step(self) -> int:
        """The micro-batch the next probing step runs with; the peak measurement starts here."""
        self.meter.reset_peak()
        return self.schedule[self._step]

    def step_done(self) -> None:
        """Record the peak of the probing step that just ended (the warm-up is not measured)."""
        if self._step > 0:
            self.peaks[self.schedule[self._step]] = self.meter.peak_bytes()
        self._step += 1

    def largest_fitting(self) -> int:
        """The largest micro-batch (any size from 1 to the per-rank batch) this rank's fit
        predicts to fit; 1 when even the measured sizes leave no room."""
        if not self.schedule:
            return self.per_rank_batch
        (m1, p1), (m2, p2) = sorted(self.peaks.items())
        per_sample = (p2 - p1) / (m2 - m1)
        budget = self.fraction * self.meter.capacity_bytes()
        if per_sample <= 0:
            return self.per_rank_batch if p2 <= budget else 1
        base = p1 - per_sample * m1
        return max(1, min(self.per_rank_batch, math.floor((budget - base) / per_sample)))


def divisor_at_most(limit: int, per_rank_batch: int) -> int:
    """The largest divisor of the per-rank batch that is at most `limit` (at least 1)."""
    return max([1, *(d for d in range(1, min(limit, per_rank_batch) + 1) if per_rank_batch % d == 0)])
