"""The human view of a `Plan`: a rich table of the best offers, the best per cloud, and why.

Kept apart from `cli.py` so the command stays a thin parse-call-print, and from `plan.py` so
the ranking core never imports rich.

Never a truncated name or number: at 80 columns rich used to cut `A100-80GB` to `A10…` (which
reads as another, cheaper GPU) and prices to `0.4…`. Each column here is as wide as its widest
cell; when the table does not fit the console, whole columns are left out, least telling
first (CO2e, energy, instance type, on-demand price, ...), never the one the plan ranks by, and
a line says which; when even the essential columns do not fit, each offer is printed as two
lines of text instead (stacked).

A task with `skygreen.model` gets one more column, the GPU memory each offer needs per GPU
(`Candidate.memory_per_gpu_gb`): a sharded model needs less on more GPUs, so it differs from
row to row and says how close an offer is to not holding the model. Tasks without a model
never show it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from skygreen.figures import amount, duration_h, usd, usd_per_hour
from skygreen.plan.candidate import Candidate, Plan
from skygreen.terminal import output_width

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
    _Column(key="cost", header="est.\ncost $", justify="right", cell=lambda c: usd(c.est_cost_usd)),
    _Column(key="energy", header="energy\nkWh", justify="right", cell=lambda c: amount(c.energy_kwh)),
    _Column(key="co2e", header="CO2e\nkg", justify="right", cell=lambda c: amount(c.co2e_kg)),
)
DROP_ORDER: tuple[str, ...] = ("co2e", "energy", "instance", "on_demand", "memory", "time", "spot")
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
    shown = [c for c in COLUMNS if with_memory or c.key != "memory"]
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


def _table(title: str, rows: Sequence[tuple[str, Candidate]], columns: Sequence[_Column]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("#", justify="right", no_wrap=True)
    for column in columns:
        table.add_column(column.header, justify=column.justify, no_wrap=True)  # type: ignore[arg-type]
    for rank, c in rows:
        table.add_row(rank, *(column.cell(c) for column in columns))
    return table


def _stacked(title: str, rows: Sequence[tuple[str, Candidate]], console: Console) -> None:
    """Each offer as two lines of words, for consoles too narrow for any table."""
    console.print(title, highlight=False)
    for rank, c in rows:
        console.print(f"{rank:>3} {c.cloud} {c.region} {c.instance_type}", highlight=False)
        offer = f"{_gpus(c)} {'spot' if c.spot else 'on-demand'} ${usd_per_hour(c.price_usd_per_hour)}/h"
        if c.memory_per_gpu_gb is not None:
            offer += f", {_memory(c.memory_per_gpu_gb)} GB per GPU"
        estimate = f"est. ${usd(c.est_cost_usd)} in {duration_h(c.est_hours)}, {amount(c.energy_kwh)} kWh, {amount(c.co2e_kg)} kg CO2e"
        console.print(f"    {offer}; {estimate}", highlight=False)


def _print_offers(
    title: str, rows: Sequence[tuple[str, Candidate]], console: Console, fit: tuple[tuple[_Column, ...], ...] | None
) -> None:
    if fit is None:
        _stacked(title, rows, console)
        return
    console.print(_table(title, rows, fit[0]))


def plan_console() -> Console:
    """A console as wide as the terminal; piped output without COLUMNS gets a wide one."""
    return Console(width=output_width(sys.stdout) or WIDE_CONSOLE)


def print_plan(plan: Plan, *, top: int = 10, console: Console | None = None) -> None:
    """Ranked offers (top N), best per cloud, the reason, and the assumptions, on stdout."""
    console = console or plan_console()
    shown = [(str(i + 1), c) for i, c in enumerate(plan.candidates[:top])]
    title = f"Best {len(shown)} of {len(plan.candidates)} offers by {plan.objective} (catalog: {plan.catalog_source})"
    position = {id(c): i + 1 for i, c in enumerate(plan.candidates)}
    per_cloud = [(str(position[id(c)]), c) for c in plan.best_per_cloud.values()]
    # One set of columns for both tables, fitted to the rows of both: the best per cloud never
    # shows a figure the main table leaves out, and the line below names exactly what is missing.
    fit = fitting_columns([*shown, *per_cloud], width=console.width, objective=plan.objective)
    _print_offers(title, shown, console, fit)
    _print_offers("Best per cloud", per_cloud, console, fit)
    dropped = fit[1] if fit is not None else ()
    if dropped:
        names = ", ".join(_header_text(c) for c in dropped)
        console.print(
            f"Not shown at {console.width} columns: {names} (a wider terminal or --json shows them).", highlight=False
        )
    for line in plan.reason:
        console.print(line, highlight=False)
    if plan.night_hint:
        console.print(plan.night_hint, highlight=False)
    console.print("[dim]Assumptions: " + "; ".join(plan.assumptions) + "[/dim]", highlight=False)
