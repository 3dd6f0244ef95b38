"""What a checkpoint holds: a mapping of named stateful objects, and the training state among them.

A checkpoint's shared state is `{name: obj.state_dict()}` over a mapping of named objects that
have `state_dict()` / `load_state_dict()` (torchtitan's pattern): model, optimizer, scheduler,
GradScaler, the `TrainingState` below, early stopping, the power profile and the user's extra
objects (`StateGroup`). Each rank's RNG is saved apart, as its own blob (see
`skygreen.runtime.checkpointer`). A trainer that owns its loop builds its own mapping and hands
it to `Checkpointer.save_state` / `Checkpointer.restore_state`.

Checkpoints written before the training state was one record kept `progress`, `batch` and
`counters` at the top level; `upgrade_layout` reads them as a `training` entry, so they still
resume. No torch here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

TRAINING = "training"
"""The name of the `TrainingState` in a checkpoint's state mapping."""

COUNTER_NAMES = ("energy_j", "wall_s", "preemptions", "restarts")


@runtime_checkable
class Stateful(Protocol):
    """Anything a checkpoint can hold: torch modules, optimizers, schedulers, scalers, our records."""

    def state_dict(self) -> Any:
        """Return the object's state, as plain containers and tensors.

        Plain, because a checkpoint is loaded with `torch.load(weights_only=True)`: anything
        else would need unpickling code from the bucket.
        """
        ...

    def load_state_dict(self, state: Any) -> Any:
        """Put a state from `state_dict` back.

        Args:
            state: what `state_dict` returned, as loaded from a checkpoint.
        """
        ...


@dataclass(kw_only=True, slots=True)
class BatchShape:
    """The batch a checkpoint was trained with, so a resume can keep a probed micro-batch.

    Attributes:
        effective: samples per optimizer step across all ranks.
        micro: samples per forward pass on each rank.
        micro_auto: whether the micro-batch was probed (`micro: auto`).
        device_name: the GPU it was probed on; another GPU probes again.

    Raises:
        ValueError: `effective` or `micro` below 1.
    """

    effective: int
    micro: int
    micro_auto: bool = False
    device_name: str = "cpu"

    def __post_init__(self) -> None:
        if self.effective < 1 or self.micro < 1:
            raise ValueError(f"batch shape: effective {self.effective} and micro {self.micro} must be >= 1")


@dataclass(kw_only=True, slots=True)
class TrainingState:
    """Where a run stands, as one record a checkpoint holds under the name `training`.

    Mutable on purpose: the step advances it, the checkpointer saves it, a resume loads it.

    Attributes:
        batch: the batch shape trained with.
        step: optimizer steps done.
        samples_seen: samples trained on across all ranks: the data position.
        counters: cumulative across restarts: `energy_j`, `wall_s`, `preemptions`, `restarts`
            (missing ones start at 0).
        completed: the run reached its end and checkpointed it.

    Raises:
        ValueError: a negative `step` or `samples_seen`.
    """

    batch: BatchShape
    step: int = 0
    samples_seen: int = 0
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTER_NAMES, 0.0))
    completed: bool = False

    def __post_init__(self) -> None:
        if self.step < 0 or self.samples_seen < 0:
            raise ValueError(f"training state: step {self.step} and samples_seen {self.samples_seen} must be >= 0")
        self.counters = {**dict.fromkeys(COUNTER_NAMES, 0.0), **self.counters}

    def advance(self) -> None:
        """Count one optimizer step done: one more step, one effective batch more of samples."""
        self.step += 1
        self.samples_seen += self.batch.effective

    def state_dict(self) -> dict[str, Any]:
        """Return plain values only (ints, floats, strings), so `torch.load(weights_only=True)` reads them."""
        return {
            "step": self.step,
            "samples_seen": self.samples_seen,
            "batch": dataclasses.asdict(self.batch),
            "counters": dict(self.counters),
            "completed": self.completed,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put a saved training state back: progress, counters and completion.

        The batch shape stays this run's: a resume reads the saved one with `saved_batch` and
        decides (the same GPU keeps a probed micro-batch, a different one probes again).

        Args:
            state: a `state_dict()` of a training state.

        Raises:
            KeyError: `state` lacks step, samples_seen or counters.
        """
        self.step = int(state["step"])
        self.samples_seen = int(state["samples_seen"])
        self.counters.update({k: float(v) for k, v in state["counters"].items()})
        self.completed = bool(state.get("completed", False))

    @staticmethod
    def saved_batch(state: Mapping[str, Any]) -> BatchShape:
        """Read the batch shape in a checkpoint's `training` entry.

        Args:
            state: the `training` entry of a loaded checkpoint.

        Returns:
            The batch shape it was trained with.

        Raises:
            KeyError: `state` has no `batch`.
            TypeError: the saved batch has fields `BatchShape` does not know.
            ValueError: the saved batch is out of range.
        """
        return BatchShape(**state["batch"])


class StateGroup:
    """Named stateful objects saved as one entry (the user's extras: a data stream, an EMA ...).

    Args:
        objects: name -> object with `state_dict()` / `load_state_dict()`.
    """

    def __init__(self, objects: Mapping[str, Stateful]) -> None:
        """Group `objects` (copied into a dict; the objects themselves are not copied)."""
        self.objects = dict(objects)

    def state_dict(self) -> dict[str, Any]:
        """Return each object's state under its name."""
        return {name: obj.state_dict() for name, obj in self.objects.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load each object whose name the saved state has; the others keep their state.

        Args:
            state: what `state_dict` returned (name -> the object's state).
        """
        for name, obj in self.objects.items():
            if name in state:
                obj.load_state_dict(state[name])


def capture(states: Mapping[str, Stateful | None]) -> dict[str, Any]:
    """`{name: obj.state_dict()}` for every object that is not None.

    Raises:
        TypeError: an object has no `state_dict`/`load_state_dict`.
    """
    out: dict[str, Any] = {}
    for name, obj in states.items():
        if obj is None:
            continue
        if not isinstance(obj, Stateful):
            raise TypeError(f"state {name!r}: a {type(obj).__name__} has no state_dict()/load_state_dict()")
        out[name] = obj.state_dict()
    return out


def apply(states: Mapping[str, Stateful | None], saved: Mapping[str, Any]) -> list[str]:
    """Load each object from its entry in `saved`; returns the names `saved` had nothing for.

    An entry that is None or empty (a scheduler or GradScaler that was off when saved) leaves
    the object as it is, as does a missing one.
    """
    missing = []
    for name, obj in states.items():
        if obj is None:
            continue
        value = saved.get(name)
        if value is None or (isinstance(value, Mapping) and not value):
            if name not in saved:
                missing.append(name)
            continue
        obj.load_state_dict(value)
    return missing


def upgrade_layout(saved: Mapping[str, Any]) -> dict[str, Any]:
    """Return a checkpoint's shared state in today's layout.

    One written before the `training` entry (`progress`, `batch`, `counters` at the top level)
    gets it built from those, so old checkpoints still resume.

    Args:
        saved: the shared state as loaded.

    Returns:
        A new dict; `saved` is not changed.
    """
    out = dict(saved)
    if TRAINING not in out and "progress" in out:
        batch = out.pop("batch")
        out[TRAINING] = {
            "step": int(out["progress"]["step"]),
            "samples_seen": int(out.pop("progress")["samples_seen"]),
            "batch": {k: batch[k] for k in ("effective", "micro", "micro_auto", "device_name")},
            "counters": out.pop("counters"),
        }
    return out
