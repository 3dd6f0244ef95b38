"""The human view of a `Plan`: a table of the best offers, the best per cloud, and why.

Kept apart from `cli.py` so the command stays a thin parse-call-print. Drawn as rich draws a
table (the same box, the same widths, lines broken where rich breaks them) without importing
rich: its import and drawing were about a third of `skygreen plan`'s CPU time (see
benchmarks/RESULTS.md), and tests/test_plan_report.py checks the output against rich's own.

Never a truncated name or number: at 80 columns rich used to cut `A100-80GB` to `A10…` (which
reads as another, cheaper GPU) and prices to `0.4…`. Each column here is as wide as its widest
cell; when the table does not fit the console, whole columns are left out, least telling
first (CO2e, energy, instance type, on-demand price, ...), never the one the plan ranks by, and
a line says which; when even the essential columns do not fit, each offer is printed as two
lines of text instead (stacked).

When the checkpoint bucket costs some offer something (transfer, storage, requests:
`skygreen.bill`), the cost shows as three columns, compute, data and total, the total being
what the plan ranks by; otherwise as one.

A task with `skygreen.model` gets one more column, the GPU memory each offer needs per GPU
(`Candidate.memory_per_gpu_gb`): a sharded model needs less on more GPUs, so it differs from
row to row and says how close an offer is to not holding the model. Tasks without a model
never show it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from skygreen.figures import amount, duration_h, usd, usd_per_hour
from skygreen.plan.candidate import Candidate, Plan
from skygreen.terminal import box_table_lines, output_width, wrap_words

WIDE_CONSOLE = 200
"""Width when the output is not a terminal and COLUMNS is not set (piped into a file)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Column:
    key: str
    header: str
    justify: str
    cell: Callable[[Candidate], str]


def _price(value: float | None) -> str:
    return "-" if value is None else usd_per_hour(value)


def _memory(gb: float | None) -> str:
    return "-" if gb is None else f"{gb:.3g}"


def _gpus(c: Candidate) -> str:
    nodes = f" x{c.num_nodes}n" if c.num_nodes > 1 else ""
    return f"{c.accelerator}:{c.accelerator_count}{nodes}"


COLUMNS: tuple[_Column, ...] = (
    _Column(key="cloud", header="cloud", justify="left", cell=lambda c: c.cloud),
    _Column(key="region", header="region", justify="left", cell=lambda c: c.region),
    _Column(key="instance", header="instance", justify="left", cell=lambda c: c.instance_type),
    _Column(key="gpus", header="GPUs", justify="left", cell=_gpus),
    _Column(key="memory", header="mem\nGB/GPU", justify="right", cell=lambda c: _memory(c.memory_per_gpu_gb)),
    _Column(key="spot", header="spot", justify="left", cell=lambda c: "yes" if c.spot else "no"),
    _Column(key="price", header="$/h", justify="right", cell=lambda c: usd_per_hour(c.price_usd_per_hour)),
    _Column(
        key="on_demand", header="on-demand\n$/h", justify="right", cell=lambda c: _price(c.on_demand_price_usd_per_hour)
    ),
    _Column(key="time", header="est.\ntime", justify="right", cell=lambda c: duration_h(c.est_hours)),
    _Column(key="compute", header="compute\n$", justify="right", cell=lambda c: usd(c.compute_usd)),
    _Column(key="data", header="data\n$", justify="right", cell=lambda c: usd(c.data_usd)),
    _Column(key="cost", header="est.\ncost $", justify="right", cell=lambda c: usd(c.est_cost_usd)),
    _Column(key="energy", header="energy\nkWh", justify="right", cell=lambda c: amount(c.energy_kwh)),
    _Column(key="co2e", header="CO2e\nkg", justify="right", cell=lambda c: amount(c.co2e_kg)),
)
TOTAL_COLUMN = _Column(key="cost", header="total\n$", justify="right", cell=lambda c: usd(c.est_cost_usd))
"""The cost column beside compute and data, when the bucket costs the run something."""
DROP_ORDER: tuple[str, ...] = ("co2e", "energy", "instance", "on_demand", "memory", "time", "spot", "price")
"""Columns left out, in this order, until the table fits; the rest always stay."""
OBJECTIVE_COLUMN = {"cost": "cost", "time": "time", "energy": "energy", "carbon": "co2e"}


def _header_text(column: _Column) -> str:
    return column.header.replace("\n", " ")


def _natural_width(columns: Sequence[_Column], rows: Sequence[tuple[str, Candidate]]) -> int:
    """The width rich needs to draw these columns without wrapping: each column as wide as its
    widest header line or cell, plus one space of padding each side and a border between."""
    widths = [max([len("#"), *(len(rank) for rank, _ in rows)])]
    for column in columns:
        lines = [*column.header.split("\n"), *(column.cell(c) for _, c in rows)]
        widths.append(max(len(line) for line in lines))
    return sum(widths) + 2 * len(widths) + len(widths) + 1


def fitting_columns(
    rows: Sequence[tuple[str, Candidate]], *, width: int, objective: str
) -> tuple[tuple[_Column, ...], tuple[_Column, ...]] | None:
    """(shown, left out): the columns that fit in `width` once the least telling are left out;
    None when even the essential ones do not fit."""
    keep = OBJECTIVE_COLUMN.get(objective)
    with_memory = any(c.memory_per_gpu_gb is not None for _, c in rows)
    with_data = any(c.data_usd > 0 for _, c in rows)
    shown = [
        TOTAL_COLUMN if with_data and c.key == "cost" else c
        for c in COLUMNS
        if (with_memory or c.key != "memory") and (with_data or c.key not in ("compute", "data"))
    ]
    dropped: list[_Column] = []
    for key in (k for k in DROP_ORDER if k != keep and any(c.key == k for c in shown)):
        if _natural_width(shown, rows) <= width:
            break
        column = next(c for c in shown if c.key == key)
        shown.remove(column)
        dropped.append(column)
    if _natural_width(shown, rows) > width:
        return None
    return tuple(shown), tuple(dropped)


class PlanWriter:
    """Lines to a stream, broken at `width` as rich's console breaks them; `styled` (a terminal)
    adds the ANSI codes rich would (italic titles, bold headers, dim assumptions)."""

    def __init__(self, out: TextIO, *, width: int, styled: bool) -> None:
        self.out = out
        self.width = width
        self.styled = styled

    def line(self, text: str, *, dim: bool = False) -> None:
        """`text` wrapped at the width (its own newlines kept)."""
        for part in text.split("\n"):
            for line in wrap_words(part, self.width):
                self.out.write(f"\x1b[2m{line}\x1b[0m\n" if dim and self.styled else f"{line}\n")

    def table(self, title: str, rows: Sequence[tuple[str, Candidate]], columns: Sequence[_Column]) -> None:
        """The offers as a boxed table, the rank first."""
        headers = ["#", *(column.header for column in columns)]
        right = {0, *(i + 1 for i, column in enumerate(columns) if column.justify == "right")}
        cells = [[rank, *(column.cell(c) for column in columns)] for rank, c in rows]
        for line in box_table_lines(title, headers, cells, right, styled=self.styled):
            self.out.write(line + "\n")


def _stacked(title: str, rows: Sequence[tuple[str, Candidate]], writer: PlanWriter) -> None:
    """Each offer as two lines of words, for consoles too narrow for any table."""
    writer.line(title)
    for rank, c in rows:
        writer.line(f"{rank:>3} {c.cloud} {c.region} {c.instance_type}")
        offer = f"{_gpus(c)} {'spot' if c.spot else 'on-demand'} ${usd_per_hour(c.price_usd_per_hour)}/h"
        if c.memory_per_gpu_gb is not None:
            offer += f", {_memory(c.memory_per_gpu_gb)} GB per GPU"
        data = f" (compute ${usd(c.compute_usd)}, data ${usd(c.data_usd)})" if c.data_usd > 0 else ""
        estimate = f"est. ${usd(c.est_cost_usd)}{data} in {duration_h(c.est_hours)}, {amount(c.energy_kwh)} kWh, {amount(c.co2e_kg)} kg CO2e"
        writer.line(f"    {offer}; {estimate}")


def _print_offers(
    title: str, rows: Sequence[tuple[str, Candidate]], writer: PlanWriter, fit: tuple[tuple[_Column, ...], ...] | None
) -> None:
    if fit is None:
        _stacked(title, rows, writer)
        return
    writer.table(title, rows, fit[0])


def plan_writer(out: TextIO | None = None) -> PlanWriter:
    """A writer as wide as the terminal; piped output without COLUMNS gets a wide one."""
    out = out or sys.stdout
    try:
        styled = out.isatty()
    except (AttributeError, ValueError):
        styled = False
    return PlanWriter(out, width=output_width(out) or WIDE_CONSOLE, styled=styled)


def print_plan(plan: Plan, *, top: int = 10, writer: PlanWriter | None = None) -> None:
    """Ranked offers (top N), best per cloud, the reason, and the assumptions, on stdout."""
    writer = writer or plan_writer()
    shown = [(str(i + 1), c) for i, c in enumerate(plan.candidates[:top])]
    title = f"Best {len(shown)} of {len(plan.candidates)} offers by {plan.objective} (catalog: {plan.catalog_source})"
    position = {id(c): i + 1 for i, c in enumerate(plan.candidates)}
    per_cloud = [(str(position[id(c)]), c) for c in plan.best_per_cloud.values()]
    # One set of columns for both tables, fitted to the rows of both: the best per cloud never
    # shows a figure the main table leaves out, and the line below names exactly what is missing.
    fit = fitting_columns([*shown, *per_cloud], width=writer.width, objective=plan.objective)
    _print_offers(title, shown, writer, fit)
    _print_offers("Best per cloud", per_cloud, writer, fit)
    dropped = fit[1] if fit is not None else ()
    if dropped:
        names = ", ".join(_header_text(c) for c in dropped)
        writer.line(f"Not shown at {writer.width} columns: {names} (a wider terminal or --json shows them).")
    for line in plan.reason:
        writer.line(line)
    if plan.night_hint:
        writer.line(plan.night_hint)
    writer.line("Assumptions: " + "; ".join(plan.assumptions), dim=True)
