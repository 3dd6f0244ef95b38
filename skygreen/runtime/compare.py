"""Exact comparison of checkpoint states: every tensor, bit for bit, and every plain value.

Used by the smoke test's save -> load round trip, and by the resume tests, which demand a
resumed run be bit-identical to an uninterrupted one (zero tolerance: `torch.equal` plus the
same dtype and shape; NaNs compare equal to NaNs at the same places).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def first_difference(a: Any, b: Any, path: str = "state", *, ignore: frozenset[str] = frozenset()) -> str | None:
    """The path of the first difference between `a` and `b`, or None when they are identical.

    `ignore` holds full paths to skip (e.g. a wall-clock counter).
    """
    if path in ignore:
        return None
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{path} (tensor vs {type(b if isinstance(a, torch.Tensor) else a).__name__})"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path} ({a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)})"
        same = (
            torch.equal(a, b)
            if not a.is_floating_point()
            else torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
            and torch.equal(a.isnan(), b.isnan())
        )
        return None if same else f"{path} (values differ)"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return f"{path} (keys {sorted(map(str, set(a) ^ set(b)))} in only one)"
        for key in a:
            found = first_difference(a[key], b[key], f"{path}[{key!r}]", ignore=ignore)
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]", ignore=ignore)
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return None
    return None if (type(a) is type(b) and a == b) else f"{path} ({a!r} vs {b!r})"
