"""`skygreen simulate` on a multi-region trace: every arm over consecutive windows, and a plot.

The job's windows run back to back from `start_h`, each one deadline long. The report gives
per window and in total each arm's cost, its ratio to the optimum (mean, p90, max with a
bootstrap interval), deadlines met, and moves with their egress and changeover shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from skygreen.places.evaluate import ARMS, Job, WindowResult, run_window, summarise
from skygreen.places.moves import MoveTerms
from skygreen.places.place import Market
from skygreen.places.traces import load_market


def simulate_places(trace: Path, *, compute_h: float, deadline_h: float, changeover_h: float, checkpoint_gb: float,
                    zones: Sequence[str] | None = None, start_h: float = 0.0, windows: int = 1) -> dict:  # fmt: skip
    """The report as a dict (`--json`): market, job, per-window results, and the summary. Raises
    ValueError for an unreadable trace, an unknown zone, or windows past the trace's end."""
    market = load_market(trace)
    if zones:
        market = market.subset(tuple(zones))
    job = Job.from_hours(market, compute_h=compute_h, deadline_h=deadline_h,
                         terms=MoveTerms(checkpoint_gb=checkpoint_gb, changeover_s=changeover_h * 3600.0))  # fmt: skip
    first = int(start_h * 3600 / market.tick_s)
    starts = [first + i * job.deadline_ticks for i in range(windows)]
    if starts[-1] + job.deadline_ticks > market.ticks:
        raise ValueError(f"{windows} window(s) of {deadline_h:g} h from {start_h:g} h run past the trace's end")
    results = [run_window(market, job, s) for s in starts]
    return {
        "places": [p.name for p in market.places],
        "tick_s": market.tick_s,
        "work_ticks": job.work_ticks,
        "deadline_ticks": job.deadline_ticks,
        "windows": [w.to_json() for w in results],
        "total": summarise(results),
        "_results": results,
        "_market": market,
    }


def print_places_report(report: dict, out: TextIO) -> None:
    """The report as a table: per window each arm's cost over the optimum, then the totals."""
    out.write(f"places: {', '.join(report['places'])}  ({report['tick_s']:g} s ticks)\n")
    for w in report["windows"]:
        cells = "  ".join(f"{a} ${v['cost_usd']:.2f} ({v['over_optimum']:.3f}x)" for a, v in w["arms"].items())
        out.write(f"window @tick {w['start_tick']}: {cells}\n")
    out.write("arm              cost/opt mean  p90    max    95% CI           met  moves  egress  changeover\n")
    for arm in ARMS:
        row = report["total"].get(arm)
        if row is None:
            continue
        lo, hi = row["over_optimum_ci95"]
        out.write(f"{arm:<16} {row['over_optimum_mean']:>13.3f}  {row['over_optimum_p90']:.3f}  "
                  f"{row['over_optimum_max']:.3f}  [{lo:.3f}, {hi:.3f}]  {row['deadlines_met']}/{row['windows']}  "
                  f"{row['moves']:>5}  {row['egress_share']:.1%}  {row['changeover_share']:.1%}\n")  # fmt: skip


def plot_places(report: dict, path: Path) -> Path:
    """Where the nomad and the optimum were, tick by tick, over every place's spot price (first window)."""
    from skygreen.costs.page import _matplotlib

    figure_class = _matplotlib()
    result: WindowResult = report["_results"][0]
    market: Market = report["_market"]
    win = market.window(result.start_tick, report["deadline_ticks"])
    fig = figure_class(figsize=(10, 6))
    ax_price, ax_place = fig.subplots(2, 1, sharex=True)
    hours = [t * market.tick_h for t in range(win.ticks)]
    for r, place in enumerate(market.places):
        ax_price.plot(hours, [p if up else float("nan") for p, up in zip(win.spot_usd_per_hour[r], win.available[r],
                                                                          strict=True)], label=place.name)  # fmt: skip
    ax_price.set_ylabel("spot USD/h (while up)")
    ax_price.legend(fontsize="small", ncol=3)
    for arm in ("optimum", "nomad"):
        s = result.schedules[arm]
        n = min(len(hours), len(s.place))
        ax_place.step(hours[:n], [p if m else float("nan") for p, m in zip(s.place[:n], s.mode[:n], strict=True)],
                      where="post", label=arm, linewidth=4 if arm == "optimum" else 1.5)  # fmt: skip
    ax_place.set_yticks(range(len(market.places)), [p.name for p in market.places])
    ax_place.set_xlabel("hours from the start")
    ax_place.legend(fontsize="small")
    fig.savefig(path)
    return path


def from_flags(trace: Path, **flags: Any) -> dict | None:
    """None when `trace` is not a multi-region trace; else `simulate_places` from the command's flags as typed (durations like `48h`), with the plot
    drawn when `plot` names a file. Raises InputError for a bad duration, an unreadable trace, an
    unknown zone, or windows past the trace's end."""
    from skygreen.errors import InputError
    from skygreen.places.traces import is_market
    from skygreen.task.readers import read_duration_h

    if not is_market(trace):
        return None
    zone, start = flags["zone"], str(flags["start"])
    try:
        report = simulate_places(
            trace,
            compute_h=read_duration_h(flags["hours"], "--hours"),
            deadline_h=read_duration_h(flags["deadline"], "--deadline"),
            changeover_h=read_duration_h(flags["changeover"], "--changeover"),
            checkpoint_gb=float(flags["checkpoint_gb"]),
            zones=None if zone in (None, "all") else [z.strip() for z in zone.split(",") if z.strip()],
            start_h=0.0 if start.strip() in ("0", "0h") else read_duration_h(start, "--start"),
            windows=int(flags["windows"]),
        )
    except ValueError as e:
        raise InputError(f"TRACE: {e}\n  fix: check --zone, --start and --windows against the trace") from None
    if flags.get("plot") is not None:
        plot_places(report, flags["plot"])
    return report
