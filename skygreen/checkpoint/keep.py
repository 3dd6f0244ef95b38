"""How many committed checkpoints retention keeps: the one check, wherever the number comes from.

The task file (`checkpoint.keep`), the runtime's `Checkpointer(keep=...)` and retention itself
all call `check_keep`. A module of its own so that reading a task file does not load the
checkpoint protocol.
"""

from __future__ import annotations

from skygreen.errors import SpecError

MIN_KEEP = 2
"""At least two: the newest checkpoint may be the broken one."""


def check_keep(keep: object, field: str = "keep") -> int:
    """`keep` if it is an integer of at least `MIN_KEEP`, else a `SpecError` naming `field`."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < MIN_KEEP:
        raise SpecError(field, f"must be an integer at least {MIN_KEEP} (the newest checkpoint may be the broken one)",
                        value=keep, hint=f"use {MIN_KEEP} or more")  # fmt: skip
    return keep
