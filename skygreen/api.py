"""skygreen as a library: the functions the `skygreen` command calls, usable from Python.

The laptop's composition root: this is the one module that picks the adapters (the price
catalog on disk, the checkpoint stores, the launchers, the smoke test's subprocess) and hands
them to the core, which imports none of them. Nothing here imports sky or torch at module
level; each function imports what it needs when called.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from skygreen.task.checks import load_task
from skygreen.task.spec import TaskSpec

if TYPE_CHECKING:
    from skygreen.checkpoint.gc import GcResult
    from skygreen.costs.changeovers import MeasuredChangeovers
    from skygreen.costs.costing import Comparison, RunCostReport, TaskEstimate
    from skygreen.costs.spend import TeamSpend
    from skygreen.deadline.compare import Simulation, SimulationRequest
    from skygreen.deadline.live import DeadlineTerms
    from skygreen.deadline.watch import WatchResult
    from skygreen.demo import DemoResult, DemoView
    from skygreen.launch.registry import RunRecord
    from skygreen.launch.runs import CancelResult, UpRequest, UpResult
    from skygreen.launch.smoke import SmokeResult
    from skygreen.launch.status import ResumePoint, RunStatus, UnknownJob
    from skygreen.launch.wiring import Wiring
    from skygreen.plan.catalog_update import CloudUpdate
    from skygreen.plan.rank import Plan


_REQUESTS = {"UpRequest": "skygreen.launch.runs", "SimulationRequest": "skygreen.deadline.compare"}
_LAZY = {**_REQUESTS, "task_schema": "skygreen.task.schema"}  # the task file's JSON Schema
"""The request records the commands take, importable from here (`api.UpRequest`) without
loading their modules until one is used: `plan` never does."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'skygreen.api' has no attribute {name!r}")


def plan(
    spec: TaskSpec | str | os.PathLike[str],
    *,
    catalog_dir: Path | None = None,
    measured_speed: Mapping[str, float] | None = None,
    measured_changeovers: MeasuredChangeovers | None = None,
    measured_checkpoint_gb: float | None = None,
) -> Plan:
    """Rank the GPU offers for a task, best first.

    Reads prices from a catalog on disk and imports neither sky nor torch, so planning stays
    fast and works offline.

    Args:
        spec: a parsed `TaskSpec`, or the task file's path.
        catalog_dir: a SkyPilot v8 catalog folder (`<cloud>/vms.csv`); None means
            `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own (`~/.sky/catalogs/v8`), else the
            embedded price table.
        measured_speed: relative speeds measured by earlier runs, which replace the built-in table.
        measured_changeovers: changeovers and restore rate measured by earlier runs, which
            replace the flat restart and transfer rate.
        measured_checkpoint_gb: the checkpoint size earlier runs committed, which replaces the
            estimate from `model:` (a LoRA run's adapter is megabytes).

    Returns:
        The ranked candidates, best first, with why the winner won and what was assumed.

    Raises:
        InputError: the task file is missing, or the catalog folder named has no catalog.
        SpecError: a bad task field or an unknown region.
        NoOfferError: no offer meets the task (the message says which constraint to relax).
        CatalogError: a catalog file cannot be read.
    """
    from skygreen.checkpoint.bucket_region import read_bucket_regions
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
        measured_checkpoint_gb=measured_checkpoint_gb,
        bucket_region=read_bucket_regions(spec.green.checkpoint.bucket),
    )


def plan_task(task_path: str | Path, *, catalog_dir: Path | None = None, deadline: str | None = None) -> Plan:
    """Plan a task file as `skygreen plan TASK` does, with what earlier runs of it measured.

    Args:
        task_path: the task file.
        catalog_dir: the catalog folder (see `plan`).
        deadline: a deadline (`36h`) in place of the file's `skygreen.deadline`.

    Returns:
        The plan.

    Raises:
        InputError: the task file is missing, or the catalog folder has no catalog.
        SpecError: a bad task field or `deadline`.
        NoOfferError: no offer meets the task.
        CatalogError: a catalog file cannot be read.
    """
    spec = load_task(task_path)
    if deadline is not None:
        from skygreen.task.spec import with_deadline

        spec = with_deadline(spec, deadline, "--deadline")
    return plan_learned(spec, catalog_dir=catalog_dir)


def plan_learned(spec: TaskSpec, *, catalog_dir: Path | None = None) -> Plan:
    """Plan with what earlier runs of the task's file measured.

    Speeds, changeovers and checkpoint size: `plan_task` and `up` plan alike. A task without a
    file has no history.

    Args:
        spec: the parsed task.
        catalog_dir: the catalog folder (see `plan`).

    Returns:
        The plan.
    """
    if spec.source is None:
        return plan(spec, catalog_dir=catalog_dir)
    from skygreen.costs.changeovers import measured_changeovers
    from skygreen.costs.speeds import measured_checkpoint_gb, measured_speeds

    return plan(
        spec,
        catalog_dir=catalog_dir,
        measured_speed={gpu: speed for gpu, (speed, _) in measured_speeds(spec, spec.source).items()},
        measured_changeovers=measured_changeovers(spec.source),
        measured_checkpoint_gb=measured_checkpoint_gb(spec.source),
    )


def show_store_retries() -> None:
    """Print each retry of a bucket call on stderr, as `SKYGREEN_DEBUG=1` does (else only a final error)."""
    from skygreen.checkpoint.store import show_retries

    show_retries()


def update_catalog(clouds: Iterable[str] = (), *, catalog_dir: Path | None = None) -> list[CloudUpdate]:
    """Download SkyPilot's current price catalog for `clouds`, through SkyPilot.

    Args:
        clouds: `aws`, `gcp`, `azure`; all when empty.
        catalog_dir: a folder that also receives a copy, for `--catalog` (else
            `$SKYGREEN_CATALOG_DIR`, when set).

    Returns:
        For each cloud, where its `vms.csv` is now and whether it was downloaded, kept or stale.

    Raises:
        SpecError: an unknown cloud.
    """
    from skygreen.plan.catalog import CLOUDS, resolve_catalog_dir
    from skygreen.plan.catalog_update import update_catalog as download
    from skygreen.task.readers import read_choice

    chosen = tuple(read_choice(c, "--cloud", CLOUDS) for c in clouds) or CLOUDS
    target, explicit = resolve_catalog_dir(catalog_dir)
    return download(chosen, catalog_dir=target if explicit else None)


def smoke(task_path: str | Path) -> SmokeResult:
    """Run the task's training script for two steps on CPU, with a checkpoint round trip.

    Minutes on a laptop catch what would otherwise fail on a paid GPU VM.

    Args:
        task_path: the task file.

    Returns:
        The runtime's result line, the script's wall time in seconds, and its output.

    Raises:
        InputError: the task file is missing or bad (`SpecError`).
        SmokeTestError: the task has no `run` command, or the script failed; the message names
            the step that broke (forward, backward, optimizer, save, load).
    """
    from skygreen.launch.smoke import run_smoke

    return run_smoke(task_path)


# ---------------------------------------------------------------- runs: up, status, resume, cancel, logs


def wiring(*, catalog_dir: Path | None = None, environ: Mapping[str, str] | None = None) -> Wiring:
    """Return the outside world of a run's life on this machine: the real catalog, stores, launchers.

    Built here, in the composition root, so the core never picks an adapter itself.

    Args:
        catalog_dir: the catalog folder plans read (see `plan`).
        environ: the process environment (default: `os.environ`).

    Returns:
        The wiring `skygreen.launch` takes.
    """
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.launch import launcher_factory
    from skygreen.launch.registry import Registry
    from skygreen.launch.wiring import Wiring

    env = os.environ if environ is None else environ
    return Wiring(
        registry=Registry(),
        environ=env,
        plan=lambda spec: plan_learned(spec, catalog_dir=catalog_dir),
        smoke=smoke,
        open_store=open_store,
        cloud_launcher=lambda: launcher_factory.cloud_launcher(env),
        local_launcher=lambda: launcher_factory.local_launcher(env),
    )


def up(request: UpRequest) -> UpResult:
    """Validate, plan, smoke-test, preflight the bucket, render the SkyPilot task and launch it.

    A managed spot job; `request.local` runs it on this machine. `request.dryrun` only writes
    the YAML (to `request.output`, else under the data dir). A deadline (`request.deadline`, `36h`; else the task's `skygreen.deadline`) holds the run
    to it: it starts on spot and a watcher started in the background (`request.watch`) moves it
    to on-demand and back as `request.policy` says (default: skygreen's own). `request.compute`
    (`20h`): the compute the run needs, when the plan's estimate (or, for a local run, the
    measured throughput) should not be used. `watch=False` starts no watcher: the caller runs
    `watch` where it can stay up.

    Args:
        request: what to launch and how (`skygreen.launch.runs.UpRequest`).

    Returns:
        The rendered YAML's path, the plan (cloud runs), the smoke test's result and the run's
        record (None for a dry run); `watcher_pid` when a deadline watcher was started.

    Raises:
        InputError: a bad task, flag or bucket (`SpecError` for fields; a cloud run without an
            `s3://` or `gs://` bucket).
        NoOfferError: no offer meets the task.
        SmokeTestError: the CPU smoke test failed.
        StoreError: the checkpoint bucket cannot be written (`BucketUnreachableError`,
            `NoCredentialsError`).
        LaunchError: SkyPilot (or the local launcher) refused the launch.
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
    """Hold a run launched with a deadline to it, moving it between spot and on-demand.

    Polls until the run ends, as its deadline policy says. A run already watched by another
    process returns at once (exit code 0).

    Args:
        run_id: the run, or a unique prefix of its id.
        poll: how often to look (`60s`).
        once: one poll, then return.
        say: where each decision is told (default: nowhere).

    Returns:
        How the watch ended: why, and the exit code the command returns.

    Raises:
        InputError: an unknown run id or a bad `poll` (`SpecError`), or a bad
            `SKYGREEN_TEST_SPOT_TRACE`.
    """
    from skygreen.deadline.clock import now_s
    from skygreen.deadline.watch import Watch
    from skygreen.task.readers import read_duration_s

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
    from skygreen.deadline.market import TRACE_ENV, TraceMarket, single_trace

    path = single_trace(environ)
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
    """Return the status of one run, or of every run on this machine (newest last).

    Args:
        run_id: the run, or a unique prefix of its id; None for every run.

    Returns:
        Each run's state: the launcher's view joined with the progress in its bucket (the
        latest checkpoint's step, launches, spend).

    Raises:
        InputError: an unknown run id.
    """
    from skygreen.launch.status import status as run_statuses

    return run_statuses(run_id, wiring=wiring())


def power_gpus() -> dict[str, Any]:
    """Return this machine's GPUs (real, or simulated with `SKYGREEN_SIMULATED_GPU`) and their caps.

    Returns:
        `{"gpus": [...], "reason": ...}` as `skygreen.power.caps.local_gpus` reads it; sets nothing.
    """
    from skygreen.power.caps import local_gpus
    from skygreen.power.nvml import Nvml

    return local_gpus(lambda: Nvml(environ=os.environ))


def resume(run_id: str, *, local: bool = False, budget_usd: float | None = None) -> RunRecord:
    """Relaunch a stopped run with the same run id; it continues from its last checkpoint.

    A run launched with a deadline is held to it again: its watcher starts unless one runs.

    Args:
        run_id: the run, or a unique prefix of its id.
        local: relaunch on this machine.
        budget_usd: a new budget (needed, and higher, for a run stopped at its budget).

    Returns:
        The run's record, with the new launch.

    Raises:
        InputError: an unknown run id; a run completed, still going, or being relaunched by
            another process; or, for a run stopped at its budget, no budget above the old one.
        StoreError: the run's bucket does not answer or refuses (checked before any launch).
        LaunchError: the launcher refused the relaunch.
    """
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
    """Return where a `resume` of the run would continue: its latest checkpoint's step, or step 0.

    Args:
        run_id: the run, or a unique prefix of its id.

    Returns:
        The latest checkpoint's step, or `from_scratch` with a note for the user.

    Raises:
        InputError: an unknown run id.
    """
    from skygreen.launch.status import resume_point as point

    w = wiring()
    return point(w.registry.load(run_id), wiring=w)


def cancel(run_id: str) -> CancelResult:
    """Stop a run; the runtime commits a checkpoint first, so `resume` can continue it.

    Args:
        run_id: the run, or a unique prefix of its id.

    Returns:
        What was done; `already_ended` when the run had ended and nothing changed.

    Raises:
        InputError: an unknown run id, or a run never launched.
    """
    from skygreen.launch import runs

    return runs.cancel(run_id, wiring=wiring())


def unknown_jobs() -> list[UnknownJob]:
    """Return the jobs still going that skygreen launched but no run record on this machine knows.

    Such jobs cost money with no `skygreen status` line to show them.

    Returns:
        The jobs, each with its name (`<run>-<launch>`), run id, launcher and state.
    """
    from skygreen.launch.status import unknown_jobs as find_unknown

    w = wiring()
    return find_unknown(w.registry.list(), wiring=w)


def cancel_unknown_jobs(name: str) -> list[UnknownJob]:
    """Stop the unknown jobs (`unknown_jobs`) named `name` or of run id `name`.

    Args:
        name: a job's name or run id.

    Returns:
        The jobs stopped.
    """
    from skygreen.launch import runs

    return runs.cancel_unknown_jobs(name, wiring=wiring())


def logs(run_id: str, *, follow: bool = False, out: TextIO | None = None) -> int | None:
    """Write a run's output to `out`; with `follow`, until the run ends.

    Args:
        run_id: the run, or a unique prefix of its id.
        follow: keep writing until the run ends.
        out: where to write (default: stdout).

    Returns:
        The job's exit code where the launcher knows it, else None.

    Raises:
        InputError: an unknown run id, or a run never launched.
    """
    from skygreen.launch import runs

    return runs.logs(run_id, follow=follow, out=out, wiring=wiring())


# ---------------------------------------------------------------- cost, compare


def cost_before_ledger(run_id: str) -> dict[str, Any]:
    """Return what is known of the spend of a run launched but not training yet (no ledger).

    Args:
        run_id: the run, or a unique prefix of its id.

    Returns:
        Its state, how long since its latest launch started, the time its launcher reports it
        has run (paid, from the VM's first second), and that time priced at the plan's offer
        (an estimate).

    Raises:
        InputError: an unknown run id.
    """
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
    """Return what a run cost, from its ledger; a local run also gets the task estimated on each cloud.

    Args:
        run_id: the run, or a unique prefix of its id.
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        The run's time, energy and spend, per VM and in total.

    Raises:
        InputError: an unknown run id.
        NoLedgerYetError: the run has not started training, so it has no ledger yet.
        StoreError: the ledger cannot be read.
    """
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing

    return costing.cost_of_run(run_id, open_store=open_store, catalog_dir=catalog_dir)


def team_spend(
    *, buckets: Iterable[str] = (), by: str | None = None, since: str | None = None, catalog_dir: Path | None = None
) -> TeamSpend:
    """Price every run this machine knows and every run in `buckets`, each once, from its ledger.

    Args:
        buckets: bucket URLs whose runs to include (a team's shared buckets).
        by: group by `task`, `cloud`, `gpu` or `user`; None for no grouping.
        since: keep the runs active in that window (`30d`); None for all.
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        The runs' spend, grouped.

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
    """Estimate a task's cost per run on each cloud, the plan's pick first.

    Args:
        task_path: the task file.
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        The estimates.

    Raises:
        InputError: the task file is missing or bad (`SpecError`).
        NoOfferError: no offer meets the task.
    """
    from skygreen.costs import costing

    return costing.estimate_task(task_path, catalog_dir=catalog_dir)


def is_task_file(target: str) -> bool:
    """Tell whether `skygreen cost TARGET` names a task file rather than a run id.

    Args:
        target: what the user typed.

    Returns:
        True for a name ending in `.yaml`/`.yml`, or an existing file.
    """
    return target.endswith((".yaml", ".yml")) or Path(target).is_file()


def compare(run_ids: list[str], *, catalog_dir: Path | None = None) -> Comparison:
    """Put runs side by side; those with no ledger yet are left out and named (`Comparison.waiting`).

    Args:
        run_ids: the runs, or unique prefixes of their ids.
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        The comparison.

    Raises:
        InputError: an unknown run id.
        StoreError: a ledger cannot be read.
    """
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.costs import costing

    return costing.compare_runs(run_ids, open_store=open_store, catalog_dir=catalog_dir)


def plot_runs(path: Path, run_ids: list[str], *, catalog_dir: Path | None = None) -> Path:
    """Draw the runs' cost figures to `path` (.png, or .html for one page); needs skygreen[report].

    Args:
        path: the file to write.
        run_ids: the runs.
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        `path`.

    Raises:
        InputError: an unknown run id or file type, or matplotlib is not installed.
        NoLedgerYetError: a run has no ledger yet.
        StoreError: a ledger cannot be read.
    """
    from skygreen.costs.page import write_plot

    write_plot(path, [run_cost(run_id, catalog_dir=catalog_dir) for run_id in run_ids])
    return path


def write_report(run_id: str, output: Path | None = None, *, catalog_dir: Path | None = None) -> Path:
    """Write one self-contained HTML page about a run.

    Args:
        run_id: the run, or a unique prefix of its id.
        output: the file (default: `<run_id>-report.html` in the current folder).
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        The page's path.

    Raises:
        InputError: an unknown run id, or matplotlib is not installed.
        NoLedgerYetError: the run has no ledger yet.
        StoreError: the ledger cannot be read.
    """
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
    """Replay a spot trace against deadline policies, as `skygreen simulate` does.

    Args:
        request: the trace, deadline, compute and policies; its durations are already read
            (`48h`, `90m`, or hours).

    Returns:
        What was simulated (the trace and its zones, the prices, the job) and each policy's result.

    Raises:
        SpecError: a bad flag or trace.
    """
    from skygreen.deadline import compare as deadline_compare

    return deadline_compare.run(request)


def simulate_places(trace: Path, **flags: Any) -> dict | None:
    """Every arm over a multi-region trace (`skygreen.places.simulate.from_flags`); None for another trace.

    Args:
        trace: the H100 archive or the V100 `processed` folder.
        **flags: `skygreen simulate`'s flags as typed.
    """
    from skygreen.places.simulate import from_flags

    return from_flags(trace, **flags)


# ---------------------------------------------------------------- demo


def demo(
    view: DemoView,
    *,
    folder: Path | None = None,
    gpu: str | None = None,
    steps: int | None = None,
    catalog_dir: Path | None = None,
) -> DemoResult:
    """Run `tasks/tiny.yaml` through every stage on this machine (`skygreen.demo.run_demo`).

    Plan, smoke test, training on a simulated GPU, a SIGKILL preemption and the resume,
    energy, cost, plot and report, all under `folder`.

    Args:
        view: where the demo tells its progress (`skygreen.demo_view`).
        folder: where everything goes (default: the demo's own).
        gpu: the simulated GPU (default: the demo's).
        steps: training steps (default: the demo's).
        catalog_dir: the catalog folder prices come from (see `plan`).

    Returns:
        The demo's result (`skygreen.demo.DemoResult`).

    Raises:
        SkygreenError: a stage failed; the message names it.
    """
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

    The latest, best and pinned checkpoints never move: a resume needs the one, a user the other.

    Args:
        target: a run id (resolved through the run registry), a run's checkpoint URL, or a
            bucket URL holding runs.
        older_than: the age (`90d`).
        storage_class: the cloud's cold class (default: skygreen's per cloud; upper-cased).
        act: move them; False only lists what would move.

    Returns:
        The moves, done when `act`, else only planned (none for a local folder).

    Raises:
        InputError: an unknown run id, a storage class that is not cold on that cloud, or a
            bad age (`SpecError`).
        StoreError: the bucket cannot be read.
    """
    from skygreen.checkpoint import gc as cold
    from skygreen.checkpoint.store_factory import open_store
    from skygreen.launch.bucket import check_readable
    from skygreen.launch.registry import checkpoint_target

    return cold.gc(
        checkpoint_target(target),
        open_store=open_store,
        older_than=older_than,
        storage_class=storage_class,
        act=act,
        now_s=time.time(),
        check_bucket=lambda url: check_readable(open_store, url),
    )
