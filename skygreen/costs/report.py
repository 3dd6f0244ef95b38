"""Plain-text views of costs for the terminal: `skygreen cost RUN|TASK` and `skygreen compare`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TextIO

from skygreen.costs.costing import CompareRow, RunCostReport, TaskEstimate
from skygreen.costs.spend import TeamSpend
from skygreen.ledger.changeover import changeovers
from skygreen.ledger.changeover import describe as describe_changeover
from skygreen.terminal import output_width, table_width, write_table


def _usd(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.4f}" if 0 < abs(value) < 0.01 else f"${value:,.2f}"


def _num(value: float | None, fmt: str = "{:,.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(rows: Sequence[Sequence[str]], out: TextIO, indent: str = "  ", right: Sequence[int] = ()) -> None:
    """A `rich.Table` as wide as the terminal or `$COLUMNS` allows (`terminal.output_width`):
    long cells fold onto more lines; piped without COLUMNS, every row stays on one line."""
    write_table(rows, out, width=output_width(out), indent=len(indent), right=right)


def _say(out: TextIO, text: str, *, indent: str = "  ") -> None:
    """A line of prose, wrapped like the tables to `terminal.output_width` (a path longer than
    the line stands alone rather than cut)."""
    width = output_width(out)
    if width is None:
        out.write(text + "\n")
        return
    import textwrap

    lines = textwrap.wrap(text, width=width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    out.write("\n".join(lines) + "\n")


def _when(unix_s: float, *, short: bool = False) -> str:
    """UTC; `short`: `05-28 20:26` (month-day and minutes) for the segment table's narrow column."""
    return time.strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S", time.gmtime(unix_s))


def print_run_cost(report: RunCostReport, out: TextIO) -> None:
    """Write `skygreen cost RUN`'s text to `out`: a row per segment, the totals, energy and assumptions.

    Times are UTC. A price marked `*` was looked up in the catalog now; a local run's cloud
    estimate, or why it has none, follows.
    """
    c = report.cost
    kind = "local run" if c.local else "cloud run"
    last = report.segments[-1] if report.segments else None
    state = f"{last.end} at step {c.steps}" if last else "no segments"
    epochs = f" (epoch {c.epochs:.2f})" if c.epochs is not None else ""
    out.write(f"run {c.run_id}: {kind}, {len(report.segments)} segment(s), {state}{epochs}\n")
    # short headers and cells, so that at 80 columns cells wrap between words, never inside one
    rows = [("#", "where", "started UTC", "hours", "ended", "steps", "$/h", "cost", "kWh")]
    for sc in c.segments:
        s = sc.segment
        price = (
            "-"
            if sc.price_usd_per_hour is None
            else f"{sc.price_usd_per_hour:.3f}" + ("*" if sc.price_source == "catalog" else "")
        )
        where = s.place.label.replace("/", " ", 1)  # "gcp us-central1": two words a narrow column can wrap
        rows.append((str(s.segment), where, _when(s.started_at, short=True), f"{s.duration_s / 3600:.3f}", s.end,
                     f"{s.start_step}->{s.step}", price, _usd(sc.cost_usd), _num(sc.energy_kwh)))  # fmt: skip
    _table(rows, out, right=(3, 6, 7, 8))
    if any(sc.price_source == "catalog" for sc in c.segments):
        out.write("  * price looked up in the catalog now (the segment did not carry its launch price)\n")
    out.write(f"total {_usd(c.total_usd)}:\n")
    _table([("part", "cost", "how known", "what"), *bill_lines(c)], out, indent="    ", right=(1,))
    out.write(f"per completed step {_usd(c.cost_per_step_usd)}; per epoch {_usd(c.cost_per_epoch_usd)}\n")
    energy = "not metered (CPU, or no GPU energy counter)" if c.energy_kwh is None else f"{c.energy_kwh:.4f} kWh"
    co2 = "-" if c.co2e_kg is None else f"{c.co2e_kg:.4f} kg CO2e"
    out.write(f"energy {energy}; {co2}\n")
    out.write(
        f"preemptions {c.preemptions}: {c.lost_s:.0f} s of work lost to restarts and redone steps ({_usd(c.lost_usd)})\n"
    )
    resumed = changeovers([sc.segment for sc in c.segments])
    if resumed:
        out.write("changeovers (first setup line or process start -> first new step):\n")
        for row in resumed:
            out.write(f"  {describe_changeover(row)}\n")
    if c.unpriced_segments:
        out.write(f"warning: {c.unpriced_segments} segment(s) ran on an offer with no known price and count $0\n")
    out.write("assumptions:\n")
    for line in c.assumptions:
        _say(out, f"  - {line}", indent="    ")
    if report.estimate_error:
        out.write(f"\nno estimate on the clouds: {report.estimate_error}\n")
    if report.cloud_estimate is not None:
        out.write("\nESTIMATE, not a bill: the same task on each cloud's best offer\n")
        print_task_estimate(report.cloud_estimate, out, header=False)


def bill_lines(c: Any) -> list[tuple[str, str, str, str]]:
    """The bill of a `RunCost` line by line: (part, dollars, measured or estimated, what it is)."""
    data = c.data
    what = {
        "compute": "each segment's time x its offer's price",
        "controller": "managed-jobs controller, whole span" if c.controller_usd else "none (no managed job)",
        "transfer": f"{data.uploaded_bytes / 1e9:,.3f} GB up, {data.downloaded_bytes / 1e9:,.3f} GB down",
        "storage": "checkpoints kept, for the run's span",
        "requests": f"~{data.writes:,.0f} writes, ~{data.reads:,.0f} reads",
    }
    return [(name, _usd(usd), basis, what[name]) for name, usd, basis in c.parts]


def _cand(c: Any) -> tuple[str, ...]:
    """An offer's cells: where, $/h, hours, then its bill: compute, data (transfer, storage and
    requests to the checkpoint bucket) and the total the plan ranks by."""
    if c is None:
        return ("-", "-", "-", "-", "-", "-")
    return (
        f"{c.region} {c.instance_type} ({c.accelerator}x{c.accelerator_count})",
        f"{c.price_usd_per_hour:.3f}",
        f"{c.est_hours:.2f}",
        _usd(c.compute_usd),
        _usd(c.data_usd),
        _usd(c.est_cost_usd),
    )


def print_task_estimate(est: TaskEstimate, out: TextIO, *, header: bool = True) -> None:
    """Write the plan's pick, then a row per cloud with its best spot and on-demand offer, and the speeds used.

    `header=False` leaves out the first line (the task and catalog), as under a run's cost.
    The catalog notices are not written here.
    """
    if header:
        _say(out, f"estimated cost per run of {est.task} (catalog: {est.catalog_source})")
    if est.pick is not None:
        p = est.pick
        _say(out, f"plan's pick: {p.label}: {_usd(p.est_cost_usd)} in {p.est_hours:.2f} h")
    else:
        _say(
            out,
            "plan's pick: none within the task's constraints (budget, max price); per-cloud figures below ignore them",
        )
    figures = ("$/h", "est. h", "compute", "data", "total")
    heads: tuple[str, ...] = ("cloud", "best spot offer", *figures, "best on-demand offer", *figures)
    rows: list[tuple[str, ...]] = [heads, *((ce.cloud, *_cand(ce.spot), *_cand(ce.on_demand)) for ce in est.clouds)]
    width = output_width(out)
    if width is None or table_width(rows, indent=2) <= width:
        write_table(rows, out, width=width, indent=2, right=(2, 3, 4, 5, 6, 8, 9, 10, 11, 12))
    else:  # too narrow for both offers side by side: one table for each kind (compute left to total - data
        for kind, first in (("spot", 1), ("on-demand", 7)):  # where even that does not fit)
            part: list[tuple[str, ...]] = [("cloud", f"best {kind} offer", *figures)]
            part += [(row[0], *row[first : first + 6]) for row in rows[1:]]
            if table_width(part, indent=2) > width:
                part = [(*row[:4], *row[5:]) for row in part]
            write_table(part, out, width=width, indent=2, right=tuple(range(2, len(part[0]))))
    if est.bucket:
        _say(out, f"data: checkpoint transfer, storage and requests (estimated); {est.bucket}")
    speeds = ", ".join(f"{gpu} {kind}" for gpu, kind in est.speeds.items())
    _say(out, f"speeds: {speeds}")


def print_compare(rows: Sequence[CompareRow], out: TextIO) -> None:
    """Write `skygreen compare`'s table to `out`, one row per run, '-' where a figure is unknown.

    Where one table would not fit the width (`terminal.output_width`: `$COLUMNS`, the terminal),
    it is two that do, each led by the run: time, money and energy, then the metric; cells wrap
    between words, never inside a run id or a metric's name."""
    table = [("run", "clouds (node-h)", "hours", "cost", "data", "kWh", "kg CO2e", "metric", "final", "improved",
              "$ per unit")]  # fmt: skip
    for r in rows:
        c = r.cost
        mix = ", ".join(f"{cloud} {h:.3f}" for cloud, h in sorted(c.clouds.items()))
        final = c.final_metrics.get(r.metric) if r.metric else None
        table.append((r.record.run_id, mix, f"{c.span_h:.3f}", _usd(c.total_usd), _usd(c.data.total_usd), _num(c.energy_kwh), _num(c.co2e_kg),
                      f"{r.metric} ({r.mode})" if r.metric else "-", _num(final, "{:.4f}"), _num(r.improvement, "{:.4f}"), _usd(r.usd_per_improvement)))  # fmt: skip
    width = output_width(out)
    if width is None or table_width(table) <= width:
        _table(table, out, indent="", right=(2, 3, 4, 5, 6, 8, 9, 10))
    else:
        _table([row[:7] for row in table], out, indent="", right=(2, 3, 4, 5, 6))
        out.write("\n")
        _table([(row[0], *row[7:]) for row in table], out, indent="", right=(2, 3, 4))
    for line in (
        "improved: first - last report for a (min) metric, last - first for (max): early stopping's mode, else by name",
        "$ per unit: total cost / improved; local runs cost $0 of compute",
        "data: checkpoint transfer (measured bytes), storage and requests (`skygreen cost RUN` itemises them)",
    ):
        _say(out, line)


def print_team_spend(spend: TeamSpend, out: TextIO) -> None:
    """Write `skygreen cost --all`'s text to `out`: a headline with the total dollars, energy and
    CO2e, then a row per group (`--by`) or per run (most recent first), running runs marked."""
    from skygreen.costs.spend import THIS_MACHINE, describe_since

    t = spend.total
    sources = " + ".join((THIS_MACHINE, *spend.buckets))
    going = f"; {t.running} still running (counted to their last ledger update)" if t.running else ""
    green = "energy not metered (CPU only)" if t.energy_kwh is None else f"{_kwh(t.energy_kwh)}, {_co2(t.co2e_kg)}"
    _say(out, f"spend of {t.runs} run(s), {describe_since(spend.since_s)}, from {sources}: "
              f"{_usd(t.total_usd)}, {green}{going}")  # fmt: skip
    if spend.by:
        rows = [(spend.by, "runs", "node-h", "cost", "kWh", "kg CO2e")]
        for g in (*spend.groups, t):
            runs = f"{g.runs}" + (f" ({g.running} running)" if g.running else "")
            rows.append((g.name, runs, f"{g.node_hours:.4f}", _usd(g.total_usd), _num(g.energy_kwh, "{:.4f}"),
                         _num(g.co2e_kg, "{:.4f}")))  # fmt: skip
        _table(rows, out, right=(2, 3, 4, 5))
    elif spend.runs:
        rows_by_run: list[tuple[str, ...]] = [
            ("run", "task", "user", "where", "state", "node-h", "cost", "data", "kWh", "kg CO2e")
        ]
        for r in spend.runs:
            j = r.to_json()
            where = ",".join(j["clouds"]) + " " + ",".join(j["gpus"])
            state = r.state + (" (running)" if r.running and r.state.lower() != "running" else "")
            figures = (f"{r.cost.node_hours:.4f}", _usd(r.cost.total_usd), _usd(r.cost.data.total_usd), _num(r.cost.energy_kwh, "{:.4f}"),
                       _num(r.cost.co2e_kg, "{:.4f}"))  # fmt: skip
            rows_by_run.append((r.run_id, r.task, r.user, where, state, *figures))
        _table(rows_by_run, out, right=(5, 6, 7, 8, 9))
    remote = [r.run_id for r in spend.runs if THIS_MACHINE not in r.found_in]
    if remote:
        out.write(f"{len(remote)} run(s) known only from the buckets (launched on other machines)\n")
    if spend.without_ledger:
        _say(out, f"no ledger yet (not training yet, nothing counted): {', '.join(spend.without_ledger)}")
    if spend.unreadable:
        _say(out, f"not counted: {len(spend.unreadable)} bucket(s) could not be read "
                  f"({', '.join(u.bucket for u in spend.unreadable)}); the total is of the rest")  # fmt: skip
    if any(r.cost.unpriced_segments for r in spend.runs):
        out.write("warning: some segments ran on an offer with no known price and count $0 (see `skygreen cost RUN`)\n")


def _kwh(value: float) -> str:
    return f"{value:.4f} kWh"


def _co2(value: float | None) -> str:
    return "CO2e unknown" if value is None else f"{value:.4f} kg CO2e"
