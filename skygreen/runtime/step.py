"""`Step`: one optimizer step of the user's loop, read as one block (nanoGPT's `train.py`).

Micro-batches, the backward divided by the accumulation steps and scaled for fp16, clipping
after unscaling, the update. A step receives only what it needs: the objects it trains
(`StepParts`: model, optimizer, scheduler, scaler, precision, the training state it advances,
the world it agrees with) and a `BatchFeed` that hands out micro-batches and halves them on
out-of-memory while probing (the `Run` is one).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from skygreen.errors import RuntimeSetupError
from skygreen.runtime import rng
from skygreen.runtime.autotune import is_out_of_memory
from skygreen.runtime.fsdp import clip_grad_norm, set_gradient_sync
from skygreen.runtime.precision import PrecisionChoice
from skygreen.runtime.ranks import World
from skygreen.runtime.smoke_mode import smoke_fail
from skygreen.runtime.state import TrainingState


@dataclass(frozen=True, kw_only=True, slots=True)
class StepParts:
    """What every step of a run trains with; built once by the loop that hands out steps.

    A record rather than the `Run`, so a step can be built and tested from its parts alone.

    Attributes:
        optimizer: the user's optimizer; stepped through the scaler under fp16.
        scheduler: the user's LR scheduler, stepped after each update; None for none.
        scaler: the GradScaler (enabled only for fp16).
        precision: the precision chosen for this device.
        autocast: makes the forward pass's mixed-precision context.
        training: the step counter and data position the step advances.
        world: this process's rank and world size.
        smoke: the CPU smoke test: an error says which phase of the step failed.
    """

    model: torch.nn.Module
    """The model as called (DDP-wrapped with more than one rank)."""
    module: torch.nn.Module
    """The model's own module (whose parameters are clipped and averaged)."""
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    precision: PrecisionChoice
    autocast: Callable[[], contextlib.AbstractContextManager]
    training: TrainingState
    world: World
    smoke: bool = False
    sharded: bool = False
    """The model is sharded with FSDP2's `fully_shard` (`skygreen.runtime.fsdp`): no DDP; FSDP
    reduce-scatters on the last micro-batch only, and the gradient norm is clipped over the shards."""


class BatchFeed(Protocol):
    """Where a step's micro-batches come from, and what shrinks them while probing."""

    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step on this rank."""
        ...

    @property
    def probing(self) -> bool:
        """True while out-of-memory means 'go smaller' (the first steps of `micro: auto`)."""
        ...

    @property
    def epoch(self) -> int:
        """The epoch the data position is in, counting from 0."""
        ...

    def next_micro_batch(self) -> Any:
        """This rank's next micro-batch, on its device."""
        ...

    def shrink_micro_batch(self, error: BaseException, step: Step) -> None:
        """Redo `step` with a smaller micro-batch; raise when nothing smaller is left."""
        ...

    def count_probe_step(self) -> None:
        """One optimizer step done while probing."""
        ...


class ProbeRetry(Exception):
    """Another rank ran out of memory while probing the micro-batch: redo this step smaller."""


class Step:
    """One optimizer step: its micro-batches, the scaled backward, clipping and the update.

    Use it as a context manager (`with step:`): while `micro: auto` probes, an out-of-memory
    error inside the block is caught there and the runtime hands out the same step again
    with half the micro-batch.
    """

    def __init__(self, index: int, *, parts: StepParts, feed: BatchFeed) -> None:
        """Make step `index`; the run's loop does this, a user's loop receives steps.

        Args:
            index: optimizer steps done before this one.
            parts: what the step trains with.
            feed: where micro-batches come from (the `Run`); while it probes, the RNG state at
                the step's start is kept so a retry redraws the same randomness.
        """
        self.parts = parts
        self.feed = feed
        self.index = index
        self.done = False
        self.retry = False
        self.phase = "forward"
        self._backwards = 0
        self._drawn = 0
        self._synced = False
        self.rng_at_start = rng.capture() if feed.probing else None

    @property
    def epoch(self) -> int:
        """The run's epoch, counting from 0: until `optimizer_step`, the one this step's samples start in."""
        return self.feed.epoch

    @property
    def accum_steps(self) -> int:
        """Micro-batches this step has on this rank.

        `micro_batches` yields that many, and `backward` divides the loss by it.
        """
        return self.feed.accum_steps

    def micro_batches(self) -> Iterator[Any]:
        """Yield this rank's micro-batches of the step, on the run's device.

        Gradients are all-reduced only once per step: DDP syncs on the last micro-batch alone
        (FSDP2 reduce-scatters there), since syncing every micro-batch would cost the network
        `accum_steps` times for the same result. While probing under DDP, none syncs and the
        gradients are averaged by hand at the boundary, after every rank said it had memory
        enough (a rank out of memory mid-step must not leave the others in an all-reduce).

        Yields:
            `accum_steps` micro-batches, as the dataset's collate function builds them.
        """
        feed = self.feed
        accum = feed.accum_steps
        sharded = self.parts.sharded
        ddp = cast(DistributedDataParallel, self.parts.model) if self.parts.world.size > 1 and not sharded else None
        for k in range(accum):
            self.phase = "forward"
            batch = feed.next_micro_batch()
            self._drawn += 1
            if sharded:
                set_gradient_sync(self.parts.model, k == accum - 1)
                yield batch
            elif ddp is not None and (k < accum - 1 or feed.probing):
                with ddp.no_sync():
                    yield batch
            else:
                yield batch

    def autocast(self) -> contextlib.AbstractContextManager:
        """Mixed precision for the forward pass (a no-op in fp32).

        Returns:
            A context manager: `with step.autocast(): loss = ...`.
        """
        return self.parts.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate `loss / accum_steps`, scaled when fp16.

        Dividing by the accumulation steps makes the summed gradients those of the effective
        batch's mean loss, so the learning rate does not depend on how the batch was split.

        Args:
            loss: this micro-batch's mean loss.
        """
        self.phase = "backward"
        loss = loss / self.feed.accum_steps
        if self.parts.precision.grad_scaler:
            loss = self.parts.scaler.scale(loss)
        loss.backward()
        self._backwards += 1

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the gradient norm after unscaling (clipping scaled gradients would clip nothing).

        Args:
            max_norm: the largest total 2-norm of the gradients (over every shard under FSDP2).

        Returns:
            The total norm before clipping.

        Raises:
            RuntimeSetupError: the step did not draw every micro-batch or call `backward` once
                for each.
        """
        self._boundary()
        self.phase = "optimizer"
        if self.parts.precision.grad_scaler:
            self.parts.scaler.unscale_(self.parts.optimizer)
        if self.parts.sharded:
            return clip_grad_norm(self.parts.module.parameters(), max_norm)
        return torch.nn.utils.clip_grad_norm_(self.parts.module.parameters(), max_norm)

    def optimizer_step(self) -> None:
        """Update the weights, then zero the gradients, step the scheduler and advance the step.

        Under fp16 the scaler skips the update on inf/NaN gradients and lowers its scale. The
        step counts as done only here: a step left without it stops the run with an error.

        Raises:
            RuntimeSetupError: the step did not draw every micro-batch or call `backward` once
                for each.
        """
        self._boundary()
        self.phase = "optimizer"
        parts = self.parts
        if parts.precision.grad_scaler:
            parts.scaler.step(parts.optimizer)
            parts.scaler.update()
        else:
            parts.optimizer.step()
        parts.optimizer.zero_grad(set_to_none=True)
        if parts.scheduler is not None:
            parts.scheduler.step()
        parts.training.advance()
        self.feed.count_probe_step()
        self.done = True

    def _boundary(self) -> None:
        """Once per step, before the first use of the accumulated gradients."""
        if self._synced:
            return
        accum = self.feed.accum_steps
        if self._drawn != accum or self._backwards != accum:
            raise RuntimeSetupError(
                f"step {self.index}: {self._drawn} micro-batches drawn and {self._backwards} backward calls, "
                f"expected {accum} of each\n"
                "  fix: iterate step.micro_batches() to the end and call step.backward(loss) once per micro-batch"
            )
        world = self.parts.world
        if world.size > 1 and self.feed.probing and not self.parts.sharded:
            if world.agree(False)[0]:
                raise ProbeRetry()
            average_gradients(self.parts.module, world.size)
        self._synced = True

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None:
            return False
        recoverable = self.feed.probing and not self._synced
        if isinstance(exc, ProbeRetry) or (recoverable and is_out_of_memory(exc)):
            if self.parts.world.size > 1 and not isinstance(exc, ProbeRetry):
                self.parts.world.agree(True)  # the other ranks wait for this at their boundary
            self.feed.shrink_micro_batch(exc, self)
            self.retry = True
            return True
        if self.parts.smoke and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            smoke_fail(self.phase, exc)
        return False


def average_gradients(module: torch.nn.Module, world_size: int) -> None:
    """What DDP's reducer does at a boundary, by hand, for the probing steps."""
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)
