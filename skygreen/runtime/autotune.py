"""Batch autotune: the largest micro-batch that fits, with the effective batch held fixed.

Like Composer's `device_train_microbatch_size='auto'` and unlike batch-size finders that
change the real batch: the recipe (effective batch, learning rate) stays the user's, only the
split into micro-batches x accumulation steps changes. The runtime starts at the whole
per-rank batch and halves on out-of-memory during the first `OOM_PROBE_STEPS` optimizer
steps (the second one includes the optimizer's state, allocated by the first update).
"""

from __future__ import annotations

from typing import Any

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
