"""`Step`: one optimizer step of the user's loop, read as one block (nanoGPT's `train.py`).

Micro-batches, the backward divided by the accumulation steps and scaled for fp16, clipping
after unscaling, the update. The step talks to its `Run` through the run's small public
surface (`next_micro_batch`, `agree_flags`, `shrink_micro_batch`, `count_probe_step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from skygreen.errors import RuntimeSetupError
from skygreen.runtime import rng
from skygreen.runtime.autotune import is_out_of_memory
from skygreen.runtime.fsdp import clip_grad_norm, set_gradient_sync
from skygreen.runtime.smoke_mode import smoke_fail

if TYPE_CHECKING:
    from skygreen.runtime.run import Run


class ProbeRetry(Exception):
    """Another rank ran out of memory while probing the micro-batch: redo this step smaller."""


class Step:
    """One optimizer step: its micro-batches, the scaled backward, clipping and the update.

    Use it as a context manager (`with step:`): while `micro: auto` probes, an out-of-memory
    error inside the block is caught there and the runtime hands out the same step again
    with half the micro-batch.
    """

    def __init__(self, run: Run, index: int) -> None:
        self.run = run
        self.index = index
        self.done = False
        self.retry = False
        self.phase = "forward"
        self._backwards = 0
        self._drawn = 0
        self._synced = False
        self.rng_at_start = rng.capture() if run.probing else None

    @property
    def epoch(self) -> int:
        """The run's epoch, counting from 0: until `optimizer_step`, the one this step's samples start in."""
        return self.run.epoch

    @property
    def accum_steps(self) -> int:
        """Micro-batches this step has on this rank: `micro_batches` yields that many, and `backward`
        divides the loss by it."""
        return self.run.accum_steps

    def micro_batches(self) -> Iterator[Any]:
        """This rank's micro-batches of the step; DDP syncs gradients only on the last one."""
        run = self.run
        accum = run.accum_steps
        ddp = cast(DistributedDataParallel, run.model) if run.world_size > 1 and not run.sharded else None
        for k in range(accum):
            self.phase = "forward"
            batch = run.next_micro_batch()
            self._drawn += 1
            if run.sharded:
                set_gradient_sync(run.model, k == accum - 1)
                yield batch
            elif ddp is not None and (k < accum - 1 or run.probing):
                with ddp.no_sync():
                    yield batch
            else:
                yield batch

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass (a no-op in fp32)."""
        return self.run.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """`loss / accum_steps`, scaled when fp16, backpropagated."""
        self.phase = "backward"
        loss = loss / self.run.accum_steps
        if self.run.precision.grad_scaler:
            loss = self.run.scaler.scale(loss)
        loss.backward()
        self._backwards += 1

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the gradient norm after unscaling (clipping scaled gradients would clip nothing)."""
        self._boundary()
        self.phase = "optimizer"
        if self.run.precision.grad_scaler:
            self.run.scaler.unscale_(self.run.optimizer)
        if self.run.sharded:
            return clip_grad_norm(self.run.module.parameters(), max_norm)
        return torch.nn.utils.clip_grad_norm_(self.run.module.parameters(), max_norm)

    def optimizer_step(self) -> None:
        """Step (skipped by the scaler on inf/nan gradients), update the scale, zero, schedule."""
        self._boundary()
        self.phase = "optimizer"
        run = self.run
        if run.precision.grad_scaler:
            run.scaler.step(run.optimizer)
            run.scaler.update()
        else:
            run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        if run.scheduler is not None:
            run.scheduler.step()
        run.step_index += 1
        run.samples_seen += run.effective_batch
        run.count_probe_step()
        self.done = True

    def _boundary(self) -> None:
        """Once per step, before the first use of the accumulated gradients."""
        if self._synced:
            return
        if self._drawn != self.run.accum_steps or self._backwards != self.run.accum_steps:
            raise RuntimeSetupError(
                f"step {self.index}: {self._drawn} micro-batches drawn and {self._backwards} backward calls, "
                f"expected {self.run.accum_steps} of each\n"
                "  fix: iterate step.micro_batches() to the end and call step.backward(loss) once per micro-batch"
            )
        run = self.run
        if run.world_size > 1 and run.probing and not run.sharded:
            if run.agree_flags(False)[0]:
                raise ProbeRetry()
            average_gradients(run.module, run.world_size)
        self._synced = True

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        run = self.run
        if exc is None:
            return False
        recoverable = run.probing and not self._synced
        if isinstance(exc, ProbeRetry) or (recoverable and is_out_of_memory(exc)):
            if run.world_size > 1 and not isinstance(exc, ProbeRetry):
                run.agree_flags(True)  # the other ranks wait for this at their boundary
            run.shrink_micro_batch(exc, self)
            self.retry = True
            return True
        if run.smoke and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            smoke_fail(self.phase, exc)
        return False


def average_gradients(module: torch.nn.Module, world_size: int) -> None:
    """What DDP's reducer does at a boundary, by hand, for the probing steps."""
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
