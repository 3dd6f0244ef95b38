"""Agreement across ranks: the one all-reduce the runtime uses, a no-op for a single process.

Ranks agree at step boundaries (preemption signals, out-of-memory while probing, the step to
resume from, the energy of the step); every such agreement is a small tensor all-reduced here.
Call it from the main thread only: collectives must be issued in the same order on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def distributed() -> bool:
    """A process group of more than one rank exists."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(values: Sequence[float], *, op: str, dtype: torch.dtype) -> list:
    """`values` reduced elementwise across ranks with `op` (SUM, MIN or MAX); as given when alone.

    NCCL reduces on this rank's GPU, gloo on the CPU.
    """
    if not distributed():
        return list(values)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor(list(values), dtype=dtype, device=device)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return tensor.tolist()
