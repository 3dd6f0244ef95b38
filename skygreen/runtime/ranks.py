"""The ranks of a run: who this process is among them (`World`), and how they agree.

Agreement across ranks: the one all-reduce the runtime uses, a no-op for a single process.

Ranks agree at step boundaries (preemption signals, out-of-memory while probing, the step to
resume from, the energy of the step); every such agreement is a small tensor all-reduced here.
Call it from the main thread only: collectives must be issued in the same order on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from skygreen.errors import RuntimeSetupError


@dataclass(frozen=True, kw_only=True, slots=True)
class World:
    """This process's place among the run's ranks (torchrun's RANK, WORLD_SIZE, LOCAL_RANK).

    Passed to each part explicitly, so no part reads the environment on its own.

    Attributes:
        rank: this process's rank, 0 to `size - 1`.
        size: the number of ranks.
        local_rank: this process's rank on its node (its GPU's index).

    Raises:
        RuntimeSetupError: a rank outside `[0, size)` or a negative local rank.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    def __post_init__(self) -> None:
        if not (self.size >= 1 and 0 <= self.rank < self.size and self.local_rank >= 0):
            raise RuntimeSetupError(
                f"rank {self.rank} of world size {self.size} (local rank {self.local_rank}): "
                "need 0 <= RANK < WORLD_SIZE and LOCAL_RANK >= 0"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> World:
        """Read the world torchrun describes in `environ`; a single process when it says nothing.

        Args:
            environ: the process environment.

        Returns:
            The world.

        Raises:
            RuntimeSetupError: RANK, WORLD_SIZE or LOCAL_RANK is not an integer, or out of range.
        """
        try:
            return cls(
                rank=int(environ.get("RANK", 0)),
                size=int(environ.get("WORLD_SIZE", 1)),
                local_rank=int(environ.get("LOCAL_RANK", 0)),
            )
        except ValueError as e:
            raise RuntimeSetupError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers: {e}") from e

    @property
    def leader(self) -> bool:
        """Rank 0: the one that writes the ledger and the shared checkpoint state."""
        return self.rank == 0

    def agree(self, *flags: bool) -> list[bool]:
        """Raise each flag that any rank raised on all of them (an all-reduce with MAX).

        A collective every rank must join, from the main thread, so that all ranks act on a
        signal (SIGTERM, a notice, early stopping) at the same step.

        Args:
            *flags: this rank's flags.

        Returns:
            The flags, each True where it was True on some rank; alone, as given.
        """
        if self.size == 1:
            return [bool(f) for f in flags]
        return [bool(v) for v in all_reduce([int(f) for f in flags], op="MAX", dtype=torch.int32)]


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
