"""The plan's memory estimate as it travels to the runtime, to meet what the runtime measures.

`skygreen up` sends the estimate for the run's GPUs (`skygreen.plan.memory.planned_memory`) in
`SKYGREEN_MEMORY_PLANNED_GB` (`skygreen.task.settings.RuntimeSettings.memory_planned_gb`, as
`low=..,high=..,tensors=..,gpus=N`); the runtime writes it into its ledger segment beside the
peak it measured (`skygreen.runtime.peak_memory`), and `skygreen status` shows the two side by
side. Why the tensors term travels too: the range's ends add the CUDA context and the
allocator's slack, which `torch.cuda.max_memory_allocated` does not count, so the measured peak
is compared with the states, activations and logits the estimate adds up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from skygreen.memory.estimate import MemoryEstimate

_KEYS = ("low", "high", "tensors", "gpus")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannedMemory:
    """One GPU's planned memory in GB (1e9 bytes), for a run on `gpus` GPUs in all.

    Raises:
        ValueError: a figure that is not a finite number >= 0, `low` above `high`, or fewer than
            one GPU.
    """

    low_gb: float
    high_gb: float
    tensors_gb: float
    """States, activations and logits at the central estimate: what an allocator's peak counts."""
    gpus: int = 1

    def __post_init__(self) -> None:
        for name in ("low_gb", "high_gb", "tensors_gb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of GB >= 0, got {value!r}")
        if self.low_gb > self.high_gb:
            raise ValueError(f"low ({self.low_gb:g} GB) is above high ({self.high_gb:g} GB)")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus must be a whole number >= 1, got {self.gpus!r}")

    @classmethod
    def of(cls, estimate: MemoryEstimate, *, gpus: int) -> PlannedMemory:
        """The range and the tensors of `estimate`, rounded to MB as `plan --json` shows them."""
        tensors = estimate.states + estimate.activations + estimate.logits
        return cls(low_gb=round(estimate.low, 3), high_gb=round(estimate.high, 3), tensors_gb=round(tensors, 3),
                   gpus=gpus)  # fmt: skip

    def to_text(self) -> str:
        """`low=0.52,high=1.61,tensors=0.004,gpus=1`: the variable's text."""
        return f"low={self.low_gb:g},high={self.high_gb:g},tensors={self.tensors_gb:g},gpus={self.gpus}"

    @classmethod
    def parse(cls, text: str) -> PlannedMemory:
        """Read `to_text`'s form back.

        Raises:
            ValueError: a missing or unknown key, or a value that is not a number.
        """
        pairs: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or key.strip() not in _KEYS:
                raise ValueError(f"expected {'=N,'.join(_KEYS)}=N, got {part.strip()!r}")
            pairs[key.strip()] = value.strip()
        missing = [k for k in _KEYS if k not in pairs]
        if missing:
            raise ValueError(f"{missing[0]}= is missing")
        try:
            return cls(low_gb=float(pairs["low"]), high_gb=float(pairs["high"]), tensors_gb=float(pairs["tensors"]),
                       gpus=int(pairs["gpus"]))  # fmt: skip
        except ValueError as e:
            raise ValueError(str(e) if "must be" in str(e) or "above" in str(e) else f"not a number: {e}") from None

    def to_json(self) -> dict[str, Any]:
        """`{"low": GB, "high": GB, "tensors": GB, "gpus": N}`, as the ledger and `status --json` carry it."""
        return {"low": self.low_gb, "high": self.high_gb, "tensors": self.tensors_gb, "gpus": self.gpus}
