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
from typing import Annotated, Optional

import click
import typer

from skygreen.errors import SkygreenError

app = typer.Typer(
    name="skygreen",
    help="Cheap, green cloud GPU training: cheapest spot GPUs, mixed precision, power caps, "
    "and runs that survive preemption. Built on SkyPilot.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
catalog_app = typer.Typer(help="The GPU price catalog (SkyPilot's own, schema v8).", no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")

TaskArg = Annotated[Path, typer.Argument(help="Task file: a SkyPilot task YAML with a `skygreen:` section.")]
CatalogOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--catalog",
        help="Catalog directory holding <cloud>/vms.csv (default: $SKYGREEN_CATALOG_DIR, "
        "else ~/.sky/catalogs/v8, else the embedded snapshot).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def print_json(data: object) -> None:
    """JSON on stdout, one document, for scripts."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def print_notice(line: str) -> None:
    """A one-line remark for the user on stderr, so `--json` output stays clean."""
    sys.stderr.write(f"note: {line}\n")


@app.command()
def plan(
    task: TaskArg,
    catalog: CatalogOpt = None,
    json_output: JsonOpt = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows in the ranked table.")] = 10,
) -> None:
    """Rank spot GPU offers across AWS, GCP and Azure by estimated cost per run."""
    from skygreen import api
    from skygreen.spec import load_spec

    result = api.plan(load_spec(task), catalog_dir=catalog)
    for line in result.notices:
        print_notice(line)
    if json_output:
        print_json(result.to_json())
        return
    from skygreen.plan_report import print_plan

    print_plan(result, top=top)


@catalog_app.command("update")
def catalog_update(
    catalog: CatalogOpt = None,
    clouds: Annotated[
        Optional[list[str]], typer.Option("--cloud", help="Only this cloud (repeatable): aws, gcp, azure.")
    ] = None,
) -> None:
    """Download SkyPilot's current price catalog (through SkyPilot; needs the internet)."""
    from skygreen.catalog import CLOUDS, ENV_CATALOG_DIR
    from skygreen.fields import read_choice

    chosen = tuple(read_choice(c, "--cloud", CLOUDS) for c in clouds) if clouds else CLOUDS
    target = catalog if catalog is not None else (Path(os.environ[ENV_CATALOG_DIR]) if os.environ.get(ENV_CATALOG_DIR) else None)
    from skygreen.adapters.skypilot_catalog import update_catalog

    for result in update_catalog(chosen, catalog_dir=target):
        sys.stdout.write(f"{result.cloud}: {result.status} {result.path}\n")


RunArg = Annotated[str, typer.Argument(help="Run id, as printed by `skygreen up` and `skygreen status`.")]


@app.command()
def up(
    task: TaskArg,
    local: Annotated[bool, typer.Option("--local", help="Run on this machine (CPU, or a local GPU) instead of the cloud.")] = False,
    dryrun: Annotated[bool, typer.Option("--dryrun", help="Print the plan and write the SkyPilot YAML; launch nothing.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the rendered SkyPilot YAML here.")] = None,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Skip the CPU smoke test of the training script.")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="With --local: return at once instead of following the run.")] = False,
    catalog: CatalogOpt = None,
) -> None:
    """Smoke-test, render and launch a run: a managed spot job, or with --local this machine."""
    from skygreen import api

    result = api.up(task, local=local, dryrun=dryrun, output=output, smoke=not no_smoke, catalog_dir=catalog)
    if result.plan is not None:
        for line in result.plan.notices:
            print_notice(line)
        if dryrun:
            from skygreen.plan_report import print_plan

            print_plan(result.plan, top=10)
    if dryrun:
        sys.stdout.write(f"wrote {result.yaml_path} (dry run: nothing launched)\n")
        return
    from skygreen.run_report import print_launched

    print_launched(result, sys.stdout)
    if local and not detach:
        _follow_local(result.run_id)


def _follow_local(run_id: str) -> None:
    """Stream a local run's output until it ends; Ctrl-C stops following, not the run."""
    from skygreen import api
    from skygreen.run_report import print_status_detail

    try:
        api.logs(run_id, follow=True)
    except KeyboardInterrupt:
        sys.stderr.write(f"\nstopped following; run {run_id} continues in the background "
                         f"(`skygreen logs {run_id} --follow`, `skygreen cancel {run_id}`)\n")
        raise typer.Exit(130) from None
    (final,) = api.status(run_id)
    print_status_detail(final, sys.stdout)
    if final.state != "SUCCEEDED":
        raise typer.Exit(1)


@app.command()
def status(
    run: Annotated[Optional[str], typer.Argument(help="Run id; default: every run on this machine.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Runs with their state, step, model digest, preemptions, spend and energy so far."""
    from skygreen import api
    from skygreen.run_report import print_status_detail, print_status_table

    rows = api.status(run)
    if json_output:
        print_json([r.to_json() for r in rows] if run is None else rows[0].to_json())
    elif run is None:
        print_status_table(rows, sys.stdout)
    else:
        print_status_detail(rows[0], sys.stdout)


@app.command()
def resume(
    run: RunArg,
    local: Annotated[bool, typer.Option("--local", help="Continue the run on this machine.")] = False,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="For local runs: return at once instead of following.")] = False,
) -> None:
    """Relaunch a stopped run with the same id; it continues from its latest checkpoint."""
    from skygreen import api

    record = api.resume(run, local=local)
    sys.stdout.write(f"resumed run {record.run_id} (job {record.job_id}, launch {len(record.launches)})\n")
    if record.mode == "local" and not detach:
        _follow_local(record.run_id)


@app.command()
def cancel(run: RunArg) -> None:
    """Stop a run; it commits a checkpoint first, so `skygreen resume` can continue it."""
    from skygreen import api

    final = api.cancel(run)
    sys.stdout.write(f"cancelled run {final.run_id}: {final.state}, last checkpoint at step {final.step if final.step is not None else '-'}\n")


@app.command()
def logs(
    run: RunArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the run ends.")] = False,
) -> None:
    """Print a run's output (the training script's stdout and stderr)."""
    from skygreen import api

    api.logs(run, follow=follow)


@app.command()
def gc(
    target: Annotated[str, typer.Argument(help="A run id, a run's checkpoint URL, or a bucket URL holding runs.")],
    older_than: Annotated[str, typer.Option("--older-than", help="Age of checkpoints to move, e.g. 90d, 12h, 2w.")] = "90d",
    storage_class: Annotated[
        Optional[str],
        typer.Option("--storage-class", help="S3: GLACIER (default), DEEP_ARCHIVE, GLACIER_IR; GCS: ARCHIVE (default), COLDLINE, NEARLINE."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Act; without it gc only prints what it would move.")] = False,
) -> None:
    """Move stale checkpoints to a cold storage class (never the latest, best or pinned ones)."""
    import time

    from skygreen import checkpoint
    from skygreen.errors import InputError
    from skygreen.store import parse_url

    url = _checkpoint_target(target)
    scheme = parse_url(url).scheme
    if scheme == "file":
        sys.stdout.write(f"{url} is a local directory: cold storage classes do not apply; nothing to move\n")
        return
    allowed = checkpoint.COLD_CLASSES[scheme]
    cold = (storage_class or checkpoint.DEFAULT_COLD_CLASS[scheme]).upper()
    if cold not in allowed:
        raise InputError(f"--storage-class: {storage_class!r} is not a cold class for {scheme}://\n  allowed: {', '.join(allowed)}")
    moves = checkpoint.plan_cold_moves(url, older_than_s=checkpoint.parse_age_s(older_than), storage_class=cold, now_s=time.time())
    if not moves:
        sys.stdout.write(f"nothing older than {older_than} to move under {url} (latest, best and pinned checkpoints are kept)\n")
        return
    if yes:
        moves = checkpoint.apply_cold_moves(moves)
    verb = "moved" if yes else "would move"
    for move in moves:
        sys.stdout.write(f"{verb} {move.run_url}/{move.key} (step {move.step}, {move.age_days:.0f} days old) to {move.storage_class}\n")
    if not yes:
        sys.stdout.write(f"dry run: {len(moves)} object(s); run again with --yes to move them\n")


def _checkpoint_target(target: str) -> str:
    """A URL or existing path as given; otherwise a run id, resolved through the run registry."""
    if "://" in target or Path(target).exists():
        return target
    from skygreen.registry import Registry

    return Registry().load(target).checkpoint_url


@app.command()
def smoke(task: TaskArg) -> None:
    """Run the task's training script for two steps on CPU, with a checkpoint round trip."""
    from skygreen.runtime.smoke import run_smoke

    result = run_smoke(task)
    sys.stdout.write(f"{result.line} ({result.duration_s:.1f} s)\n")


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="skygreen", standalone_mode=False)
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
