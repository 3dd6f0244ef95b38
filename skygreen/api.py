"""skygreen as a library: the functions the `skygreen` command calls, usable from Python.

The laptop's composition root: this is the one module that picks the adapters (the price
catalog on disk, the checkpoint stores, the launchers, the smoke test's subprocess) and hands
them to the core, which imports none of them. Nothing here imports sky or torch at module
level; each function imports what it needs when called.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from skygreen.spec import TaskSpec, load_spec

if TYPE_CHECKING:
    from skygreen.checkpoint.gc import GcResult
    from skygreen.launch.registry import RunRecord
    from skygreen.launch.runs import RunStatus, UpResult, Wiring
    from skygreen.launch.smoke import SmokeResult
    from skygreen.plan.catalog_update import CloudUpdate
    from skygreen.plan.rank import Plan


def plan(
    spec: TaskSpec | str | os.PathLike[str],
    *,
    catalog_dir: Path | None = None,
    measured_speed: Mapping[str, float] | None = None,
) -> Plan:
    """Rank the GPU offers for a task (a parsed `TaskSpec`, or the task file's path), best first.

    `catalog_dir`: a SkyPilot v8 catalog folder (`<cloud>/vms.csv`); None means
    `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own (`~/.sky/catalogs/v8`), else the embedded
    price table. `measured_speed`: relative speeds measured by earlier runs, which replace
    the built-in table. Raises `NoOfferError` (which constraint to relax), `SpecError`
    (unknown region) or `CatalogError`.
    """
    from skygreen.plan.catalog import load_catalog
    from skygreen.plan.rank import make_plan

    if not isinstance(spec, TaskSpec):
        spec = load_spec(spec)
    catalog = load_catalog(catalog_dir)
    return make_plan(spec, catalog, measured_speed=measured_speed)


def update_catalog(clouds: Iterable[str] = (), *, catalog_dir: Path | None = None) -> list[CloudUpdate]:
    """Download SkyPilot's current price catalog for `clouds` (all when empty), through SkyPilot.

    `catalog_dir` (else `$SKYGREEN_CATALOG_DIR`) also receives a copy, for `--catalog`.
    """
    from skygreen.fields import read_choice
    from skygreen.plan.catalog import CLOUDS, resolve_catalog_dir
    from skygreen.plan.catalog_update import update_catalog as download

    chosen = tuple(read_choice(c, "--cloud", CLOUDS) for c in clouds) or CLOUDS
    target, explicit = resolve_catalog_dir(catalog_dir)
    return download(chosen, catalog_dir=target if explicit else None)


def smoke(task_path: str | Path) -> SmokeResult:
    """Run the task's training script for two steps on CPU, with a checkpoint round trip.

    Raises `SmokeTestError` naming the step that broke (forward, backward, optimizer, save, load).
    """
    from skygreen.launch.smoke import run_smoke

    return run_smoke(task_path)


# ---------------------------------------------------------------- runs: up, status, resume, cancel, logs


def wiring(*, catalog_dir: Path | None = None, environ: Mapping[str, str] | None = None) -> Wiring:
    """The outside world of a run's life on this machine: the real catalog, stores, launchers."""
    from skygreen.checkpoint.stores import open_store
    from skygreen.launch import launchers
    from skygreen.launch.registry import Registry
    from skygreen.launch.runs import Wiring

    env = os.environ if environ is None else environ
    return Wiring(
        registry=Registry(),
        environ=env,
        plan=lambda spec: plan(spec, catalog_dir=catalog_dir),
        smoke=smoke,
        open_store=open_store,
        cloud_launcher=lambda: launchers.cloud_launcher(env),
        local_launcher=lambda: launchers.local_launcher(env),
    )


def up(
    task_path: str | Path,
    *,
    local: bool = False,
    dryrun: bool = False,
    output: str | Path | None = None,
    smoke: bool = True,
    catalog_dir: Path | None = None,
) -> UpResult:
    """Validate, plan, CPU smoke-test, preflight the checkpoint bucket, render the SkyPilot
    task and launch it (a managed spot job; `local=True` runs it on this machine). `dryrun`
    only writes the YAML (to `output`, else under the data dir)."""
    from skygreen.launch import runs

    return runs.up(
        task_path, local=local, dryrun=dryrun, output=output, smoke=smoke, wiring=wiring(catalog_dir=catalog_dir)
    )


def status(run_id: str | None = None) -> list[RunStatus]:
    """The status of one run, or of every run on this machine (newest last)."""
    from skygreen.launch import runs

    return runs.status(run_id, wiring=wiring())


def resume(run_id: str, *, local: bool = False) -> RunRecord:
    """Relaunch a stopped run with the same run id; it continues from its last checkpoint."""
    from skygreen.launch import runs

    return runs.resume(run_id, local=local, wiring=wiring())


def cancel(run_id: str) -> RunStatus:
    """Stop a run after it commits a checkpoint; `resume` continues it."""
    from skygreen.launch import runs

    return runs.cancel(run_id, wiring=wiring())


def logs(run_id: str, *, follow: bool = False, out: TextIO | None = None) -> int | None:
    """Write a run's output to `out` (stdout); with `follow`, until the run ends."""
    from skygreen.launch import runs

    return runs.logs(run_id, follow=follow, out=out, wiring=wiring())


# ---------------------------------------------------------------- gc


def gc(target: str, *, older_than: str = "90d", storage_class: str | None = None, act: bool = False) -> GcResult:
    """Move checkpoints older than `older_than` to a cold storage class; `act=False` is a dry run.

    `target` is a run id (resolved through the run registry), a run's checkpoint URL, or a
    bucket URL holding runs. The latest, best and pinned checkpoints never move.
    """
    from skygreen.checkpoint import gc as cold
    from skygreen.checkpoint.stores import open_store

    return cold.gc(
        _checkpoint_target(target),
        open_store=open_store,
        older_than=older_than,
        storage_class=storage_class,
        act=act,
        now_s=time.time(),
    )


def _checkpoint_target(target: str) -> str:
    """A URL or existing path as given; otherwise a run id, resolved through the run registry."""
    if "://" in target or Path(target).exists():
        return target
    from skygreen.launch.registry import Registry

    return Registry().load(target).checkpoint_url
