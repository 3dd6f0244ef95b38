"""Smoke mode inside the container (`SKYGREEN_SMOKE=1`): a tiny CPU run and a round trip.

The laptop side (`skygreen.launch.smoke`) starts the user's script under this mode and reads
the one line printed here: `SMOKE_LINE` on success, `SMOKE_FAILED <phase>: <error>` otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from skygreen.errors import CheckpointError
from skygreen.runtime.ranks import all_reduce
from skygreen.task.settings import SMOKE_FAILED

if TYPE_CHECKING:
    from skygreen.runtime.checkpointer import Checkpointer
    from skygreen.runtime.sharded import ShardedCheckpointer

SMOKE_STEPS = 2
SMOKE_MICRO_BATCH = 2
SMOKE_ACCUM_STEPS = 2


def host_copy(obj: Any) -> Any:
    """`obj` with every tensor detached and on the CPU, also inside mappings (which come back as
    dicts), lists and tuples (namedtuples keep their type). A tensor already on the CPU keeps its
    storage: nothing is copied.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, Mapping):
        return {k: host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [host_copy(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)  # a namedtuple takes fields
    return obj


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in `obj`, found through mappings, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)


def tensors_only(obj: Any) -> Any:
    """`obj` with every leaf that is not a tensor replaced by None, mappings, lists and tuples kept."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        return {k: tensors_only(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [tensors_only(v) for v in obj]
    return None


def smoke_fail(phase: str, error: BaseException) -> None:
    """Print the smoke-failure line on stderr (the phase, the error's type and the first line of its
    message) and exit with status 1; with SKYGREEN_DEBUG=1, raise `error` itself instead of exiting.
    """
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    sys.stderr.write(f"{SMOKE_FAILED} {phase}: {type(error).__name__}: {message}\n")
    sys.stderr.flush()
    if os.environ.get("SKYGREEN_DEBUG") == "1":
        raise error
    raise SystemExit(1) from error


def round_trip(
    save: Callable[[], Any], checkpointer: Checkpointer | ShardedCheckpointer, step: int, *, leader: bool = True
) -> int:
    """Save, load back, and check every tensor came back equal; returns the tensor count.

    Every rank calls this. `save` returns once this rank's part is written, and rank 0's once
    the commit is (it writes the manifest last), so the ranks meet before any loads: rank 1
    must not look for the checkpoint before rank 0 has committed it. Each rank then checks its
    own state: rank 0 all of it, the others their tensors (their replicas under DDP, their
    shards under FSDP2), since the numbers beside them (a wall clock) are rank 0's in the shared
    state and their own in memory.

    A failure prints the smoke-failure line naming the phase (save or load) and exits.
    """
    phase = "save"
    try:
        saved = host_copy(save())
        all_reduce([0], op="MAX", dtype=torch.int32)  # the ranks meet: rank 0 has committed
        phase = "load"
        loaded = checkpointer.load_latest()
        if loaded is None or loaded.step != step:
            raise CheckpointError("the checkpoint just saved was not found")
        from skygreen.runtime.tensors import first_difference

        own = (lambda state: state) if leader else tensors_only
        diff = first_difference(own(saved), own(loaded.state))
        if diff:
            raise CheckpointError(f"the loaded state differs from the saved one at {diff}")
    except Exception as e:
        smoke_fail(phase, e)
    return sum(1 for _ in tensors(saved))
