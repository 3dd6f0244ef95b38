"""`skygreen simulate`'s table: the job, the grid, the prices, then one row per policy."""

from __future__ import annotations

import sys
from typing import TextIO

from skygreen.deadline.compare import Simulation
from skygreen.deadline.simulate import on_demand_only
from skygreen.terminal import output_width, write_table


def print_report(sim: Simulation, out: TextIO = sys.stdout) -> None:
    """Write the simulation to `out` as text: the trace, job, grid and price lines, then a table with
    one row per outcome (cost, its ratio to all on-demand, finish hour, deadline met or MISSED,
    spot and on-demand hours per node, changeovers).
    """
    g, job, p = sim.grid, sim.job, sim.prices
    name = sim.trace.name if len(sim.zones) == 1 else f"{sim.trace.name.rsplit(':', 1)[0]} zones {', '.join(sim.zones)}"
    out.write(f"trace: {name} (tick {sim.trace.gap_s:g} s, {sim.trace.span_h:.0f} h)\n")
    if len(sim.zones) > 1:
        out.write(
            "zones: spot in any of them; a preemption in one zone moves the job (a new changeover); "
            "the optimum moves between zones for free (a lower bound)\n"
        )
    out.write(
        f"job: {job.compute_h:g} h of compute on {sim.nodes} node(s), deadline {job.deadline_h:g} h, "
        f"changeover {job.changeover_h:.3g} h, from {sim.start_h:g} h into the trace\n"
    )
    most = max(sim.trace.counts, default=0)
    if most > sim.nodes:  # a gang trace read for a smaller gang: say how to ask for the whole gang
        out.write(
            f"gang: spot counts as available when at least {sim.nodes} of the trace's up to {most} instances were; "
            f"--nodes {most} needs all of them\n"
        )
    out.write(
        f"grid: a decision every {g.dt_h * 60:.3g} min; compute {g.job.compute_h:.4g} h, deadline {g.job.deadline_h:.4g} h, "
        f"changeover {g.job.changeover_h:.3g} h in whole steps\n"
    )
    out.write(
        f"prices per node-hour: spot ${p.spot_usd_per_node_hour:.4g}, on-demand ${p.on_demand_usd_per_node_hour:.4g} "
        f"({sim.price_source}); spot available {sim.spot_fraction:.0%} of the time until the deadline"
        f"{' in some zone' if len(sim.zones) > 1 else ''}\n"
    )
    base = on_demand_only(g, p).cost_usd
    rows: list[tuple[str, ...]] = [("policy", "cost", "vs OD", "finish h", "deadline", "spot h", "OD h", "switches")]
    for o in sim.outcomes:
        rows.append((
            o.policy,
            "$" + format(o.cost_usd, ",.2f"),
            f"{o.cost_usd / base:.2f}" if base > 0 else "-",
            f"{o.finish_h:.2f}" if o.finish_h is not None else "-",
            "met" if o.deadline_met else "MISSED",
            f"{o.spot_h:.2f}",
            f"{o.on_demand_h:.2f}",
            str(o.switches),
        ))  # fmt: skip
    write_table(rows, out, width=output_width(out), right=range(1, 8))
