"""`skygreen power`: the GPUs on this machine, their power limits, and skygreen's caps on them.

Read-only: it sets nothing. A cap is "active" when skygreen's ledger holds the GPU's original
limit (a run or `cap()` block changed it and has not restored it yet); "left by a killed
process" when that owner is dead (the next skygreen start on the GPU restores it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TextIO

from skygreen.errors import PowerError
from skygreen.power.ledger import Ledger
from skygreen.power.nvml import SIMULATED_GPU_ENV, Nvml


def local_gpus(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{"gpus": [...], "reason": why none (or None)}; each GPU in watts."""
    environ = os.environ if environ is None else environ
    try:
        nvml = Nvml(environ=environ)
        devices = nvml.devices()
    except PowerError as e:
        return {"gpus": [], "reason": str(e).splitlines()[0]}
    ledger = Ledger.default(environ)
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
        left = ledger.get(gpu.uuid)
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


def print_gpus(report: Mapping[str, Any], out: TextIO) -> None:
    if not report["gpus"]:
        out.write(f"no GPU power limits to show: {report['reason']}\n")
        out.write(f"  (set {SIMULATED_GPU_ENV}=<GPU name> to try skygreen's power caps on a simulated GPU)\n")
        return
    header = ("GPU", "NAME", "LIMIT W", "DEFAULT W", "MIN W", "MAX W", "SKYGREEN CAP")
    table = [header]
    for g in report["gpus"]:
        cap = g["skygreen_cap"]
        cap_text = (
            "-"
            if cap is None
            else f"{cap['state']} (run {cap['run_id'] or '-'}, pid {cap['pid']}, original {cap['original_limit_w']:g} W)"
        )
        table.append(
            (
                str(g["index"]),
                g["name"],
                *(_w(g[k]) for k in ("power_limit_w", "default_limit_w", "min_limit_w", "max_limit_w")),
                cap_text,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
    if any(g["simulated"] for g in report["gpus"]):
        out.write(f"simulated GPU ({SIMULATED_GPU_ENV}): limits and energy come from skygreen's model, not hardware\n")


def _w(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
