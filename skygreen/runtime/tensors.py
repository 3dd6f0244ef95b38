"""Tensors of checkpoint states: copied to the host on their way in, the model's digest, and
the exact comparison of two states (every tensor bit for bit, every plain value).

`model_sha256` is the manifest's model digest (defined in `skygreen.checkpoint.manifest`);
`to_host` refuses, at save time, anything `torch.load(weights_only=True)` would not read back;
`first_difference` serves the smoke test's save -> load round trip and the resume tests, which
demand a resumed run be bit-identical to an uninterrupted one (zero tolerance: `torch.equal`
plus the same dtype and shape; NaNs compare equal to NaNs at the same places).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from skygreen.errors import CheckpointError

_ATOMS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def model_sha256(model_state: Mapping[str, Any]) -> str:
    """sha256 over a state_dict's tensors in sorted name order: name, dtype, shape, bytes.

    Each field is followed by a NUL byte; non-tensor entries are ignored. The definition is
    documented in `skygreen.checkpoint`; with half-precision storage it covers the stored
    (half-precision) tensors, so a loaded state can be checked against the manifest.
    """
    digest = hashlib.sha256()
    for name in sorted(model_state):
        tensor = model_state[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(str(name).encode() + b"\0")
        digest.update(str(tensor.dtype).encode() + b"\0")
        digest.update(str(list(tensor.shape)).encode() + b"\0")
        digest.update(flat.view(torch.uint8).numpy().data if flat.numel() else b"")
        digest.update(b"\0")
    return digest.hexdigest()


def to_host(obj: Any, *, path: str = "state", half: torch.dtype | None = None) -> Any:
    """A deep copy of `obj` with every tensor copied to CPU memory.

    Only what `torch.load(weights_only=True)` reads back is allowed; anything else fails
    here, at save time, naming where it sits, instead of failing the resume later.
    """
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        if half is not None and tensor.is_floating_point():
            return tensor.to("cpu", dtype=half, copy=True)
        return tensor.to("cpu", copy=True)
    if isinstance(obj, Mapping):
        out: dict = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            if not isinstance(key, (str, int)):
                raise CheckpointError(f"{path}: key {key!r} is a {type(key).__name__}; use str or int keys")
            out[key] = to_host(value, path=f"{path}[{key!r}]", half=half)
        return out
    if isinstance(obj, (list, tuple)):
        items = [to_host(v, path=f"{path}[{i}]", half=half) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, _ATOMS):
        return obj
    kind = type(obj).__module__ + "." + type(obj).__qualname__
    fix = (
        "convert it with torch.from_numpy(...) or .tolist()"
        if kind.startswith("numpy")
        else "convert it to tensors, lists or numbers"
    )
    raise CheckpointError(
        f"{path}: a {kind} cannot be checkpointed (weights_only loading would refuse it)\n  fix: {fix}"
    )


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
