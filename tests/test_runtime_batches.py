"""Batches and states the runtime rebuilds as it moves them: `to_device` (each micro-batch onto
the training device) and `host_copy` (the smoke test's copy of a saved state) keep namedtuples,
which torch's default collate makes from a dataset of namedtuples, as namedtuples.

No GPU here: `to_device` is exercised on torch's "meta" device, which takes the same path as a
GPU (on CPU the batch comes back untouched).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from skygreen.runtime.environment import to_device
from skygreen.runtime.smoke_mode import host_copy


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class Sample(NamedTuple):
    inputs: Pair
    label: int | torch.Tensor
    """An int in the dataset; collate stacks the labels into a tensor."""


class Samples(torch.utils.data.Dataset[Sample]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Sample:
        return Sample(inputs=Pair(x=torch.full((3,), float(i)), y=torch.tensor(i)), label=i)


def collated_batch() -> Sample:
    """A batch as torch's default collate makes it from a dataset of namedtuples."""
    batch = next(iter(torch.utils.data.DataLoader(Samples(), batch_size=4)))
    assert type(batch) is Sample and type(batch.inputs) is Pair  # what collate really hands the loop
    return batch


def test_to_device_keeps_namedtuple_batches_from_the_default_collate():
    batch = collated_batch()
    moved = to_device([batch, (batch.inputs.x,), {"b": batch}], torch.device("meta"))
    first, plain, mapping = moved
    assert type(first) is Sample and type(first.inputs) is Pair and type(plain) is tuple
    assert first.inputs.x.device.type == "meta" and first.inputs.y.device.type == "meta"
    assert (
        first.inputs.x.shape == (4, 3) and isinstance(first.label, torch.Tensor) and first.label.device.type == "meta"
    )
    assert type(mapping["b"]) is Sample and mapping["b"].inputs.y.device.type == "meta"


def test_host_copy_keeps_namedtuples_and_detaches_their_tensors():
    weight = torch.ones(3, requires_grad=True)
    state = {"pairs": [Pair(x=weight * 2, y=torch.zeros(1))], "sample": collated_batch()}
    copied = host_copy(state)
    pair = copied["pairs"][0]
    assert type(pair) is Pair and not pair.x.requires_grad and torch.equal(pair.x, torch.full((3,), 2.0))
    assert type(copied["sample"]) is Sample and torch.equal(copied["sample"].inputs.y, torch.arange(4))
