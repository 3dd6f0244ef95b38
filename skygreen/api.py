"""skygreen as a library: the functions the `skygreen` command calls, usable from Python.

Composition happens here: load what a call needs (task, catalog), hand plain records to the
pure core, return plain records. Nothing here imports sky or torch at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from typing import TYPE_CHECKING

from skygreen.spec import TaskSpec

if TYPE_CHECKING:
    from skygreen.plan import Plan


def plan(spec: TaskSpec, *, catalog_dir: Path | None = None, measured_speed: Mapping[str, float] | None = None) -> Plan:
    """Rank the GPU offers for a task, best first (a `skygreen.plan.Plan`).

    `catalog_dir`: a SkyPilot v8 catalog folder (`<cloud>/vms.csv`); None means
    `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own (`~/.sky/catalogs/v8`), else the embedded
    price table. `measured_speed`: relative speeds measured by earlier runs, which replace
    the built-in table. Raises `NoOfferError` (which constraint to relax), `SpecError`
    (unknown region) or `CatalogError`.
    """
    from skygreen.catalog import load_catalog
    from skygreen.plan import make_plan

    catalog = load_catalog(catalog_dir)
    return make_plan(spec, catalog, measured_speed=measured_speed)


# ---------------------------------------------------------------- runs: up, status, resume, cancel, logs
# The composition lives in `skygreen.runs`; these are its public names.


def up(
    task_path: str | Path,
    *,
    local: bool = False,
    dryrun: bool = False,
    output: str | Path | None = None,
    smoke: bool = True,
    catalog_dir: Path | None = None,
):
    """Validate, plan, CPU smoke-test, preflight the checkpoint bucket, render the SkyPilot
    task and launch it (a managed spot job; `local=True` runs it on this machine). `dryrun`
    only writes the YAML (to `output`, else under the data dir). Returns `runs.UpResult`."""
    from skygreen import runs

    return runs.up(task_path, local=local, dryrun=dryrun, output=output, smoke=smoke, catalog_dir=catalog_dir)


def status(run_id: str | None = None):
    """`runs.RunStatus` of one run, or of every run on this machine."""
    from skygreen import runs

    return runs.status(run_id)


def resume(run_id: str, *, local: bool = False):
    """Relaunch a stopped run with the same run id; it continues from its last checkpoint."""
    from skygreen import runs

    return runs.resume(run_id, local=local)


def cancel(run_id: str):
    """Stop a run; the runtime commits a checkpoint first, so `resume` can continue it."""
    from skygreen import runs

    return runs.cancel(run_id)


def logs(run_id: str, *, follow: bool = False, out=None) -> int | None:
    """Write a run's output to `out` (stdout); `follow` until it ends."""
    from skygreen import runs

    return runs.logs(run_id, follow=follow, out=out)
