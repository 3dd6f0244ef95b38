"""`skygreen power`: the GPUs on this machine, their power limits, and skygreen's caps on them.

Read-only: it sets nothing. A cap is "active" when skygreen's record of original limits holds the GPU's original
limit (a run or `cap()` block changed it and has not restored it yet); "left by a killed
process" when that owner is dead (the next skygreen start on the GPU restores it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from skygreen.errors import PowerError
from skygreen.power.originals import OriginalLimits
from skygreen.power.simulated import SIMULATED_GPU_ENV

if TYPE_CHECKING:
    from skygreen.power.nvml import Nvml


def local_gpus(open_nvml: Callable[[], Nvml], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{"gpus": [...], "reason": why none (or None)}; each GPU in watts. `open_nvml` opens the
    NVML adapter (the composition root's choice)."""
    environ = os.environ if environ is None else environ
    try:
        nvml = open_nvml()
        devices = nvml.devices()
    except PowerError as e:
        return {"gpus": [], "reason": str(e).splitlines()[0]}
    originals = OriginalLimits.default(environ)
    rows = []
    for gpu in devices:
        row: dict[str, Any] = {"index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "simulated": gpu.simulated}
        for key, read in (("power_limit_w", gpu.power_limit_w), ("default_limit_w", gpu.default_limit_w)):
            try:
                row[key] = read()
            except PowerError as e:
                row[key] = None
                row.setdefault("errors", []).append(str(e).splitlines()[0])
        try:
            row["min_limit_w"], row["max_limit_w"] = gpu.limit_range_w()
        except PowerError:
            row["min_limit_w"] = row["max_limit_w"] = None
        left = originals.get(gpu.uuid)
        row["skygreen_cap"] = None if left is None else {
            "original_limit_w": left.original_limit_w, "run_id": left.run_id, "pid": left.pid,
            "state": "active" if left.owner_alive else "left by a killed process",
        }  # fmt: skip
        rows.append(row)
    return {
        "gpus": rows,
        "reason": None if rows else "NVML sees no GPU",
        "simulated": bool(environ.get(SIMULATED_GPU_ENV)),
    }
