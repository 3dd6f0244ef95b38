"""skygreen as a library: the functions the `skygreen` command calls, usable from Python.

The laptop's composition root: this is the one module that picks the adapters (the price
catalog on disk, the checkpoint stores, the launchers, the smoke test's subprocess) and hands
them to the core, which imports none of them. Nothing here imports sky or torch at module
level; each function imports what it needs when called.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from skygreen.spec import TaskSpec
from skygreen.task_checks import load_task

if TYPE_CHECKING:
    from skygreen.checkpoint.gc import GcResult
    from skygreen.costs.changeovers import MeasuredChangeovers
    from skygreen.costs.costing import Comparison, RunCostReport, TaskEstimate
    from skygreen.costs.spend import TeamSpend
    from skygreen.deadline.compare import Simulation, SimulationRequest
    from skygreen.deadline.live import DeadlineTerms
    from skygreen.deadline.watch import WatchResult
    from skygreen.launch.registry import RunRecord
    from skygreen.launch.runs import CancelResult, UpRequest, UpResult
    from skygreen.launch.smoke import SmokeResult
    from skygreen.launch.status import ResumePoint, RunStatus, UnknownJob
    from skygreen.launch.wiring import Wiring
    from skygreen.plan.catalog_update import CloudUpdate
    from skygreen.plan.rank import Plan


_REQUESTS = {"UpRequest": "skygreen.launch.runs", "SimulationRequest": "skygreen.deadline.compare"}
"""The request records the commands take, importable from here (`api.UpRequest`) without
loading their modules until one is used: `plan` never does."""


def __getattr__(name: str) -> Any:
    if name in _REQUESTS:
        import importlib

        return getattr(importlib.import_module(_REQUESTS[name]), name)
    raise AttributeError(f"module 'skygreen.api' has no attribute {name!r}")


def plan(
    spec: TaskSpec | str | os.PathLike[str],
    *,
    catalog_dir: Path | None = None,
    measured_speed: Mapping[str, float] | None = None,
    measured_changeovers: MeasuredChangeovers | None = None,
) -> Plan:
    """Rank the GPU offers for a task (a parsed `TaskSpec`, or the task file's path), best first.

    `catalog_dir`: a SkyPilot v8 catalog folder (`<cloud>/vms.csv`); None means
    `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own (`~/.sky/catalogs/v8`), else the embedded
    price table. `measured_speed`: relative speeds measured by earlier runs, which replace
    the built-in table; `measured_changeovers` (`skygreen.costs.changeovers.MeasuredChangeovers`):
    their changeovers and restore rate, which replace the flat restart and transfer rate. Raises `NoOfferError` (which constraint to relax), `SpecError`
    (unknown region) or `CatalogError`.
    """
    from skygreen.plan.catalog import load_catalog
    from skygreen.plan.rank import make_plan

    if not isinstance(spec, TaskSpec):
        spec = load_task(spec)
    catalog = load_catalog(catalog_dir)
    learned = measured_changeovers
    return make_plan(
        spec,
        catalog,
        measured_speed=measured_speed,
        measured_changeover_s=learned.seconds if learned is not None else None,
        measured_transfer_gb_per_s=learned.restore_gb_per_s if learned is not None else None,
    )


def plan_task(task_path: str | Path, *, catalog_dir: Path | None = None, deadline: str | None = None) -> Plan:
    """`skygreen plan TASK`: the task file's plan, with throughput measured by earlier runs of
    the same task, and `deadline` (`36h`) in place of the file's `skygreen.deadline`."""
    spec = load_task(task_path)
    if deadline is not None:
        from skygreen.spec import with_deadline

        spec = with_deadline(spec, deadline, "--deadline")
    return plan(
        spec,
        catalog_dir=catalog_dir,
        measured_speed=measured_speeds(spec, task_path),
        measured_changeovers=measured_changeovers(task_path),
    )


def show_store_retries() -> None:
    """Print each retry of a bucket call on stderr (`SKYGREEN_DEBUG=1`); otherwise only the
    final error of a call that gave up is shown."""
    from skygreen.checkpoint.store import show_retries

    show_retries()


def measured_changeovers(task_path: str | Path) -> MeasuredChangeovers:
    """Changeovers measured by earlier runs of this task on this machine
    (`skygreen.costs.changeovers.MeasuredChangeovers`)."""
    from skygreen.costs.changeovers import measured_changeovers as measured

    return measured(task_path)


def measured_speeds(spec: TaskSpec, task_path: str | Path) -> dict[str, float]:
    """Relative speeds per GPU measured by earlier runs of this task on this machine."""
    from skygreen.costs.speeds import measured_speeds as measured

    return {gpu: speed for gpu, (speed, _) in measured(spec, task_path).items()}


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
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.launch import launcher_factory
    from skygreen.launch.registry import Registry
    from skygreen.launch.wiring import Wiring

    env = os.environ if environ is None else environ
    return Wiring(
        registry=Registry(),
        environ=env,
        plan=lambda spec: plan(
            spec,
            catalog_dir=catalog_dir,
            measured_speed=measured_speeds(spec, spec.source) if spec.source else {},
            measured_changeovers=measured_changeovers(spec.source) if spec.source else None,
        ),
        smoke=smoke,
        open_store=open_store,
        cloud_launcher=lambda: launcher_factory.cloud_launcher(env),
        local_launcher=lambda: launcher_factory.local_launcher(env),
    )


def up(request: UpRequest) -> UpResult:
    """Validate, plan, CPU smoke-test, preflight the checkpoint bucket, render the SkyPilot
    task and launch it (a managed spot job; `request.local` runs it on this machine).
    `request.dryrun` only writes the YAML (to `request.output`, else under the data dir).

    A deadline (`request.deadline`, `36h`; else the task's `skygreen.deadline`) holds the run
    to it: it starts on spot and a watcher started in the background (`request.watch`) moves it
    to on-demand and back as `request.policy` says (default: skygreen's own). `request.compute`
    (`20h`): the compute the run needs, when the plan's estimate (or, for a local run, the
    measured throughput) should not be used. `watch=False` starts no watcher: the caller runs
    `watch` where it can stay up.
    """
    from skygreen.deadline.clock import now_s
    from skygreen.deadline.terms import DeadlineAsk
    from skygreen.launch import runs

    ask = DeadlineAsk(
        now_s=now_s(os.environ), deadline_h=request.deadline_h, compute_h=request.compute_h, policy=request.policy
    )
    w = wiring(catalog_dir=request.catalog_dir)
    result = runs.up(request, deadline=ask, wiring=w)
    if request.watch and result.record is not None and result.record.deadline is not None:
        import dataclasses

        from skygreen.deadline.watch_process import start_watcher

        pid = start_watcher(result.record.run_id, registry_dir=w.registry.run_dir(result.record.run_id))
        result = dataclasses.replace(result, watcher_pid=pid)
    return result


def watch(
    run_id: str, *, poll: str = "60s", once: bool = False, say: Callable[[str], None] | None = None
) -> WatchResult:
    """Hold a run launched with a deadline to it: poll every `poll` (`60s`), moving it between
    spot and on-demand as its deadline policy says, until it ends (`once`: one poll). A run
    already watched by another process returns at once (exit code 0)."""
    from skygreen.deadline.clock import now_s
    from skygreen.deadline.watch import Watch
    from skygreen.fields import read_duration_s

    poll_s = read_duration_s(poll, "--poll")
    env = os.environ
    w = wiring()
    run_id = w.registry.resolve(run_id)
    watcher = Watch(
        run_id=run_id, wiring=w, clock=lambda: now_s(env), market=_market(env), say=say or (lambda line: None)
    )
    return watcher.run(poll_s=poll_s, once=once)


def _market(environ: Mapping[str, str]) -> Callable[[DeadlineTerms], Callable[[float], bool]] | None:
    """A replayed spot market from `SKYGREEN_TEST_SPOT_TRACE`, or None (availability is inferred)."""
    from skygreen.deadline.market import TRACE_ENV, TraceMarket

    path = environ.get(TRACE_ENV)
    if not path:
        return None
    from skygreen.errors import InputError
    from skygreen.plan.replay import load_trace

    try:
        trace = load_trace(path)
    except (OSError, ValueError) as e:
        raise InputError(f"{TRACE_ENV}={path}: {e}\n  fix: name a spot trace file `skygreen simulate` reads") from e
    return lambda terms: TraceMarket(trace=trace, started_at_s=terms.started_at_s, nodes=terms.nodes).available


def status(run_id: str | None = None) -> list[RunStatus]:
    """The status of one run, or of every run on this machine (newest last)."""
    from skygreen.launch.status import status as run_statuses

    return run_statuses(run_id, wiring=wiring())


def power_gpus() -> dict[str, Any]:
    """This machine's GPUs (real, or simulated with `SKYGREEN_SIMULATED_GPU`): limits and skygreen's caps."""
    from skygreen.power.caps import local_gpus
    from skygreen.power.nvml import Nvml

    return local_gpus(lambda: Nvml(environ=os.environ))


def resume(run_id: str, *, local: bool = False, budget_usd: float | None = None) -> RunRecord:
    """Relaunch a stopped run with the same run id; it continues from its last checkpoint.
    `budget_usd`: a new budget (needed, and higher, for a run stopped at its budget). A run
    launched with a deadline is held to it again: its watcher starts unless one runs."""
    from skygreen.deadline.watch_process import start_watcher
    from skygreen.deadline.watch_state import clear_user_cancel, watcher_running
    from skygreen.launch import runs

    w = wiring()
    record = runs.resume(run_id, local=local, budget_usd=budget_usd, wiring=w)
    run_dir = w.registry.run_dir(record.run_id)
    clear_user_cancel(run_dir)  # the user's relaunch: the deadline holds again
    if record.deadline is not None and not watcher_running(run_dir):
        start_watcher(record.run_id, registry_dir=run_dir)
    return record


def resume_point(run_id: str) -> ResumePoint:
    """Where a `resume` of the run would continue: its latest checkpoint's step, or step 0."""
    from skygreen.launch.status import resume_point as point

    w = wiring()
    return point(w.registry.load(run_id), wiring=w)


def cancel(run_id: str) -> CancelResult:
    """Stop a run; the runtime commits a checkpoint first, so `resume` can continue it
    (`already_ended`: the run had ended; nothing changed)."""
    from skygreen.launch import runs

    return runs.cancel(run_id, wiring=wiring())


def unknown_jobs() -> list[UnknownJob]:
    """Jobs still going that skygreen launched but no run record on this machine knows."""
    from skygreen.launch.status import unknown_jobs as find_unknown

    w = wiring()
    return find_unknown(w.registry.list(), wiring=w)


def cancel_unknown_jobs(name: str) -> list[UnknownJob]:
    """Stop the unknown jobs (`unknown_jobs`) named `name` or of run id `name`; returns them."""
    from skygreen.launch import runs

    return runs.cancel_unknown_jobs(name, wiring=wiring())


def logs(run_id: str, *, follow: bool = False, out: TextIO | None = None) -> int | None:
    """Write a run's output to `out` (stdout); with `follow`, until the run ends."""
    from skygreen.launch import runs

    return runs.logs(run_id, follow=follow, out=out, wiring=wiring())


# ---------------------------------------------------------------- cost, compare


def cost_before_ledger(run_id: str) -> dict[str, Any]:
    """What is known of the spend of a run launched but not training yet (no ledger): its state,
    how long since its latest launch started, the time its launcher reports it has run (paid,
    from the VM's first second), and that time priced at the plan's offer (an estimate)."""
    from skygreen.launch.status import status as run_statuses
    from skygreen.timestamps import parse_iso_s

    w = wiring()
    record = w.registry.load(run_id)
    (now,) = run_statuses(record.run_id, wiring=w)
    launched = record.launches[-1].at if record.launches else None
    since_s = max(0.0, time.time() - parse_iso_s(launched)) if launched else None
    return {
        "run_id": record.run_id,
        "state": now.state,
        "ledger": None,
        "launches": now.launches,
        "since_launch_s": since_s,
        "paid_s": now.job_duration_s,
        "spend_usd": now.spend_usd,
        "spend_estimated": now.spend_estimated,
        "note": "no ledger yet: the runtime writes it when training starts; until then the launcher's run time is the time paid",
    }


def run_cost(run_id: str, *, catalog_dir: Path | None = None) -> RunCostReport:
    """What a run cost, from its ledger; a local run also gets the same task estimated on each cloud."""
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing

    return costing.cost_of_run(run_id, open_store=open_store, catalog_dir=catalog_dir)


def team_spend(
    *, buckets: Iterable[str] = (), by: str | None = None, since: str | None = None, catalog_dir: Path | None = None
) -> TeamSpend:
    """Every run this machine knows and every run in `buckets`, each once, priced from its ledger
    and grouped `by` task, cloud, gpu or user; `since` (`30d`) keeps the runs active in that window.

    A bucket that cannot be read leaves out only its own runs; it is named in
    `TeamSpend.unreadable` (and `complete` is False).

    Raises:
        SpecError: a bad `by`, `since` or bucket URL (exit 2).
    """
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import spend

    grouping = spend.read_grouping(by)
    since_s = spend.read_since_s(since)
    urls = spend.read_buckets(buckets)
    return spend.team_spend(open_store=open_store, buckets=urls, by=grouping, since_s=since_s, catalog_dir=catalog_dir)


def estimate(task_path: str | Path, *, catalog_dir: Path | None = None) -> TaskEstimate:
    """A task's estimated cost per run on each cloud, the plan's pick first."""
    from skygreen.costs import costing

    return costing.estimate_task(task_path, catalog_dir=catalog_dir)


def is_task_file(target: str) -> bool:
    """`skygreen cost TARGET`: a task file (`.yaml`, or an existing file) rather than a run id."""
    return target.endswith((".yaml", ".yml")) or Path(target).is_file()


def compare(run_ids: list[str], *, catalog_dir: Path | None = None) -> Comparison:
    """Runs side by side; those with no ledger yet are left out and named (`Comparison.waiting`)."""
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing

    return costing.compare_runs(run_ids, open_store=open_store, catalog_dir=catalog_dir)


def plot_runs(path: Path, run_ids: list[str], *, catalog_dir: Path | None = None) -> Path:
    """Draw the runs' cost figures to `path` (.png, or .html for one page); needs skygreen[report]."""
    from skygreen.costs.page import write_plot

    write_plot(path, [run_cost(run_id, catalog_dir=catalog_dir) for run_id in run_ids])
    return path


def write_report(run_id: str, output: Path | None = None, *, catalog_dir: Path | None = None) -> Path:
    """One self-contained HTML page about a run (default `RUN-report.html` here); returns its path."""
    import io

    from skygreen.costs.page import write_report as write_page
    from skygreen.launch.report import print_statement

    statement = io.StringIO()
    print_statement(status(run_id)[0], statement)
    return write_page(
        run_cost(run_id, catalog_dir=catalog_dir),
        output or Path(f"{run_id}-report.html"),
        statement=statement.getvalue().strip(),
    )


# ---------------------------------------------------------------- deadlines


def simulate(request: SimulationRequest) -> Simulation:
    """Replay a spot trace against deadline policies (`skygreen simulate`): the request's
    durations are already read (`48h`, `90m`, or hours), and `SpecError` names a bad flag."""
    from skygreen.deadline import compare as deadline_compare

    return deadline_compare.run(request)


# ---------------------------------------------------------------- demo


def demo(
    view,
    *,
    folder: Path | None = None,
    gpu: str | None = None,
    steps: int | None = None,
    catalog_dir: Path | None = None,
):
    """Run `tasks/tiny.yaml` through every stage on this machine (`skygreen.demo.run_demo`):
    plan, smoke test, training on a simulated GPU, a SIGKILL preemption and the resume, energy,
    cost, plot and report, all under `folder`. Returns `demo.DemoResult`."""
    from skygreen import demo as demo_module

    return demo_module.run_demo(
        view,
        sys.modules[__name__],
        folder=folder,
        gpu=gpu or demo_module.SIMULATED_GPU,
        steps=steps or demo_module.STEPS,
        catalog_dir=catalog_dir,
    )


# ---------------------------------------------------------------- gc


def gc(target: str, *, older_than: str = "90d", storage_class: str | None = None, act: bool = False) -> GcResult:
    """Move checkpoints older than `older_than` to a cold storage class; `act=False` is a dry run.

    `target` is a run id (resolved through the run registry), a run's checkpoint URL, or a
    bucket URL holding runs. The latest, best and pinned checkpoints never move.
    """
    from skygreen.checkpoint import gc as cold
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.launch.bucket import check_readable

    return cold.gc(
        _checkpoint_target(target),
        open_store=open_store,
        older_than=older_than,
        storage_class=storage_class,
        act=act,
        now_s=time.time(),
        check_bucket=lambda url: check_readable(open_store, url),
    )


def _checkpoint_target(target: str) -> str:
    """A URL or existing path as given; otherwise a run id, resolved through the run registry."""
    if "://" in target or Path(target).exists():
        return target
    from skygreen.launch.registry import Registry

    return Registry().load(target).checkpoint_url
