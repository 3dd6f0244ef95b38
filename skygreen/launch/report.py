"""Plain-text views of runs for the terminal: the `skygreen status` table and detail view."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

from skygreen.deadline.live import MODE_WORDS, DeadlineTerms
from skygreen.deadline.watch_state import LOG_FILE
from skygreen.figures import amount
from skygreen.launch.registry import RunRecord
from skygreen.launch.runs import UpResult
from skygreen.launch.status import RunStatus
from skygreen.places.journey import plan_offers
from skygreen.terminal import write_table
from skygreen.timestamps import utc_now_iso


def _money(value_usd: float | None, estimated: bool = False) -> str:
    from skygreen.figures import usd

    if value_usd is None:
        return "-"
    return f"{'~' if estimated else ''}${usd(value_usd)}"


def _energy(kwh: float | None) -> str:
    return "-" if kwh is None else f"{kwh:.3f} kWh"


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


STATUS_DROP_ORDER: tuple[str, ...] = ("MODEL", "RECOVER", "ENERGY", "PREEMPT", "MODE", "STEP")
"""Columns of the table of runs left out, in this order, until it fits the terminal; RUN, STATE,
SPEND and DEADLINE always stay (`skygreen status RUN` shows everything)."""


def print_status_table(rows: Sequence[RunStatus], out: TextIO, *, width: int | None = None) -> None:
    """One line per run, newest last; at most `width` columns wide where it can (None: no limit),
    leaving out whole columns, least telling first, and saying which."""
    if not rows:
        out.write("no runs yet: start one with `skygreen up TASK` (or `--local`)\n")
        return
    deadlines = any(r.deadline for r in rows)  # the column only when some run has a deadline
    header: tuple[str, ...] = ("RUN", "MODE", "STATE", "STEP", "MODEL", "PREEMPT", "RECOVER", "SPEND", "ENERGY")
    header += ("DEADLINE",) if deadlines else ()
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
            *((_deadline_cell(r.deadline),) if deadlines else ()),
        )
        for r in rows
    ]
    widths = {name: max(len(row[i]) for row in table) for i, name in enumerate(header)}
    shown = _fitting(widths, width)
    keep = [i for i, name in enumerate(header) if name in shown]
    write_table([tuple(row[i] for i in keep) for row in table], out)
    if any(r.completed for r in rows):
        out.write("* training completed (final checkpoint committed)\n")
    left_out = [name for name in STATUS_DROP_ORDER if name in header and name not in shown]
    if left_out:
        out.write(f"(left out to fit {width} columns: {', '.join(left_out)})\n")


def _fitting(widths: dict[str, int], limit: int | None) -> set[str]:
    """The columns to show: all of them, less those in `STATUS_DROP_ORDER` (in that order) while
    the line is wider than `limit`."""
    shown = set(widths)

    def line_width() -> int:
        return sum(widths[name] for name in shown) + 2 * (len(shown) - 1)

    for name in STATUS_DROP_ORDER:
        if limit is None or line_width() <= limit:
            break
        shown.discard(name)
    return shown


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
        *_save_lines(r.checkpoint_save),
        ("model_sha256", _dash(r.model_sha256)),
        ("preemptions", _dash(r.preemptions)),
        ("recoveries", str(r.recoveries)),
        (
            "spend so far",
            _money(r.spend_usd, r.spend_estimated)
            + (" (estimated from the plan's best offer)" if r.spend_estimated else ""),
        ),
        *_energy_lines(r),
        *_memory_lines(r.memory),
        *_deadline_lines(r.run_id, r.deadline),
        *_changeover_lines(r),
    ]
    if r.progress_error:
        lines.append(("progress", f"unreadable: {r.progress_error}"))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        out.write(f"{key.ljust(width)}  {value}\n")


def _save_lines(save: dict[str, Any] | None) -> list[tuple[str, str]]:
    """What a save costs (`status.checkpoint_save`): its measured size at the list rates."""
    if save is None:
        return []
    text = (
        f"${save['usd']:.4g} a save: {save['gb']:.3g} GB measured, {save['route']} "
        f"(${save['transfer_usd']:.4g} transfer, ${save['requests_usd']:.4g} requests, list rates)"
    )
    return [("save cost", text)]


def _memory_lines(memory: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The plan's memory per GPU and the measured peak, side by side (`status.memory_view`)."""
    if memory is None:
        return []
    plan = memory["planned_gb"]
    planned = "planned -" if plan is None else (
        f"planned {plan['low']:.3g}-{plan['high']:.3g} GB (tensors {plan['tensors']:.3g} GB"
        f" on {plan['gpus']} GPU{'s' if plan['gpus'] > 1 else ''})"
    )  # fmt: skip
    peak = memory["peak_gb"]
    measured = (
        "not measured yet" if peak is None else f"{peak:.3g} GB ({memory['measure']}, segment {memory['segment']})"
    )
    return [("memory/GPU", f"{planned}; measured peak {measured}")]


def _changeover_lines(r: RunStatus) -> list[tuple[str, str]]:
    """The latest changeover (first setup line or process start -> first new step), when the run resumed."""
    if not r.changeovers:
        return []
    from skygreen.ledger.changeover import Changeover, describe

    latest = Changeover(**r.changeovers[-1])
    return [("changeover", describe(latest) + (f" ({len(r.changeovers)} in all)" if len(r.changeovers) > 1 else ""))]


def _deadline_cell(d: dict[str, Any] | None) -> str:
    """`10.5h left, on-demand` (the watcher's latest decision); how it ended (`deadline met`) once
    the watcher stopped; `-` without a deadline."""
    if d is None:
        return "-"
    watcher = d["watcher"]
    if watcher["ended"]:  # how it ended, not the time left to a deadline that no longer matters
        return watcher["outcome"] or "watcher ended"
    left_h = d["left_h"]
    when = f"{left_h:.1f}h left" if left_h >= 0 else f"{-left_h:.1f}h past"
    mode = MODE_WORDS.get(d["decision"], "deciding") if d["decision"] else "deciding"
    at = f" at {d['place']['name']}" if d.get("place") and d["decision"] != "idle" else ""
    return f"{when}, {mode}{at}" + ("" if watcher["running"] else " (no watcher)")


def _deadline_lines(run_id: str, d: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Progress against the deadline, the policy's decision and the watcher, for the detail view."""
    if d is None:
        return []
    left_h = d["left_h"]
    left = f"{left_h:.2f} h left" if left_h >= 0 else f"passed {-left_h:.2f} h ago"
    watcher = d["watcher"]
    if watcher["ended"] and watcher["outcome"] and watcher["ended_at_h"] is not None:
        left = f"ended at {watcher['ended_at_h']:.2f} h: {watcher['outcome']}"
    lines = [("deadline", f"{d['deadline_h']:g} h, by {_utc_iso(d['deadline_at'])} ({left})")]
    if d["progress_h"] is not None and d["compute_h"]:
        share = d["progress_h"] / d["compute_h"]
        progress = (
            f"{d['progress_h']:.2f} of {d['compute_h']:.3g} compute h ({share:.0%}); "
            f"an even pace to the deadline: {d['uniform_progress_h']:.2f} h; slack {d['slack_h']:.2f} h"
        )
        mode = MODE_WORDS.get(d["decision"], d["decision"])
        decision = f"{mode} ({d['reason']}); at {d['decided_at_h']:.2f} h; switches so far: {d['switches']}"
        if watcher["ended"]:  # what the watcher last saw, not now
            lines += [("last progress", progress), ("last decision", decision)]
        else:
            lines += [("progress", progress), ("decision", decision)]
    elif watcher["ended"]:
        lines.append(("decision", "none: the run ended before the watcher decided"))
    else:
        lines.append(("decision", "none yet: the watcher waits for the run's first steps in its ledger"))
    lines += _place_lines(d)
    if watcher["running"]:
        ago = watcher["last_poll_ago_s"]
        lines.append(
            ("watcher", f"running, pid {watcher['pid']}" + (f", last poll {ago:.0f} s ago" if ago is not None else ""))
        )
    elif watcher["ended"]:
        lines.append(("watcher", f"ended: {watcher['ended']}"))
    else:
        restart = f"`skygreen watch {run_id}` restarts it"
        lines.append(("watcher", f"not running: the run stays where it is and the deadline is not guarded; {restart}"))
    return lines


def _place_lines(d: dict[str, Any]) -> list[tuple[str, str]]:
    """Where a run with several places is, and each move it made with the policy's reason and,
    once measured, its bytes, changeover and dollars (`skygreen.places.journey`)."""
    place = d.get("place")
    if not place:
        return []
    where = f"{place['cloud']} {place['region']}" + (f" ({place['zone']})" if place.get("zone") else "")
    mode = MODE_WORDS.get(d.get("place_mode") or "", "")
    moving = d.get("moving_to")
    lines = [("place", where + (f", {mode}" if mode else "") + (f"; moving to {moving['name']}" if moving else ""))]
    for m in d.get("moves") or ():
        measured = (
            f"; {m['restore_bytes'] / 1e6:.3g} MB, changeover {m['changeover_s']:.0f} s, ${m['usd']:.4f}"
            if m.get("changeover_s") is not None
            else "; not measured yet"
        )
        to = f"{m['dst']['name']} ({MODE_WORDS.get(m['mode'], m['mode'])})"
        lines.append(
            (f"move {m['number']}", f"{m['src']['name']} -> {to} at {m['decided_at_h']:.2f} h: {m['reason']}{measured}")
        )
    return lines


def _utc_iso(iso: str) -> str:
    """`2026-12-02T02:00:00+00:00` as `2026-12-02 02:00 UTC`, as `up` prints it."""
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")


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
        statement(
            EnergyReport(**r.energy), run_id=r.run_id, compute_usd=r.compute_usd, cost_estimated=r.spend_estimated
        )
        + "\n"
    )


def timestamped(out: TextIO) -> Callable[[str], None]:
    """A printer of the watcher's events: each line prefixed with the wall clock's UTC time, flushed
    at once (the background watcher's log is read while it runs)."""

    def say(line: str) -> None:
        out.write(f"{utc_now_iso()} {line}\n")
        out.flush()

    return say


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
    if record.deadline is not None:
        _print_deadline_launch(record, result, out)


def _print_deadline_launch(record: RunRecord, result: UpResult, out: TextIO) -> None:
    terms = DeadlineTerms.from_json(record.deadline or {})
    by = datetime.fromtimestamp(terms.deadline_at_s, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    compute = f"{terms.compute_h:.3g} h of compute" if terms.compute_h else "compute measured as it runs"
    offers = plan_offers(record.spec_snapshot, record.plan_summary) if record.mode == "cloud" else []
    out.write(
        f"  deadline:    {terms.deadline_h:g} h, by {by} ({compute}; changeover {terms.changeover_h:.2f} h); "
        f"starts on spot, policy {'nomad' if offers else terms.policy}\n"
    )
    if offers:
        regions = ", ".join(dict.fromkeys(f"{o['cloud']} {o['region']}" for o in offers))
        out.write(f"  places:      the nomad moves it between {regions}; `skygreen status` shows where it is\n")
    if result.watcher_pid is not None:  # its log sits in the run's folder, beside the task YAML
        out.write(
            f"  watcher:     pid {result.watcher_pid}, log {result.yaml_path.parent / LOG_FILE}; "
            f"if it stops, `skygreen watch {record.run_id}` restarts it\n"
        )
    else:
        out.write(f"  watcher:     not started; run `skygreen watch {record.run_id}` on this machine\n")
