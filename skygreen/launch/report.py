"""Plain-text views of runs for the terminal: the `skygreen status` table and detail view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from skygreen.figures import amount
from skygreen.launch.runs import UpResult
from skygreen.launch.status import RunStatus


def _money(value_usd: float | None, estimated: bool = False) -> str:
    from skygreen.figures import usd

    if value_usd is None:
        return "-"
    return f"{'~' if estimated else ''}${usd(value_usd)}"


def _energy(kwh: float | None) -> str:
    return "-" if kwh is None else f"{kwh:.3f} kWh"


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def print_status_table(rows: Sequence[RunStatus], out: TextIO) -> None:
    """One line per run, newest last."""
    if not rows:
        out.write("no runs yet: start one with `skygreen up TASK` (or `--local`)\n")
        return
    header = ("RUN", "MODE", "STATE", "STEP", "MODEL", "PREEMPT", "RECOVER", "SPEND", "ENERGY")
    table = [header] + [
        (
            r.run_id,
            r.mode,
            r.state + ("*" if r.completed else ""),
            _dash(r.step),
            (r.model_sha256 or "-")[:12],
            _dash(r.preemptions),
            str(r.recoveries),
            _money(r.spend_usd, r.spend_estimated),
            _energy(r.energy_kwh),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() + "\n")
    if any(r.completed for r in rows):
        out.write("* training completed (final checkpoint committed)\n")


def print_status_detail(r: RunStatus, out: TextIO) -> None:
    """Everything known about one run."""
    lines = [
        ("run", r.run_id),
        ("task", r.task),
        ("mode", r.mode + (f" ({r.where})" if r.where and r.mode != "local" else "")),
        ("state", r.state + (f" - {r.detail.strip().splitlines()[0]}" if r.detail and r.detail.strip() else "")),
        ("job", f"{_dash(r.job_id)} (launches: {r.launches})"),
        ("step", _dash(r.step) + (" (completed)" if r.completed else "")),
        (
            "checkpoint",
            f"{r.checkpoint_at} at {r.checkpoint_url}" if r.checkpoint_at else f"none yet at {r.checkpoint_url}",
        ),
        ("interval", f"every {r.checkpoint_interval_s:.0f} s" if r.checkpoint_interval_s is not None else "-"),
        ("model_sha256", _dash(r.model_sha256)),
        ("preemptions", _dash(r.preemptions)),
        ("recoveries", str(r.recoveries)),
        (
            "spend so far",
            _money(r.spend_usd, r.spend_estimated)
            + (" (estimated from the plan's best offer)" if r.spend_estimated else ""),
        ),
        *_energy_lines(r),
    ]
    if r.progress_error:
        lines.append(("progress", f"unreadable: {r.progress_error}"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        out.write(f"{key.ljust(width)}  {value}\n")


def _energy_lines(r: RunStatus) -> list[tuple[str, str]]:
    if r.energy is None:
        return [("energy so far", _energy(r.energy_kwh))]
    from skygreen.power.statement import EnergyReport, cap_text, energy_line

    report = EnergyReport(**r.energy)
    lines = [("energy so far", energy_line(report))]
    if report.method != "none":
        lines.append(("CO2e so far", f"{amount(report.co2e_kg)} kg"))
        lines.append(("power cap", cap_text(report)))
    return lines


def print_statement(r: RunStatus, out: TextIO) -> None:
    """The energy statement paragraph (`skygreen status RUN --statement`)."""
    from skygreen.power.statement import EnergyReport, statement

    if r.energy is None:
        out.write(f"run {r.run_id} has no committed checkpoint yet: no energy to state\n")
        return
    out.write(
        statement(EnergyReport(**r.energy), run_id=r.run_id, cost_usd=r.spend_usd, cost_estimated=r.spend_estimated)
        + "\n"
    )


def print_launched(result: UpResult, out: TextIO) -> None:
    """Where the launched run is: its id and job, the task YAML, the checkpoint URL, and the commands
    that follow it. Writes nothing for a dry run (no record).
    """
    record = result.record
    if record is None:
        return
    where = "on this machine" if record.mode == "local" else "as a SkyPilot managed job"
    out.write(f"launched run {record.run_id} {where} (job {record.job_id})\n")
    out.write(f"  task YAML:   {result.yaml_path}\n")
    out.write(f"  checkpoints: {record.checkpoint_url}\n")
    out.write(f"  follow: skygreen logs {record.run_id} --follow    status: skygreen status {record.run_id}\n")
