"""Where the run is in its data, as one number that survives any interruption.

The data is one endless stream of sample indices: epoch `e` is a permutation of the dataset
drawn from its own generator seeded with `seed + e`, so the order depends on nothing but the
seed and the position. An optimizer step takes the next `effective_batch` indices of the
stream (an accumulation window may straddle an epoch boundary), and splits them into
micro-batches: micro-step `k` of rank `r` gets the slice `(k * world_size + r) * micro`.

So the position of the whole run is `samples_seen`, mid-epoch or not; and changing the
micro-batch (batch autotune) keeps the samples of each optimizer step the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch


class SampleStream:
    """The run's sample order: the index at any position of the endless stream."""

    def __init__(self, dataset_len: int, *, seed: int, shuffle: bool = True) -> None:
        if dataset_len < 1:
            raise ValueError("the dataset is empty")
        self.dataset_len = dataset_len
        self.seed = seed
        self.shuffle = shuffle
        self._perms: dict[int, list[int]] = {}

    def epoch_order(self, epoch: int) -> list[int]:
        """The sample indices of `epoch` in order: a permutation drawn from `seed + epoch`, or the
        dataset's own order without shuffling. At most two epochs stay cached: a new one evicts the
        lower-numbered.
        """
        perm = self._perms.get(epoch)
        if perm is None:
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                perm = torch.randperm(self.dataset_len, generator=generator).tolist()
            else:
                perm = list(range(self.dataset_len))
            if len(self._perms) >= 2:  # a window spans at most the current and the next epoch
                self._perms.pop(min(self._perms))
            self._perms[epoch] = perm
        return perm

    def take(self, position: int, count: int) -> list[int]:
        """The `count` indices starting at stream `position`."""
        out: list[int] = []
        while count > 0:
            epoch, offset = divmod(position, self.dataset_len)
            chunk = self.epoch_order(epoch)[offset : offset + count]
            out.extend(chunk)
            position += len(chunk)
            count -= len(chunk)
        return out


class MicroBatchSampler:
    """A batch sampler for `torch.utils.data.DataLoader`: this rank's micro-batches from a position.

    Endless: the runtime draws exactly `accum_steps` micro-batches per optimizer step, and
    builds a new sampler (and loader iterator) when it resumes or the micro-batch changes.
    """

    def __init__(
        self,
        stream: SampleStream,
        *,
        start: int,
        effective_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.stream = stream
        self.start = start
        self.effective_batch = effective_batch
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.accum_steps = effective_batch // (micro_batch * world_size)

    def __iter__(self) -> Iterator[list[int]]:
        window = self.start
        while True:
            for k in range(self.accum_steps):
                first = window + (k * self.world_size + self.rank) * self.micro_batch
                yield self.stream.take(first, self.micro_batch)
            window += self.effective_batch


def loader_for(
    dataset: Any,
    sampler: MicroBatchSampler,
    *,
    seed: int,
    collate_fn: Callable[[list[Any]], Any] | None,
    num_workers: int,
    pin_memory: bool,
) -> torch.utils.data.DataLoader:
    """A DataLoader over `dataset` in the sampler's micro-batches, with a generator of its own
    seeded with `seed`: the loader draws its workers' base seed from it instead of from the
    global torch RNG, which a resumed run must find exactly as it was saved."""
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=torch.Generator().manual_seed(seed),
    )
