"""`skygreen power`'s table of the GPUs here (`skygreen.power.caps` reads them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from skygreen.power.simulated import SIMULATED_GPU_ENV
from skygreen.terminal import output_width, write_table


def print_gpus(report: Mapping[str, Any], out: TextIO) -> None:
    """Write the table of a `local_gpus()` report to `out`, one row per GPU, limits in watts.

    A limit NVML could not read, or a GPU skygreen has not capped, shows as '-'. With no GPU,
    writes the report's reason and how to try a simulated GPU instead.
    """
    if not report["gpus"]:
        out.write(f"no GPU power limits to show: {report['reason']}\n")
        out.write(f"  (set {SIMULATED_GPU_ENV}=<GPU name> to try skygreen's power caps on a simulated GPU)\n")
        return
    header = ("GPU", "NAME", "LIMIT W", "DEFAULT W", "MIN W", "MAX W", "SKYGREEN CAP")
    table: list[tuple[str, ...]] = [header]
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
    write_table(table, out, width=output_width(out), right=(0, 2, 3, 4, 5))
    if any(g["simulated"] for g in report["gpus"]):
        out.write(f"simulated GPU ({SIMULATED_GPU_ENV}): limits and energy come from skygreen's model, not hardware\n")


def _w(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
