"""Figures and the one-page HTML report of runs' costs (`--plot FILE`, `skygreen report RUN`).

Four panels: cost by cloud, cost by segment, spend over time, and the reported loss/metric
curve with preemptions marked. matplotlib comes from the `report` extra and is imported only
here, when a figure is asked for; the page is self-contained (images inlined as base64 PNG, no
script, no network), and carries the plotted series as JSON for anyone who wants the numbers.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skygreen.costs.costing import RunCostReport
from skygreen.errors import InputError
from skygreen.figures import amount, duration_h, money, usd_per_hour
from skygreen.files import write_atomic
from skygreen.ledger.place import LOCAL
from skygreen.ledger.records import KILLED, PREEMPTED

_STYLE = (
    "<meta name='viewport' content='width=device-width, initial-scale=1'>"
    "<style>body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 1em;max-width:1300px;overflow-wrap:anywhere}"
    ".scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;overflow-wrap:normal}th{background:#f3f3f3}"
    "td.l,th.l{text-align:left}pre{background:#f6f6f6;padding:1em;overflow:auto;max-width:100%;box-sizing:border-box}"
    "img{max-width:100%;height:auto}</style></head><body>"
)
NARROW_PX = 700
"""Below this width (a phone) the page shows the figure's one-column version, drawn at the size it is read."""
CLOUD_COLORS = {"aws": "#ff9900", "gcp": "#4285f4", "azure": "#008ad7", "local": "#7f7f7f"}
NO_CLOUD_SPEND = "local run: no cloud spend"
"""What the three cost panels say when every run drawn ran on this machine and no estimate on
the clouds is known (its task file moved, no offer fits)."""


def plain(text: str) -> str:
    """`text` as matplotlib should print it: a `$` escaped, so two dollar amounts in one label
    are not read as a mathtext formula between them (which drops the spaces and the `$`)."""
    return text.replace("$", r"\$")


# ---------------------------------------------------------------- data (pure)


def series(reports: Sequence[RunCostReport]) -> dict[str, Any]:
    """Everything the panels draw, as plain numbers (also embedded in the HTML page)."""
    out: dict[str, Any] = {"runs": []}
    for r in reports:
        c = r.cost
        t0 = min((s.started_at for s in r.segments), default=0.0)
        by_cloud: dict[str, float] = {}
        for sc in c.segments:
            by_cloud[sc.segment.place.cloud] = by_cloud.get(sc.segment.place.cloud, 0.0) + sc.cost_usd
        overhead = c.total_usd - c.compute_usd  # the controller, transfer, storage and requests
        spend_h, spend_usd, total = [0.0], [0.0], 0.0
        for sc in c.segments:
            s = sc.segment
            spend_h += [(s.started_at - t0) / 3600, (s.last_at - t0) / 3600]
            spend_usd += [total, total + sc.cost_usd]
            total += sc.cost_usd
        metrics = {}
        for name in sorted({m for s in r.segments for m in s.metrics}):
            points = sorted((p for s in r.segments for p in s.metrics.get(name, ())), key=lambda p: (p[1], p[0]))
            metrics[name] = {"step": [p[0] for p in points], "value": [p[2] for p in points]}
        preempted_at = [
            nxt.start_step for prev, nxt in itertools.pairwise(r.segments) if prev.end in (PREEMPTED, KILLED)
        ]
        out["runs"].append({
            "run_id": c.run_id,
            "cost_by_cloud_usd": by_cloud,
            "overhead_usd": overhead,
            "segments": [{"segment": sc.segment.segment, "cloud": sc.segment.place.cloud, "label": sc.segment.place.label,
                          "cost_usd": sc.cost_usd, "end": sc.segment.end} for sc in c.segments],
            "spend_hours": spend_h,
            "spend_usd": spend_usd,
            "total_usd": c.total_usd,
            "metrics": metrics,
            "preempted_at_step": preempted_at,
        })  # fmt: skip
    return out


# ---------------------------------------------------------------- figures (matplotlib)


def _matplotlib():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise InputError(
            "plots need matplotlib, which is not installed\n  fix: pip install 'skygreen[report]'"
        ) from None
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    return Figure


def build_figure(reports: Sequence[RunCostReport], *, narrow: bool = False):
    """One figure, four panels; returns the matplotlib Figure (tests read its data back).

    `narrow`: one column, 420 px wide, for a phone's screen (read at its own size, not shrunk).
    A local run's cost panels show what the same task would cost on the clouds, marked as an
    estimate, when its `cloud_estimate` is known."""
    Figure = _matplotlib()
    data = series(reports)
    size = (4.2, 15.0) if narrow else (13, 8.5)
    fig = Figure(figsize=size, dpi=100, layout="constrained")
    ax_cloud, ax_seg, ax_spend, ax_loss = fig.subplots(4, 1).flat if narrow else fig.subplots(2, 2).flat
    _cost_by_cloud(ax_cloud, data)
    _cost_by_segment(ax_seg, data)
    _spend(ax_spend, data)
    _loss(ax_loss, data)
    if _all_local(reports):
        estimate = reports[0].cloud_estimate if len(reports) == 1 else None
        for ax in (ax_cloud, ax_seg, ax_spend):
            ax.clear()
        if estimate is not None and any(c.spot or c.on_demand for c in estimate.clouds):
            _estimate_panels(ax_cloud, ax_seg, ax_spend, estimate)
        else:
            for ax in (ax_cloud, ax_seg, ax_spend):
                ax.set_axis_off()
                ax.text(0.5, 0.5, NO_CLOUD_SPEND, ha="center", va="center", fontsize=12, transform=ax.transAxes)
    names = ", ".join(r["run_id"] for r in data["runs"])
    fig.suptitle(plain(f"skygreen cost: {names}"), fontsize=13)
    return fig


ESTIMATE_MARK = "Estimate"
"""Every title of a panel that shows what a local run would cost on the clouds starts with it."""


def _estimate_panels(ax_spot, ax_od, ax_spend, estimate: Any) -> None:
    """A local run's panels: each cloud's best spot and on-demand offer for the same task, and the
    spend over time on the plan's pick, all from the planner's estimate (nothing was spent)."""
    for ax, kind, words in ((ax_spot, "spot", "spot"), (ax_od, "on_demand", "on-demand")):
        offers = [(c.cloud, getattr(c, kind)) for c in estimate.clouds if getattr(c, kind) is not None]
        bars = ax.bar(range(len(offers)), [o.est_cost_usd for _, o in offers], edgecolor="black",
                      color=[CLOUD_COLORS.get(cloud, "#999") for cloud, _ in offers])  # fmt: skip
        ax.bar_label(bars, labels=[plain(money(o.est_cost_usd)) for _, o in offers], fontsize=8)
        ax.set_xticks(range(len(offers)), [f"{cloud}\n{o.accelerator}x{o.accelerator_count}" for cloud, o in offers])
        ax.set_ylabel("estimated cost per run (USD)")
        ax.set_title(f"{ESTIMATE_MARK}: this task on each cloud's\nbest {words} offer")
    pick = estimate.pick
    if pick is not None:
        where = f"{pick.cloud} {pick.region} {pick.accelerator}x{pick.accelerator_count}"
        label = f"estimate on the plan's pick,\n{where}: {money(pick.est_cost_usd)}"
        ax_spend.plot([0.0, pick.est_hours], [0.0, pick.est_cost_usd], linestyle="--", label=plain(label))
        ax_spend.legend(fontsize=8)
    ax_spend.set_xlabel("hours since the run started")
    ax_spend.set_ylabel("estimated spend (USD)")
    ax_spend.set_title(f"{ESTIMATE_MARK}: spend on the plan's pick\n(this run was local: nothing spent)")
    ax_spend.grid(alpha=0.3)


def _all_local(reports: Sequence[RunCostReport]) -> bool:
    """True when every segment of every run ran on this machine at no price: the cost panels
    would be three empty $0 charts."""
    segments = [sc for r in reports for sc in r.cost.segments]
    return bool(segments) and all(sc.segment.place.cloud == LOCAL and sc.cost_usd == 0 for sc in segments)


def _cost_by_cloud(ax, data) -> None:
    clouds = sorted({cl for r in data["runs"] for cl in r["cost_by_cloud_usd"]})
    runs = data["runs"]
    width = 0.8 / max(1, len(runs))
    for i, r in enumerate(runs):
        xs = [j + i * width for j in range(len(clouds))]
        ys = [r["cost_by_cloud_usd"].get(cl, 0.0) for cl in clouds]
        bars = ax.bar(xs, ys, width=width, label=plain(r["run_id"]), color=[CLOUD_COLORS.get(cl, "#999") for cl in clouds],
                      edgecolor="black", hatch=["", "//", "xx", ".."][i % 4])  # fmt: skip
        ax.bar_label(bars, labels=[plain(money(y)) for y in ys], fontsize=8)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(clouds))], clouds)
    ax.set_ylabel("compute cost (USD)")
    ax.set_title("Cost by cloud (controller and storage not included)")
    if len(runs) > 1:
        ax.legend(fontsize=8)


def _cost_by_segment(ax, data) -> None:
    labels, ys, colors = [], [], []
    several = len(data["runs"]) > 1
    for r in data["runs"]:
        for s in r["segments"]:  # the whole run id (its tail alone names no run), on a line of its own
            run = f"{r['run_id']}\n" if several else ""
            labels.append(plain(f"{run}#{s['segment']} {s['cloud']}\n({s['end']})"))
            ys.append(s["cost_usd"])
            colors.append(CLOUD_COLORS.get(s["cloud"], "#999"))
    bars = ax.bar(range(len(ys)), ys, color=colors, edgecolor="black")
    ax.bar_label(bars, labels=[plain(money(y)) for y in ys], fontsize=8)
    ax.set_xticks(range(len(ys)), labels, fontsize=7)
    ax.set_ylabel("cost (USD)")
    ax.set_title("Cost by segment (one VM lifetime each)")


def _spend(ax, data) -> None:
    for r in data["runs"]:
        label = f"{r['run_id']}: compute {money(r['spend_usd'][-1])} (run total with controller and storage {money(r['total_usd'])})"
        ax.plot(r["spend_hours"], r["spend_usd"], marker="o", markersize=3, label=plain(label))
    ax.set_xlabel("hours since the run started")
    ax.set_ylabel("compute spend so far (USD)")
    ax.set_title("Spend over time")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _loss(ax, data) -> None:
    drawn = False
    for r in data["runs"]:
        for name, points in r["metrics"].items():
            ax.plot(points["step"], points["value"], marker=".", label=plain(f"{r['run_id']} {name}"))
            drawn = True
        for i, step in enumerate(r["preempted_at_step"]):
            ax.axvline(
                step, color="red", linestyle="--", linewidth=1, label="preempted (resumed here)" if i == 0 else None
            )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reported metric")
    ax.set_title("Loss / metric with preemptions")
    if drawn or any(r["preempted_at_step"] for r in data["runs"]):
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no metric reported (run.report(...))", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)


def figure_png(reports: Sequence[RunCostReport], *, narrow: bool = False) -> bytes:
    """The four-panel figure as PNG bytes (`narrow`: one column for a phone); raises `InputError`
    when matplotlib is not installed."""
    buf = io.BytesIO()
    build_figure(reports, narrow=narrow).savefig(buf, format="png")
    return buf.getvalue()


# ---------------------------------------------------------------- files


def write_plot(path: Path, reports: Sequence[RunCostReport]) -> None:
    """`--plot FILE`: a PNG, or (for .html/.htm) the one-page report."""
    suffix = Path(path).suffix.lower()
    if suffix in (".html", ".htm"):
        write_atomic(Path(path), html_page(reports))
    elif suffix == ".png":
        write_atomic(Path(path), figure_png(reports))
    else:
        raise InputError(f"--plot {path}: unknown file type {suffix or '(none)'}\n  fix: end the name in .png or .html")


def html_page(
    reports: Sequence[RunCostReport],
    *,
    task_text: str | None = None,
    plan: Any = None,
    statements: Mapping[str, str] | None = None,
) -> str:
    """One self-contained page: the figure, the segment table, energy, the task and its plan.
    `statements`: each run's energy statement paragraph (`skygreen.power.statement`), by run id."""
    png = base64.b64encode(figure_png(reports)).decode("ascii")
    phone_png = base64.b64encode(figure_png(reports, narrow=True)).decode("ascii")
    title = "skygreen report: " + ", ".join(r.cost.run_id for r in reports)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        _STYLE,
        f"<h1>{html.escape(title)}</h1>",
        f"<p>Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>",
        (
            f"<picture><source media='(max-width: {NARROW_PX}px)' srcset='data:image/png;base64,{phone_png}'>"
            f"<img id='figure' alt='cost by cloud, cost by segment, spend over time, loss with preemptions' src='data:image/png;base64,{png}'></picture>"
        ),
    ]
    for r in reports:
        parts += _run_section(r, (statements or {}).get(r.cost.run_id))
    if task_text is not None:
        parts += ["<h2>Task</h2>", f"<pre id='task'>{html.escape(task_text)}</pre>"]
    if plan:
        parts += _plan_section(plan)
    parts.append(
        f"<script type='application/json' id='series'>{html.escape(json.dumps(series(reports)), quote=False)}</script>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_section(r: RunCostReport, statement: str | None = None) -> list[str]:
    c = r.cost
    rows = "".join(
        f"<tr><td>{sc.segment.segment}</td><td class='l'>{html.escape(sc.segment.place.label)}</td>"
        f"<td>{sc.segment.duration_s / 3600:.4f}</td><td class='l'>{sc.segment.end}</td><td>{sc.segment.start_step}&rarr;{sc.segment.step}</td>"
        f"<td>{'-' if sc.price_usd_per_hour is None else usd_per_hour(sc.price_usd_per_hour)}</td><td>{money(sc.cost_usd)}</td>"
        f"<td>{'-' if sc.energy_kwh is None else amount(sc.energy_kwh)}</td><td>{'-' if sc.co2e_kg is None else amount(sc.co2e_kg)}</td></tr>"
        for sc in c.segments
    )
    energy = (
        f"{amount(c.energy_kwh)} kWh (the GPU boards' {amount(c.gpu_energy_kwh or 0.0)} kWh as metered by the runtime, "
        f"times each segment's cloud's PUE), {amount(c.co2e_kg or 0.0)} kg CO2e"
        if c.energy_kwh is not None
        else "No energy was metered (CPU, or a GPU without NVML's total-energy counter)."
    )
    return [
        f"<h2>Run {html.escape(c.run_id)}</h2>",
        f"<p class='total'>Total <b>{money(c.total_usd)}</b>: "
        + ", ".join(f"{name} {money(usd)} ({basis})" for name, usd, basis in c.parts)
        + f". {c.steps} steps"
        + (f", {c.epochs:.2f} epochs" if c.epochs else "")
        + f"; {c.preemptions} preemption(s) cost {c.lost_s:.0f} s ({money(c.lost_usd)}).</p>",
        *_estimate_note(r),
        (
            "<div class='scroll'><table class='segments'><tr><th>#</th><th class='l'>where</th><th>hours</th><th class='l'>end</th>"
            f"<th>steps</th><th>$/node-h</th><th>cost</th><th>kWh</th><th>kg CO2e</th></tr>{rows}</table></div>"
        ),
        *_changeover_section(c.segments),
        f"<h3>Energy</h3><p class='energy'>{html.escape(energy)}</p>",
        *([f"<p class='statement'>{html.escape(statement)}</p>"] if statement else []),
        "<h3>Assumptions</h3><ul>" + "".join(f"<li>{html.escape(a)}</li>" for a in c.assumptions) + "</ul>",
    ]


def _estimate_note(r: RunCostReport) -> list[str]:
    """For a local run: what the same task would cost on the plan's pick, as an estimate."""
    pick = r.cloud_estimate.pick if r.cloud_estimate is not None else None
    if not r.cost.local or pick is None:
        return []
    kind = "spot" if pick.spot else "on-demand"
    where = f"{pick.cloud} {pick.region} {pick.instance_type} ({pick.accelerator}x{pick.accelerator_count}, {kind})"
    return [
        (
            "<p class='estimate'>This run was local: nothing was spent on the clouds. Estimate: the same task on the "
            f"plan's pick, {html.escape(where)}, would cost about {money(pick.est_cost_usd)} in {duration_h(pick.est_hours)}.</p>"
        )
    ]


def _changeover_section(priced: Sequence[Any]) -> list[str]:
    """One line per resumed segment: setup, restore (bytes and rate), first new step, steps redone."""
    from skygreen.ledger.changeover import changeovers, describe

    rows = changeovers([sc.segment for sc in priced])
    if not rows:
        return []
    items = "".join(f"<li>{html.escape(describe(row))}</li>" for row in rows)
    return [
        f"<h3>Changeovers</h3><p>From the first setup line (or the process start) to the first new step.</p><ul class='changeovers'>{items}</ul>"
    ]


def _plan_section(plan: Any) -> list[str]:
    offers = plan.get("offers", ())
    rows = "".join(
        f"<tr><td class='l'>{html.escape(str(o.get('cloud')))}</td><td class='l'>{html.escape(str(o.get('region')))}</td>"
        f"<td class='l'>{html.escape(str(o.get('instance_type')))}</td><td class='l'>{html.escape(str(o.get('accelerator')))}x{o.get('accelerator_count')}</td>"
        f"<td class='l'>{'spot' if o.get('spot') else 'on-demand'}</td><td>{usd_per_hour(float(o.get('price_usd_per_hour', 0)))}</td>"
        f"<td>{duration_h(float(o.get('est_hours', 0)))}</td><td>{money(float(o.get('est_cost_usd', 0)))}</td></tr>"
        for o in offers
    )
    reason = "".join(f"<p>{html.escape(line)}</p>" for line in plan.get("reason", ()))
    return [
        "<h2>The plan it ran on</h2>",
        reason,
        (
            "<div class='scroll'><table class='plan'><tr><th class='l'>cloud</th><th class='l'>region</th><th class='l'>instance</th>"
            f"<th class='l'>GPUs</th><th class='l'>kind</th><th>$/h</th><th>est. time</th><th>est. cost</th></tr>{rows}</table></div>"
        ),
    ]


def write_report(report: RunCostReport, path: Path, *, statement: str | None = None) -> Path:
    """`skygreen report RUN`: the page, with the run's rendered task, its plan and its energy
    statement (the paragraph `skygreen status RUN --statement` prints)."""
    try:
        task_text = Path(report.record.task_yaml).read_text(encoding="utf-8")
    except OSError:
        task_text = None
    statements = {report.cost.run_id: statement} if statement else None
    write_atomic(
        Path(path), html_page([report], task_text=task_text, plan=report.record.plan_summary, statements=statements)
    )
    return Path(path)
