"""The `skygreen` command: thin commands that parse, call `skygreen.api`, and print.

Start-up stays fast: nothing here imports sky or torch at module level (each costs about
2.3 s); commands import what they need when they run. A test checks it in a fresh interpreter.

Errors: a `SkygreenError` prints its message (no traceback) and exits with its code, 2 for bad
input and 1 for failures; `SKYGREEN_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from skygreen.errors import SkygreenError

# click, not Typer: Typer builds its parameters through pydantic (about 0.3 s of imports),
# which would eat a third of `skygreen plan`'s one-second budget.
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(
    context_settings=CONTEXT,
    help="Cheap, green cloud GPU training: cheapest spot GPUs, mixed precision, power caps, "
    "and runs that survive preemption. Built on SkyPilot.",
)
@click.version_option(package_name="skygreen", message="%(prog)s %(version)s")
def app() -> None:
    pass


@app.group("catalog", context_settings=CONTEXT)
def catalog_app() -> None:
    """The GPU price catalog (SkyPilot's own, schema v8)."""


def task_argument(f):
    return click.argument("task", type=click.Path(path_type=Path), metavar="TASK")(f)


def catalog_option(f):
    return click.option(
        "--catalog",
        type=click.Path(path_type=Path),
        default=None,
        help="Catalog directory holding <cloud>/vms.csv (default: $SKYGREEN_CATALOG_DIR, "
        "else ~/.sky/catalogs/v8, else the embedded price table).",
    )(f)


def json_option(f):
    return click.option("--json", "json_output", is_flag=True, help="Print machine-readable JSON.")(f)


def run_argument(f):
    return click.argument("run", metavar="RUN")(f)


def print_json(data: object) -> None:
    """JSON on stdout, one document, for scripts."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_notice(line: str) -> None:
    """A one-line remark for the user on stderr, so `--json` output stays clean."""
    sys.stderr.write(f"note: {line}\n")


@app.command()
@task_argument
@catalog_option
@json_option
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="Rows in the ranked table.")
def plan(task: Path, catalog: Path | None, json_output: bool, top: int) -> None:
    """Rank spot GPU offers across AWS, GCP and Azure by estimated cost per run."""
    from skygreen import api
    from skygreen.spec import load_spec

    result = api.plan(load_spec(task), catalog_dir=catalog)
    for line in result.notices:
        print_notice(line)
    if json_output:
        print_json(result.to_json())
        return
    from skygreen.plan.report import print_plan

    print_plan(result, top=top)


@catalog_app.command("update")
@catalog_option
@click.option("--cloud", "clouds", multiple=True, help="Only this cloud (repeatable): aws, gcp, azure.")
def catalog_update(catalog: Path | None, clouds: tuple[str, ...]) -> None:
    """Download SkyPilot's current price catalog (through SkyPilot; needs the internet)."""
    from skygreen.fields import read_choice
    from skygreen.plan.catalog import CLOUDS, ENV_CATALOG_DIR

    chosen = tuple(read_choice(c, "--cloud", CLOUDS) for c in clouds) if clouds else CLOUDS
    target = (
        catalog
        if catalog is not None
        else (Path(os.environ[ENV_CATALOG_DIR]) if os.environ.get(ENV_CATALOG_DIR) else None)
    )
    from skygreen.plan.catalog_update import update_catalog

    for result in update_catalog(chosen, catalog_dir=target):
        sys.stdout.write(f"{result.cloud}: {result.status} {result.path}\n")


@app.command()
@task_argument
@click.option("--local", is_flag=True, help="Run on this machine (CPU, or a local GPU) instead of the cloud.")
@click.option("--dryrun", is_flag=True, help="Print the plan and write the SkyPilot YAML; launch nothing.")
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), default=None, help="Also write the rendered SkyPilot YAML here."
)
@click.option("--no-smoke", is_flag=True, help="Skip the CPU smoke test of the training script.")
@click.option("--detach", "-d", is_flag=True, help="With --local: return at once instead of following the run.")
@catalog_option
def up(
    task: Path, local: bool, dryrun: bool, output: Path | None, no_smoke: bool, detach: bool, catalog: Path | None
) -> None:
    """Smoke-test, render and launch a run: a managed spot job, or with --local this machine."""
    from skygreen import api

    result = api.up(task, local=local, dryrun=dryrun, output=output, smoke=not no_smoke, catalog_dir=catalog)
    if result.plan is not None:
        for line in result.plan.notices:
            print_notice(line)
        if dryrun:
            from skygreen.plan.report import print_plan

            print_plan(result.plan, top=10)
    if dryrun:
        sys.stdout.write(f"wrote {result.yaml_path} (dry run: nothing launched)\n")
        return
    from skygreen.launch.report import print_launched

    print_launched(result, sys.stdout)
    if local and not detach:
        _follow_local(result.run_id)


def _follow_local(run_id: str) -> None:
    """Stream a local run's output until it ends; Ctrl-C stops following, not the run."""
    from skygreen import api
    from skygreen.launch.report import print_status_detail

    try:
        api.logs(run_id, follow=True)
    except KeyboardInterrupt:
        sys.stderr.write(
            f"\nstopped following; run {run_id} continues in the background "
            f"(`skygreen logs {run_id} --follow`, `skygreen cancel {run_id}`)\n"
        )
        raise click.exceptions.Exit(130) from None
    (final,) = api.status(run_id)
    print_status_detail(final, sys.stdout)
    if final.state != "SUCCEEDED":
        raise click.exceptions.Exit(1)


@app.command()
@click.argument("run", required=False, metavar="[RUN]")
@json_option
@click.option("--statement", is_flag=True, help="Print the run's energy statement (a paragraph for a paper).")
def status(run: str | None, json_output: bool, statement: bool) -> None:
    """Runs with their state, step, model digest, preemptions, spend, energy and CO2e so far.

    RUN: a run id; default: every run on this machine.
    """
    from skygreen import api
    from skygreen.errors import InputError
    from skygreen.launch.report import print_statement, print_status_detail, print_status_table

    if statement and run is None:
        raise InputError(
            "--statement needs a RUN\n  fix: skygreen status RUN --statement (skygreen status lists the runs)"
        )
    rows = api.status(run)
    if statement:
        print_statement(rows[0], sys.stdout)
    elif json_output:
        print_json([r.to_json() for r in rows] if run is None else rows[0].to_json())
    elif run is None:
        print_status_table(rows, sys.stdout)
    else:
        print_status_detail(rows[0], sys.stdout)


@app.command()
@run_argument
@click.option("--local", is_flag=True, help="Continue the run on this machine.")
@click.option("--detach", "-d", is_flag=True, help="For local runs: return at once instead of following.")
def resume(run: str, local: bool, detach: bool) -> None:
    """Relaunch a stopped run with the same id; it continues from its latest checkpoint."""
    from skygreen import api

    record = api.resume(run, local=local)
    sys.stdout.write(f"resumed run {record.run_id} (job {record.job_id}, launch {len(record.launches)})\n")
    if record.mode == "local" and not detach:
        _follow_local(record.run_id)


@app.command()
@run_argument
def cancel(run: str) -> None:
    """Stop a run; it commits a checkpoint first, so `skygreen resume` can continue it."""
    from skygreen import api

    final = api.cancel(run)
    step = final.step if final.step is not None else "-"
    sys.stdout.write(f"cancelled run {final.run_id}: {final.state}, last checkpoint at step {step}\n")


@app.command()
@run_argument
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run ends.")
def logs(run: str, follow: bool) -> None:
    """Print a run's output (the training script's stdout and stderr)."""
    from skygreen import api

    api.logs(run, follow=follow)


@app.command()
@click.argument("target", metavar="RUN|URL")
@click.option("--older-than", default="90d", show_default=True, help="Age of checkpoints to move, e.g. 90d, 12h, 2w.")
@click.option(
    "--storage-class",
    default=None,
    help="S3: GLACIER (default), DEEP_ARCHIVE, GLACIER_IR; GCS: ARCHIVE (default), COLDLINE, NEARLINE.",
)
@click.option("--yes", is_flag=True, help="Act; without it gc only prints what it would move.")
def gc(target: str, older_than: str, storage_class: str | None, yes: bool) -> None:
    """Move stale checkpoints to a cold storage class (never the latest, best or pinned ones).

    RUN|URL: a run id, a run's checkpoint URL, or a bucket URL holding runs.
    """
    from skygreen import api

    result = api.gc(target, older_than=older_than, storage_class=storage_class, act=yes)
    if result.local:
        sys.stdout.write(f"{result.url} is a local directory: cold storage classes do not apply; nothing to move\n")
        return
    if not result.moves:
        sys.stdout.write(
            f"nothing older than {older_than} to move under {result.url} (latest, best and pinned checkpoints are kept)\n"
        )
        return
    verb = "moved" if yes else "would move"
    for move in result.moves:
        sys.stdout.write(
            f"{verb} {move.run_url}/{move.key} (step {move.step}, {move.age_days:.0f} days old) to {move.storage_class}\n"
        )
    if not yes:
        sys.stdout.write(f"dry run: {len(result.moves)} object(s); run again with --yes to move them\n")


@app.command()
@task_argument
def smoke(task: Path) -> None:
    """Run the task's training script for two steps on CPU, with a checkpoint round trip."""
    from skygreen.launch.smoke import run_smoke

    result = run_smoke(task)
    sys.stdout.write(f"{result.line} ({result.duration_s:.1f} s)\n")


@app.command()
@json_option
def power(json_output: bool) -> None:
    """The GPUs here: current, default, min and max power limits, and skygreen's caps on them."""
    from skygreen import api
    from skygreen.power.report import print_gpus

    report = api.power_gpus()
    if json_output:
        print_json(report)
    else:
        print_gpus(report, sys.stdout)


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    try:
        app.main(args=argv, prog_name="skygreen", standalone_mode=False)
    except SkygreenError as e:
        if os.environ.get("SKYGREEN_DEBUG") == "1":
            raise
        sys.stderr.write(f"error: {e}\n")
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
