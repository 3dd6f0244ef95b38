"""The `skygreen` command: thin commands that parse, call `skygreen.api`, and print.

Start-up stays fast: nothing here imports sky or torch at module level (each costs about
2.3 s); commands import what they need when they run. A test checks it in a fresh interpreter.

Errors: a `SkygreenError` prints its message (no traceback) and exits with its code, 2 for bad
input and 1 for failures; `SKYGREEN_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from skygreen import exit_codes
from skygreen.cli.costs import compare, cost, power, report, simulate
from skygreen.cli.options import (
    CONTEXT,
    catalog_option,
    json_option,
    print_json,
    print_notice,
    run_argument,
    task_argument,
)
from skygreen.errors import SkygreenError


class SentenceGroup(click.Group):
    """A command group whose `--help` lists each command's whole first sentence, wrapped.

    click cuts the short help to what fits on one line ("Stop a run; it commits a
    checkpoint first, so `skygreen..."), which leaves half a sentence that says nothing;
    each command's docstring starts with a sentence that stands alone, so show all of it.
    """

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The Commands section: each visible command with its short help uncut."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=SentenceGroup,
    context_settings=CONTEXT,
    help="Cheap, green cloud GPU training: cheapest spot GPUs, mixed precision, power caps, "
    "and runs that survive preemption. Built on SkyPilot.",
)
@click.version_option(package_name="skygreen", message="%(prog)s %(version)s")
def app() -> None:
    """The root command group; it does nothing before a command runs (its `--help` text is the `help=` above)."""


@app.group("catalog", cls=SentenceGroup, context_settings=CONTEXT)
def catalog_app() -> None:
    """Update the GPU price catalog that `plan` reads (SkyPilot's own, schema v8)."""


@app.command()
@task_argument
@catalog_option
@json_option
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Rows in the ranked table.")
@click.option("--deadline", default=None, help="Finish within this time (36h, 90m): overrides skygreen.deadline.")
def plan(task: Path, catalog: Path | None, json_output: bool, top: int, deadline: str | None) -> None:
    """Rank spot GPU offers across AWS, GCP and Azure by estimated cost per run."""
    from skygreen import api

    result = api.plan_task(task, catalog_dir=catalog, deadline=deadline)
    for line in result.notices:
        print_notice(line)
    if json_output:
        print_json(result.to_json())
        return
    from skygreen.plan.report import print_plan

    print_plan(result, top=top)


@app.command()
def schema() -> None:
    """Print the JSON Schema of a task file (SkyPilot's, with the skygreen: section), for editors."""
    from skygreen import api

    print_json(api.task_schema())


@catalog_app.command("update")
@catalog_option
@click.option("--cloud", "clouds", multiple=True, help="Only this cloud (repeatable): aws, gcp, azure.")
def catalog_update(catalog: Path | None, clouds: tuple[str, ...]) -> None:
    """Download SkyPilot's current price catalog (through SkyPilot; needs the internet)."""
    from skygreen import api

    for result in api.update_catalog(clouds, catalog_dir=catalog):
        sys.stdout.write(f"{result.cloud}: {result.status} {result.path}\n")


@app.command()
@task_argument
@click.option("--local", is_flag=True, help="Run on this machine (CPU, or a local GPU) instead of the cloud.")
@click.option(
    "--dryrun",
    is_flag=True,
    help="Every check up makes (smoke test, bucket), the plan and the SkyPilot YAML; launch nothing.",
)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), default=None, help="Also write the rendered SkyPilot YAML here."
)
@click.option("--no-smoke", is_flag=True, help="Skip the CPU smoke test of the training script.")
@click.option("--detach", "-d", is_flag=True, help="With --local: return at once instead of following the run.")
@click.option(
    "--deadline",
    default=None,
    help="Finish within this time (36h, 90m): start on spot, and a background watcher moves the run "
    "to on-demand and back as the deadline needs. Overrides skygreen.deadline.",
)
@click.option(
    "--compute",
    default=None,
    help="With a deadline: the compute time the run needs (20h); default: the plan's estimate, "
    "or for --local the throughput measured as it runs.",
)
@click.option(
    "--policy",
    type=click.Choice(["skygreen", "uniform_progress", "greedy"]),
    default=None,
    help="With a deadline: the switching policy (see `skygreen simulate`); default: skygreen.",
)
@click.option(
    "--no-watch",
    is_flag=True,
    help="With a deadline: start no watcher here; run `skygreen watch RUN` yourself (in tmux, a service).",
)
@catalog_option
def up(
    task: Path,
    local: bool,
    dryrun: bool,
    output: Path | None,
    no_smoke: bool,
    detach: bool,
    deadline: str | None,
    compute: str | None,
    policy: str | None,
    no_watch: bool,
    catalog: Path | None,
) -> None:
    """Smoke-test, render and launch a run: a managed spot job, or with --local this machine."""
    from skygreen import api

    request = api.UpRequest(
        task_path=task, local=local, dryrun=dryrun, output=output, smoke=not no_smoke, deadline=deadline,
        compute=compute, policy=policy, watch=not no_watch, catalog_dir=catalog,
    )  # fmt: skip
    result = api.up(request)
    for line in result.notices:
        print_notice(line)
    if result.plan is not None and dryrun:
        from skygreen.plan.report import print_plan

        print_plan(result.plan, top=10)
    if dryrun:
        _print_dryrun_checks(result, smoke=not no_smoke)
        sys.stdout.write(f"wrote {result.yaml_path} (dry run: nothing launched)\n")
        return
    from skygreen.launch.report import print_launched

    if result.smoke is not None:
        sys.stdout.write(f"{result.smoke.passed_line}\n")
    print_launched(result, sys.stdout)
    if local and not detach and result.record is not None and result.record.deadline is not None:
        # the watcher cancels and relaunches the job: following one job would end at the first switch
        print_notice(
            f"a run held to a deadline moves between jobs, so it is not followed here: "
            f"`skygreen status {result.run_id}` shows where it is"
        )
    elif local and not detach:
        _follow_local(result.run_id)


def _print_dryrun_checks(result, *, smoke: bool) -> None:
    """What the dry run checked, and in one line each what it did not."""
    if result.smoke is not None:
        sys.stdout.write(f"{result.smoke.line} ({result.smoke.duration_s:.1f} s)\n")
    if result.bucket_unchecked:
        print_notice(
            f"dry run did not check the checkpoint bucket {result.bucket}: {result.bucket_unchecked} (the VMs use their own)"
        )
    else:
        sys.stdout.write(f"checkpoint bucket {result.bucket}: writable\n")
    if not smoke:
        print_notice("dry run did not run the smoke test (--no-smoke)")


def _follow_local(run_id: str) -> None:
    """Stream a local run's output until it ends, then exit with its outcome
    (`skygreen.exit_codes`); Ctrl-C stops following, not the run."""
    from skygreen import api
    from skygreen.launch.report import print_status_detail

    try:
        api.logs(run_id, follow=True)
    except KeyboardInterrupt:
        _stopped_following(run_id)
    (final,) = api.status(run_id)
    print_status_detail(final, sys.stdout)
    _exit_with_outcome(final)


def _stopped_following(run_id: str) -> None:
    sys.stderr.write(
        f"\nstopped following; run {run_id} continues in the background "
        f"(`skygreen logs {run_id} --follow`, `skygreen cancel {run_id}`)\n"
    )
    raise click.exceptions.Exit(exit_codes.INTERRUPTED)


def _exit_with_outcome(final) -> None:
    """Exit as `skygreen.exit_codes` says for a run that ended as `final` (a RunStatus)."""
    code = exit_codes.for_outcome(final.state, has_checkpoint=final.step is not None)
    if code == exit_codes.STOPPED_WITH_CHECKPOINT:
        sys.stderr.write(
            f"run {final.run_id} {final.state.lower()} with a checkpoint at step {final.step}; "
            f"`skygreen resume {final.run_id}` continues it\n"
        )
    elif code != exit_codes.SUCCEEDED:
        sys.stderr.write(
            f"run {final.run_id} ended {final.state}"
            + (f" - {final.detail.splitlines()[0]}" if final.detail else "")
            + (" with no checkpoint to resume from" if final.state in ("STOPPED", "CANCELLED") else "")
            + "\n"
        )
    if code != exit_codes.SUCCEEDED:
        raise click.exceptions.Exit(code)


@app.command()
@click.argument("run", required=False, metavar="[RUN]")
@json_option
@click.option("--statement", is_flag=True, help="Print the run's energy statement (a paragraph for a paper).")
def status(run: str | None, json_output: bool, statement: bool) -> None:
    """Show runs with their state, step, model digest, preemptions, spend, energy and CO2e so far.

    RUN: a run id; default: every run on this machine.
    """
    from skygreen import api
    from skygreen.errors import InputError
    from skygreen.launch.report import print_statement, print_status_detail, print_status_table
    from skygreen.terminal import output_width

    if statement and run is None:
        raise InputError(
            "--statement needs a RUN\n  fix: skygreen status RUN --statement (skygreen status lists the runs)"
        )
    rows = api.status(run)
    unknown = api.unknown_jobs() if run is None and not statement else []
    if statement:
        print_statement(rows[0], sys.stdout)
    elif json_output:
        print_json(
            [*(r.to_json() for r in rows), *(j.to_json() for j in unknown)] if run is None else rows[0].to_json()
        )
    elif run is None:
        if rows or not unknown:
            print_status_table(rows, sys.stdout, width=output_width(sys.stdout))
        sys.stdout.writelines(job.line() + "\n" for job in unknown)  # paid jobs nobody watches
    else:
        print_status_detail(rows[0], sys.stdout)
    unreachable = {r.progress_error for r in rows if r.unreachable_bucket and r.progress_error}
    for line in sorted(unreachable):  # progress unknown is a failure, not a state
        sys.stderr.write(f"error: {line}\n")
    if unreachable:
        raise click.exceptions.Exit(exit_codes.FAILED)


@app.command()
@run_argument
@click.option("--local", is_flag=True, help="Continue the run on this machine.")
@click.option("--detach", "-d", is_flag=True, help="For local runs: return at once instead of following.")
@click.option(
    "--budget-usd",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="A new budget (a run stopped at its budget needs a higher one).",
)
@json_option
def resume(run: str, local: bool, detach: bool, budget_usd: float | None, json_output: bool) -> None:
    """Relaunch a stopped run with the same id; it continues from its latest checkpoint, or says
    it restarts from step 0 (--json: run id, job, launch and from_step, without following)."""
    from skygreen import api

    start = api.resume_point(run)
    record = api.resume(run, local=local, budget_usd=budget_usd)
    if json_output:
        print_json({"run_id": record.run_id, "job_id": record.job_id, "launch": len(record.launches),
                    "from_step": start.step, "from_scratch": start.from_scratch, "note": start.note})  # fmt: skip
        return
    sys.stdout.write(f"resumed run {record.run_id} (job {record.job_id}, launch {len(record.launches)})\n")
    if start.note:
        sys.stdout.write(f"  {start.note}\n")
    if record.deadline is not None:  # the watcher may switch jobs: following one would end at a switch
        sys.stdout.write(
            f"  held to its deadline by its watcher: `skygreen status {record.run_id}` shows where it is\n"
        )
    elif record.mode == "local" and not detach:
        _follow_local(record.run_id)


@app.command()
@run_argument
@click.option("--poll", default="60s", show_default=True, help="How often to look at the run (30s, 5m).")
@click.option("--once", is_flag=True, help="Look once, act if the policy says so, and return.")
def watch(run: str, poll: str, once: bool) -> None:
    """Hold a run launched with --deadline to its deadline, moving it between spot and on-demand."""
    from skygreen import api
    from skygreen.launch.report import timestamped

    say = timestamped(sys.stdout)
    result = api.watch(run, poll=poll, once=once, say=say)
    say(result.reason)
    if result.exit_code:
        raise click.exceptions.Exit(result.exit_code)


@app.command()
@run_argument
def cancel(run: str) -> None:
    """Stop a run; it commits a checkpoint first, so `skygreen resume` can continue it."""
    from skygreen import api
    from skygreen.errors import InputError

    try:
        result = api.cancel(run)
    except InputError:
        stopped = api.cancel_unknown_jobs(run)  # a job launched for a run no record here knows
        if not stopped:
            raise
        sys.stdout.writelines(
            f"cancelled unknown skygreen job {j.name} ({j.launcher} job {j.job_id})\n" for j in stopped
        )
        return
    final = result.status
    step = final.step if final.step is not None else "-"
    if result.already_ended:
        sys.stdout.write(
            f"run {final.run_id} already ended ({final.state}, last checkpoint at step {step}); nothing to cancel\n"
        )
        return
    sys.stdout.write(f"cancelled run {final.run_id}: {final.state}, last checkpoint at step {step}\n")


@app.command()
@run_argument
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run ends.")
def logs(run: str, follow: bool) -> None:
    """Print a run's output (the training script's stdout and stderr).

    With --follow, exits with the run's outcome once it ends (0 succeeded, 1 failed, 75
    stopped with a checkpoint; see the exit codes in docs/reference/cli.md).
    """
    from skygreen import api

    try:
        api.logs(run, follow=follow)
    except KeyboardInterrupt:
        if not follow:
            raise
        _stopped_following(run)
    if follow:
        (final,) = api.status(run)
        _exit_with_outcome(final)


@app.command()
@click.argument("target", metavar="RUN|URL")
@click.option("--older-than", default="90d", show_default=True, help="Age of checkpoints to move, e.g. 90d, 12h, 2w.")
@click.option(
    "--storage-class",
    default=None,
    help="S3: GLACIER (default), DEEP_ARCHIVE, GLACIER_IR; GCS: ARCHIVE (default), COLDLINE, NEARLINE; Azure: ARCHIVE (default), COLD, COOL.",
)
@click.option("--yes", is_flag=True, help="Act; without it gc only prints what it would move.")
def gc(target: str, older_than: str, storage_class: str | None, yes: bool) -> None:
    """Move stale checkpoints to a cold storage class (never the latest, best or pinned ones).

    RUN|URL: a run id, a run's checkpoint URL, or a bucket URL holding runs.
    """
    from skygreen import api

    result = api.gc(target, older_than=older_than, storage_class=storage_class, act=yes)
    for line in result.lines():
        sys.stdout.write(line + "\n")


@app.command()
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder for everything the demo writes (default: the data dir's demo/).",
)
@click.option("--gpu", default=None, help="The simulated GPU (default T4).")
@click.option("--steps", type=click.IntRange(min=200), default=None, help="Training steps (default 300).")
@catalog_option
def demo(folder: Path | None, gpu: str | None, steps: int | None, catalog: Path | None) -> None:
    """Run tasks/tiny.yaml through every stage on this machine, no cloud account needed."""
    from skygreen import api
    from skygreen.demo_view import print_summary, view_for

    view = view_for(sys.stdout)
    try:
        result = api.demo(view, folder=folder, gpu=gpu, steps=steps, catalog_dir=catalog)
    finally:
        view.close()
    print_summary(result, sys.stdout)


@app.command()
@task_argument
def smoke(task: Path) -> None:
    """Run the task's training script for two steps on CPU, with a checkpoint round trip."""
    from skygreen import api

    result = api.smoke(task)
    sys.stdout.write(f"{result.line} ({result.duration_s:.1f} s)\n")


for command in (cost, compare, report, simulate, power):
    app.add_command(command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: exits with a code from `skygreen.exit_codes` (returns on 0)."""
    code = run_command(argv)
    if code != exit_codes.SUCCEEDED:
        sys.exit(code)


def run_command(argv: list[str] | None = None) -> int:
    """Run one `skygreen` command; return its exit code. Errors print one message, no
    traceback (unless SKYGREEN_DEBUG=1); output that is not a terminal gets no ANSI codes."""
    from skygreen.terminal import plain_unless_terminal

    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = plain_unless_terminal(sys.stdout), plain_unless_terminal(sys.stderr)
    try:
        return _run_command(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _run_command(argv: list[str] | None) -> int:
    debug = os.environ.get("SKYGREEN_DEBUG") == "1"
    if debug:  # each retry of a bucket call prints a line; without debug the final error says it all
        from skygreen import api

        api.show_store_retries()
    try:
        code = app.main(args=argv, prog_name="skygreen", standalone_mode=False)
    except SkygreenError as e:
        if debug:
            raise
        sys.stderr.write(f"error: {e}\n")
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort as e:
        if isinstance(e.__context__, KeyboardInterrupt):
            sys.stderr.write("interrupted\n")
            return exit_codes.INTERRUPTED
        sys.stderr.write("aborted\n")
        return exit_codes.FAILED
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return exit_codes.INTERRUPTED
    except Exception as e:  # a bug, or a library error no adapter maps yet: one line, not a traceback
        if debug:
            raise
        sys.stderr.write(
            f"error: unexpected {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}\n"
            "  fix: run again with SKYGREEN_DEBUG=1 to see the traceback, and report it\n"
        )
        return exit_codes.FAILED
    # click returns the code of an `Exit` raised inside a command when not standalone.
    return code if isinstance(code, int) else exit_codes.SUCCEEDED


if __name__ == "__main__":
    main()
