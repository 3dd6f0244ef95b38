"""The human view of a `Plan`: a rich table of the best offers, the best per cloud, and why.

Kept apart from `cli.py` so the command stays a thin parse-call-print, and from `plan.py` so
the ranking core never imports rich.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from skygreen.plan.rank import Candidate, Plan


def _price(usd: float | None) -> str:
    return "-" if usd is None else f"{usd:,.3f}"


def _table(title: str, rows: list[tuple[str, Candidate]]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for name, justify in (
        ("#", "right"), ("cloud", "left"), ("region", "left"), ("instance", "left"), ("GPUs", "left"),
        ("spot", "left"), ("spot\n$/h", "right"), ("on-demand\n$/h", "right"), ("est.\nhours", "right"),
        ("est.\ncost $", "right"), ("energy\nkWh", "right"), ("CO2e\nkg", "right"),
    ):  # fmt: skip
        table.add_column(name, justify="right" if justify == "right" else "left")
    for rank, c in rows:
        nodes = f" x{c.num_nodes}n" if c.num_nodes > 1 else ""
        table.add_row(
            rank,
            c.cloud,
            c.region,
            c.instance_type,
            f"{c.accelerator}:{c.accelerator_count}{nodes}",
            "yes" if c.spot else "no",
            _price(c.spot_price_usd_per_hour),
            _price(c.on_demand_price_usd_per_hour),
            f"{c.est_hours:,.1f}",
            f"{c.est_cost_usd:,.2f}",
            f"{c.energy_kwh:,.1f}",
            f"{c.co2e_kg:,.1f}",
        )
    return table


def print_plan(plan: Plan, *, top: int = 10, console: Console | None = None) -> None:
    """Ranked offers (top N), best per cloud, the reason, and the assumptions, on stdout."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or captured: do not squeeze into 80 columns
            console = Console(width=max(console.width, 150))
    shown = [(str(i + 1), c) for i, c in enumerate(plan.candidates[:top])]
    title = f"Best {len(shown)} of {len(plan.candidates)} offers by {plan.objective} (catalog: {plan.catalog_source})"
    console.print(_table(title, shown))
    position = {id(c): i + 1 for i, c in enumerate(plan.candidates)}
    per_cloud = [(str(position[id(c)]), c) for c in plan.best_per_cloud.values()]
    console.print(_table("Best per cloud", per_cloud))
    for line in plan.reason:
        console.print(line, highlight=False)
    if plan.night_hint:
        console.print(plan.night_hint, highlight=False)
    console.print("[dim]Assumptions: " + "; ".join(plan.assumptions) + "[/dim]", highlight=False)
