"""skygreen as a library: the functions the `skygreen` command calls, usable from Python.

Composition happens here: load what a call needs (task, catalog), hand plain records to the
pure core, return plain records. Nothing here imports sky or torch at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skygreen.spec import TaskSpec

if TYPE_CHECKING:
    from skygreen.plan.rank import Plan


def plan(spec: TaskSpec, *, catalog_dir: Path | None = None, measured_speed: Mapping[str, float] | None = None) -> Plan:
    """Rank the GPU offers for a task, best first (a `skygreen.plan.rank.Plan`).

    `catalog_dir`: a SkyPilot v8 catalog folder (`<cloud>/vms.csv`); None means
    `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own (`~/.sky/catalogs/v8`), else the embedded
    price table. `measured_speed`: relative speeds measured by earlier runs, which replace
    the built-in table. Raises `NoOfferError` (which constraint to relax), `SpecError`
    (unknown region) or `CatalogError`.
    """
    from skygreen.plan.catalog import load_catalog
    from skygreen.plan.rank import make_plan

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
    from skygreen.launch import runs

    return runs.up(task_path, local=local, dryrun=dryrun, output=output, smoke=smoke, catalog_dir=catalog_dir)


def status(run_id: str | None = None):
    """`runs.RunStatus` of one run, or of every run on this machine."""
    from skygreen.launch import runs

    return runs.status(run_id)


def power_gpus() -> dict:
    """This machine's GPUs (real, or simulated with `SKYGREEN_SIMULATED_GPU`): limits and skygreen's caps."""
    from skygreen.power.report import local_gpus

    return local_gpus()


def resume(run_id: str, *, local: bool = False, budget_usd: float | None = None):
    """Relaunch a stopped run with the same run id; it continues from its last checkpoint.
    `budget_usd`: a new budget (needed, and higher, for a run stopped at its budget)."""
    from skygreen.launch import runs

    return runs.resume(run_id, local=local, budget_usd=budget_usd)


def cancel(run_id: str):
    """Stop a run; the runtime commits a checkpoint first, so `resume` can continue it.
    Returns `runs.CancelResult` (`already_ended`: the run had ended; nothing changed)."""
    from skygreen.launch import runs

    return runs.cancel(run_id)


def logs(run_id: str, *, follow: bool = False, out=None) -> int | None:
    """Write a run's output to `out` (stdout); `follow` until it ends."""
    from skygreen.launch import runs

    return runs.logs(run_id, follow=follow, out=out)


# ---------------------------------------------------------------- cost, compare


def run_cost(run_id: str, *, catalog_dir: Path | None = None):
    """What a run cost, from its ledger (`costing.RunCostReport`); a local run also gets the
    same task estimated on each cloud."""
    from skygreen.costs import costing

    return costing.cost_of_run(run_id, catalog_dir=catalog_dir)


def estimate(task_path: str | Path, *, catalog_dir: Path | None = None):
    """A task's estimated cost per run on each cloud (`costing.TaskEstimate`), the plan's pick first."""
    from skygreen.costs import costing

    return costing.estimate_task(task_path, catalog_dir=catalog_dir)


def compare(run_ids: list[str], *, catalog_dir: Path | None = None):
    """Runs side by side (`costing.CompareRow`s)."""
    from skygreen.costs import costing

    return costing.compare_runs(run_ids, catalog_dir=catalog_dir)


# ---------------------------------------------------------------- gc


@dataclass(frozen=True, kw_only=True, slots=True)
class GcResult:
    url: str
    local: bool
    """A local directory: cold storage classes do not apply, nothing was looked at."""
    moves: tuple = ()
    """`checkpoint.ColdMove`s, done when `act` was true, else only planned."""


def gc(target: str, *, older_than: str = "90d", storage_class: str | None = None, act: bool = False) -> GcResult:
    """Move checkpoints older than `older_than` to a cold storage class; `act=False` is a dry run.

    `target` is a run id (resolved through the run registry), a run's checkpoint URL, or a
    bucket URL holding runs. The latest, best and pinned checkpoints never move.
    """
    import time

    from skygreen.checkpoint import gc as checkpoint_gc
    from skygreen.checkpoint.store import parse_url
    from skygreen.errors import InputError

    url = _checkpoint_target(target)
    scheme = parse_url(url).scheme
    if scheme == "file":
        return GcResult(url=url, local=True)
    allowed = checkpoint_gc.COLD_CLASSES[scheme]
    cold = (storage_class or checkpoint_gc.DEFAULT_COLD_CLASS[scheme]).upper()
    if cold not in allowed:
        raise InputError(
            f"--storage-class: {storage_class!r} is not a cold class for {scheme}://\n  allowed: {', '.join(allowed)}"
        )
    from skygreen.launch.bucket import check_readable

    check_readable(url)  # a bucket that does not answer fails here, within a minute, in one line
    moves = checkpoint_gc.plan_cold_moves(
        url, older_than_s=checkpoint_gc.parse_age_s(older_than), storage_class=cold, now_s=time.time()
    )
    if act and moves:
        moves = checkpoint_gc.apply_cold_moves(moves)
    return GcResult(url=url, local=False, moves=tuple(moves))


def _checkpoint_target(target: str) -> str:
    """A URL or existing path as given; otherwise a run id, resolved through the run registry."""
    if "://" in target or Path(target).exists():
        return target
    from skygreen.launch.registry import Registry

    return Registry().load(target).checkpoint_url
