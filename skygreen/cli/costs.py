"""The `skygreen` commands about money, energy and time: cost, compare, report, simulate, power.

Like every command, they parse, call `skygreen.api`, and print; `skygreen.cli` adds them to the
`skygreen` group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from skygreen.cli.options import catalog_option, json_option, plot_option, print_json, print_notice, run_argument


@click.command()
@click.argument("target", metavar="RUN|TASK", required=False)
@click.option(
    "--all",
    "all_runs",
    is_flag=True,
    help="A team's spend: every run this machine knows and every run in the --bucket URLs, each once.",
)
@click.option("--since", default=None, help="With --all: only runs active in this window (30d, 12h, 2w).")
@click.option("--by", "by", default=None, help="With --all: group by task, cloud, gpu or user.")
@click.option(
    "--bucket",
    "buckets",
    multiple=True,
    metavar="URL",
    help="With --all: also count the runs in this shared bucket (s3://..., gs://...; repeatable).",
)
@catalog_option
@json_option
@plot_option
def cost(
    target: str | None,
    all_runs: bool,
    since: str | None,
    by: str | None,
    buckets: tuple[str, ...],
    catalog: Path | None,
    json_output: bool,
    plot: Path | None,
) -> None:
    """Show what a run cost (from its ledger), what a task would cost on each cloud, or (--all) a team's spend.

    RUN: a run id: actual cost per segment, controller and storage, energy, CO2e, per step and
    per epoch, preemptions (a --local run also gets the clouds' estimate). TASK: a task file:
    estimated cost per run on each cloud's best offer, spot and on-demand, the plan's pick first.
    --all: dollars, energy and CO2e of every run here and in the shared buckets, runs still
    going included up to their last ledger update. A bucket that cannot be read is named on
    stderr with the reason and the fix, the rest is still shown, and the command exits 1.
    """
    from skygreen import api

    if all_runs or target is None:
        _team_spend(target, all_runs, since=since, by=by, buckets=buckets, catalog=catalog,
                    json_output=json_output, plot=plot)  # fmt: skip
        return
    if since is not None or by is not None or buckets:
        raise click.UsageError("--since, --by and --bucket go with --all (a team's spend), not with one RUN or TASK")
    from skygreen.costs.report import print_run_cost, print_task_estimate

    if api.is_task_file(target):  # the clouds' estimate
        estimate = api.estimate(target, catalog_dir=catalog)
        for line in estimate.notices:
            print_notice(line)
        if plot is not None:
            raise click.UsageError("--plot draws a run's cost; for a task file, run it first (or use --json)")
        if json_output:
            print_json(estimate.to_json())
            return
        print_task_estimate(estimate, sys.stdout)
        return
    from skygreen.errors import NoLedgerYetError

    try:
        result = api.run_cost(target, catalog_dir=catalog)
    except NoLedgerYetError:  # launched, not training yet: what is known, from its launcher
        known = api.cost_before_ledger(target)
        if json_output:
            print_json(known)
        else:
            _print_before_ledger(known)
        return
    if plot is not None:
        api.plot_runs(plot, [target], catalog_dir=catalog)
    if json_output:
        print_json(result.to_json())
        return
    print_run_cost(result, sys.stdout)
    if plot is not None:
        sys.stdout.write(f"wrote {plot}\n")


def _team_spend(
    target: str | None,
    all_runs: bool,
    *,
    since: str | None,
    by: str | None,
    buckets: tuple[str, ...],
    catalog: Path | None,
    json_output: bool,
    plot: Path | None,
) -> None:
    """`skygreen cost --all`: checks the arguments, then prints the team's spend."""
    from skygreen import api

    if not all_runs:
        raise click.UsageError("give a RUN id or a TASK file, or --all for every run (a team's spend)")
    if target is not None:
        raise click.UsageError(f"--all covers every run; leave out {target!r} (or drop --all to see that one)")
    if plot is not None:
        raise click.UsageError("--plot draws one run's cost; use it with `skygreen cost RUN`")
    spend = api.team_spend(buckets=buckets, by=by, since=since, catalog_dir=catalog)
    if json_output:
        print_json(spend.to_json())
    else:
        from skygreen.costs.report import print_team_spend

        print_team_spend(spend, sys.stdout)
    if not spend.complete:  # what was read is shown; the total is not the team's whole spend
        from skygreen import exit_codes

        for u in spend.unreadable:
            left_out = f" ({len(u.runs)} run(s) of this machine left out)" if u.runs else ""
            sys.stderr.write(f"error: cannot read bucket {u.bucket}{left_out}: {u.reason}\n  fix: {u.fix}\n")
        raise click.exceptions.Exit(exit_codes.FAILED)


@click.command()
@click.argument("runs", nargs=-1, required=True, metavar="RUN RUN...")
@catalog_option
@json_option
@plot_option
def compare(runs: tuple[str, ...], catalog: Path | None, json_output: bool, plot: Path | None) -> None:
    """Compare runs side by side: cloud mix, hours, cost, energy, CO2e, final metric, cost per unit of improvement."""
    from skygreen import api

    comparison = api.compare(list(runs), catalog_dir=catalog)
    rows = comparison.rows
    for run_id in comparison.waiting:  # launched, not training yet: the others still compare
        print_notice(f"run {run_id} has no ledger yet (launched, not training yet): left out of the comparison")
    if plot is not None and rows:
        api.plot_runs(plot, [r.record.run_id for r in rows], catalog_dir=catalog)
    if json_output:
        print_json([r.to_json() for r in rows])
        return
    from skygreen.costs.report import print_compare

    if rows:
        print_compare(rows, sys.stdout)
    if plot is not None and rows:
        sys.stdout.write(f"wrote {plot}\n")


@click.command()
@run_argument
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the page (default: RUN-report.html here).",
)
@catalog_option
def report(run: str, output: Path | None, catalog: Path | None) -> None:
    """Write one self-contained HTML page about a run: figures, segments, energy, task and plan."""
    from skygreen import api

    path = api.write_report(run, output, catalog_dir=catalog)
    sys.stdout.write(f"wrote {path}\n")


@click.command()
@click.argument("trace", type=click.Path(path_type=Path), metavar="TRACE")
@click.option(
    "--hours", "hours", required=True, help="Compute the job needs on its full set of nodes: 48h, 90m, or hours."
)
@click.option("--deadline", required=True, help="Time from the start to the deadline: 72h, or hours.")
@click.option(
    "--changeover",
    required=True,
    help="Delay of each switch (provisioning, setup, work lost since the last checkpoint): 0.3h, 18m.",
)
@click.option("--policy", required=True, help="greedy, uniform_progress, skygreen, optimum, on_demand, or all.")
@click.option("--nodes", type=int, default=None, help="Gang size (default: the trace's metadata.nodes, else 1).")
@click.option("--zone", default=None, help="The zone column of a multi-zone capacity CSV.")
@click.option(
    "--spot-price", type=float, default=None, help="Spot USD per node-hour (default: the trace's, else the catalog's)."
)
@click.option(
    "--on-demand-price", type=float, default=None, help="On-demand USD per node-hour (default: the catalog's)."
)
@click.option("--start", "start", default="0", help="Where in the trace the job starts: 100h, or hours (default 0).")
@click.option("--checkpoint-gb", type=float, default=50.0, help="Multi-region trace: checkpoint size moved (GB).")
@click.option("--windows", type=int, default=1, help="Multi-region trace: back-to-back windows to run (default 1).")
@catalog_option
@json_option
@plot_option
def simulate(
    trace: Path,
    hours: str,
    deadline: str,
    changeover: str,
    policy: str,
    nodes: int | None,
    zone: str | None,
    spot_price: float | None,
    on_demand_price: float | None,
    start: str,
    checkpoint_gb: float,
    windows: int,
    catalog: Path | None,
    json_output: bool,
    plot: Path | None,
) -> None:
    """Replay a spot availability trace against deadline policies: cost, finish time, spot and on-demand hours.

    TRACE may also be a multi-region trace (the H100 archive or the V100 `processed` folder):
    then every arm (on-demand, Uniform Progress and skygreen per zone, eager failover, nomad,
    optimum) runs over --windows back-to-back windows, with moves priced.
    """
    from skygreen import api
    from skygreen.deadline.report import print_report

    if _simulate_places(trace, hours, deadline, changeover, zone, start, checkpoint_gb, windows, json_output, plot):
        return

    request = api.SimulationRequest(
        trace=trace,
        hours=hours,
        deadline=deadline,
        changeover=changeover,
        policy=policy,
        nodes=nodes,
        zone=zone,
        spot_price=spot_price,
        on_demand_price=on_demand_price,
        start=start,
        catalog_dir=catalog,
    )
    result = api.simulate(request)
    if json_output:
        print_json([o.to_json() for o in result.outcomes])
    else:
        print_report(result, sys.stdout)


def _simulate_places(trace: Path, hours: str, deadline: str, changeover: str, zone: str | None, start: str,
                     checkpoint_gb: float, windows: int, json_output: bool, plot: Path | None) -> bool:  # fmt: skip
    from skygreen import api
    from skygreen.places.simulate import print_places_report

    report = api.simulate_places(trace, hours=hours, deadline=deadline, changeover=changeover, zone=zone, start=start,
                                 checkpoint_gb=checkpoint_gb, windows=windows, plot=plot)  # fmt: skip
    if report is None:
        return False
    if json_output:
        print_json({k: v for k, v in report.items() if not k.startswith("_")})
    else:
        print_places_report(report, sys.stdout)
    return True


@click.command()
@json_option
def power(json_output: bool) -> None:
    """Show the GPUs here: current, default, min and max power limits, and skygreen's caps on them."""
    from skygreen import api
    from skygreen.power.report import print_gpus

    report = api.power_gpus()
    if json_output:
        print_json(report)
    else:
        print_gpus(report, sys.stdout)


def _print_before_ledger(known: dict) -> None:
    def minutes(seconds: float | None) -> str:
        return "unknown" if seconds is None else f"{seconds / 60:.1f} min"

    spend = known["spend_usd"]
    priced = "unknown (no offer to price it at)" if spend is None else f"${spend:.4f}"
    sys.stdout.write(
        f"run {known['run_id']}: {known['state']}, launch {known['launches']} started {minutes(known['since_launch_s'])} ago\n"
        f"  {known['note']}\n"
        f"  paid so far: {minutes(known['paid_s'])} (the launcher's run time)\n"
        f"  spend so far: {priced}{' (estimated)' if spend is not None and known['spend_estimated'] else ''}\n"
    )
