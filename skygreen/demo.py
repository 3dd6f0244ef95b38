"""`skygreen demo`: every stage of skygreen on this machine, with no cloud account.

It runs the shipped `tasks/tiny.yaml` through the same public functions as the commands
(`skygreen.api`): the plan across AWS, GCP and Azure from the price catalog, the CPU smoke test,
a local run on a simulated GPU (`SKYGREEN_SIMULATED_GPU`: training runs on the CPU, the power
cap and the energy counter are the simulated board's), a preemption (the training process
group killed with SIGKILL once a checkpoint has committed), the automatic resume, the energy
statement, and the cost report with its plot and HTML page.

The kill never races the run: the runtime is held at `kill_at_step` after committing its
checkpoint there (`skygreen.runtime.hold`, released by a file once the run is killed), so
the demo kills a run whose progress it knows, on a loaded machine too.

Everything (run registry, checkpoints, logs, simulated GPU state, plot, report) lives under
one folder: `SKYGREEN_DATA_DIR` points there while the demo runs. Presentation is the
caller's: stages and lines go to a `DemoView` (`skygreen.demo_view` draws a progress bar).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from skygreen.errors import InputError, LaunchError

SIMULATED_GPU = "T4"
"""The board the demo simulates: the cheapest of tiny's GPUs in the plan."""
STEPS = 300
"""`TINY_STEPS` for the demo: half of tiny's default, so the demo takes about a minute."""
KILL_AT_STEP = 150
EVAL_EVERY = 10
"""`TINY_EVAL_EVERY` for the demo: an evaluation every 10 steps, so early stopping can fire."""
DEMO_MIN_DELTA = "min_delta: 0.01"
"""The demo's early-stopping threshold: tiny's own 0.001 rarely fires within 300 steps."""
POLL_S = 0.3
WAIT_S = 600.0
"""Longest wait for one stage of the run (a checkpoint, the kill, the end) before failing."""

STAGES = ("plan", "smoke test", "training", "preemption", "resume", "energy", "cost", "report")


class DemoView(Protocol):
    """Where the demo reports: a stage starting, progress inside it, a line of output."""

    def stage(self, name: str) -> None:
        """Show that the stage `name` (one of `STAGES`, in order) has begun."""
        ...

    def progress(self, done: int, total: int) -> None:
        """Show the run at step `done` (its latest committed checkpoint's, 0 before the first) of
        `total`; called on every poll."""
        ...

    def line(self, text: str) -> None:
        """Show one line of output; `text` carries no newline of its own."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class DemoResult:
    """What the demo did and where it left everything, for `demo_view.print_summary`."""

    run_id: str
    folder: Path
    """The demo's data folder (`SKYGREEN_DATA_DIR` during the demo)."""
    checkpoints: str
    """The run's checkpoint folder (its local bucket)."""
    logs: tuple[Path, ...]
    """Each launch's output log."""
    plot: Path | None
    """The cost plot; None when matplotlib is missing (`plot_hint` says what to install)."""
    plot_hint: str | None
    report: Path | None
    state: str
    early_stopped: bool
    final_step: int | None
    recoveries: int
    preemptions: int
    duration_s: float


def default_folder() -> Path:
    """`demo/` in skygreen's data folder (`registry.data_dir`): the demo's folder when none is given."""
    from skygreen.launch.registry import data_dir

    return data_dir() / "demo"


def tiny_task() -> Path:
    """`tasks/tiny.yaml` of the checkout skygreen runs from."""
    path = Path(__file__).resolve().parents[1] / "tasks" / "tiny.yaml"
    if not path.is_file():
        raise InputError(
            f"the demo's task {path} is missing\n"
            "  fix: run the demo from a clone of the skygreen repository (it ships tasks/tiny.yaml)"
        )
    return path


def demo_task(folder: Path) -> Path:
    """`tasks/tiny.yaml` with a coarser early-stopping threshold, written into the demo's folder.

    The demo shows early stopping firing (after the resume, from state the checkpoint carried),
    which tiny's own `min_delta: 0.001` rarely does in 300 steps. `workdir:` points back at
    `tasks/`, where the training script is."""
    source = tiny_task()
    text = source.read_text()
    if "min_delta: 0.001" not in text:
        raise LaunchError(f"{source}: no `min_delta: 0.001` to coarsen for the demo\n  fix: update skygreen.demo")
    path = folder / "tiny-demo.yaml"
    path.write_text(f"workdir: {source.parent}\n" + text.replace("min_delta: 0.001", DEMO_MIN_DELTA))
    return path


def run_demo(
    view: DemoView,
    api: Any,
    *,
    folder: Path | None = None,
    gpu: str = SIMULATED_GPU,
    steps: int = STEPS,
    kill_at_step: int = KILL_AT_STEP,
    catalog_dir: Path | None = None,
) -> DemoResult:
    """Run every stage on `tasks/tiny.yaml`; raises a `SkygreenError` naming the stage that failed.

    `api` is `skygreen.api` (passed in by `skygreen.api.demo`): the demo drives the same public
    functions as the commands, and this module imports nothing that imports it back."""
    if not 0 < kill_at_step < steps:
        raise InputError(
            f"--steps: {steps} leaves no room for the preemption at step {kill_at_step}\n  fix: --steps 300"
        )
    from skygreen.gpus import GPU_NAMES, canonical_gpu_name

    board = canonical_gpu_name(gpu)
    if board is None:
        from skygreen.errors import SpecError, suggestion

        raise SpecError("--gpu", "not a GPU skygreen can simulate", value=gpu, allowed=", ".join(GPU_NAMES),
                        hint=suggestion(gpu, GPU_NAMES) or "e.g. --gpu T4 or --gpu L4")  # fmt: skip
    gpu = board
    started = time.monotonic()
    folder = (folder or default_folder()).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    release = folder / "hold-release"
    release.mkdir(exist_ok=True)
    (release / str(kill_at_step)).unlink(missing_ok=True)
    from skygreen.power.simulated import SIMULATED_GPU_ENV
    from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

    env = {
        "SKYGREEN_DATA_DIR": str(folder),
        SIMULATED_GPU_ENV: gpu,
        "TINY_STEPS": str(steps),
        "TINY_EVAL_EVERY": str(EVAL_EVERY),
        HOLD_ENV: str(kill_at_step),
        RELEASE_ENV: str(release),
    }
    task = demo_task(folder)
    with _environment(env):
        _show_plan(view, api, task, catalog_dir)
        _smoke(view, api, task)
        launched: list[str] = []
        try:
            run_id = _train_until_killed(
                view, api, task, steps=steps, kill_at_step=kill_at_step, release=release, launched=launched
            )
            status = _resume(view, api, run_id, steps=steps)
        except BaseException:  # Ctrl-C or a failure: leave no training process held at its step
            for started_run in launched:
                with contextlib.suppress(Exception):
                    api.cancel(started_run)
            raise
        _energy(view, status)
        report, early_stopped, plot, hint = _cost(view, api, run_id, folder, steps=steps, catalog_dir=catalog_dir)
        page = _report(view, api, run_id, folder, catalog_dir, plot_hint=hint)
        record = _record(run_id)
        logs = tuple(Path(folder) / "local-jobs" / launch.job_id / "output.log" for launch in record.launches)
        (final,) = api.status(run_id)
    return DemoResult(
        run_id=run_id,
        folder=folder,
        checkpoints=final.checkpoint_url,
        logs=tuple(p for p in logs if p.exists()) or logs,
        plot=plot,
        plot_hint=hint,
        report=page,
        state=final.state,
        early_stopped=early_stopped,
        final_step=final.step,
        recoveries=final.recoveries,
        preemptions=report.cost.preemptions,
        duration_s=time.monotonic() - started,
    )


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """`env` set in this process (the api and the local launcher read it), restored after."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---------------------------------------------------------------- stages


def _show_plan(view: DemoView, api: Any, task: Path, catalog_dir: Path | None) -> None:
    from skygreen.task.checks import load_task

    view.stage("plan")
    plan = api.plan(load_task(task), catalog_dir=catalog_dir)
    view.line(f"plan: {len(plan.candidates)} offers for {task.name}; prices from {catalog_label(plan.catalog_source)}")
    best: dict[str, Any] = {}
    for c in plan.candidates:
        best.setdefault(c.cloud, c)
    for cloud in ("aws", "gcp", "azure"):
        offer = best.get(cloud)
        if offer is None:
            view.line(f"  {cloud:<5}  no offer for {', '.join(plan_gpus(task))}")
            continue
        view.line(
            f"  {cloud:<5}  {offer.accelerator}x{offer.accelerator_count} {offer.instance_type} in {offer.region}, "
            f"{'spot' if offer.spot else 'on-demand'} ${offer.price_usd_per_hour:.4f}/h: "
            f"${offer.est_cost_usd:.4f} per run"
        )
    if plan.candidates:
        pick = plan.candidates[0]
        view.line(f"  pick: {pick.cloud} {pick.region} {pick.instance_type} ({pick.accelerator})")


def catalog_label(source: str) -> str:
    """The catalog's source with its date: the embedded table names its own; a catalog folder
    is dated by its files."""
    if "(" in source:
        return source
    files = list(Path(source).glob("*/vms.csv"))
    if not files:
        return source
    newest = max(f.stat().st_mtime for f in files)
    return f"{source} (files dated {time.strftime('%Y-%m-%d', time.gmtime(newest))})"


def plan_gpus(task: Path) -> tuple[str, ...]:
    """The GPUs the task names, or `("any GPU",)` when it names none, for the plan's "no offer" line."""
    from skygreen.task.checks import load_task

    return load_task(task).green.gpus.names or ("any GPU",)


def _smoke(view: DemoView, api: Any, task: Path) -> None:
    view.stage("smoke test")
    result = api.smoke(task)
    view.line(f"smoke test: {result.line} ({result.duration_s:.1f} s, two steps on CPU with a checkpoint round trip)")


def _train_until_killed(
    view: DemoView, api: Any, task: Path, *, steps: int, kill_at_step: int, release: Path, launched: list[str]
) -> str:
    """Launch the run, wait for its checkpoint at the held step, and SIGKILL its process group.
    `launched` gets the run id at once, so a caller can stop the run if anything fails later."""
    view.stage("training")
    result = api.up(api.UpRequest(task_path=task, local=True, smoke=False))
    run_id = result.run_id
    launched.append(run_id)
    gpu = os.environ.get("SKYGREEN_SIMULATED_GPU", SIMULATED_GPU)
    view.line(f"training: run {run_id} on this machine, on a simulated {gpu} (training on the CPU), {steps} steps")
    _wait(
        view,
        api,
        run_id,
        until=lambda s: s.step == kill_at_step,
        total=steps,
        what=f"a checkpoint at step {kill_at_step}",
    )
    view.stage("preemption")
    record = _record(run_id)
    pid = record.launches[-1].pid
    if pid is None:
        raise LaunchError(f"run {run_id}: its launch has no process id to kill")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)  # what losing a spot VM does to the process: no warning, no cleanup
    (release / str(kill_at_step)).touch()  # the next launch passes the step it starts at
    stopped = _wait(view, api, run_id, until=lambda s: s.state == "STOPPED", total=steps, what="the killed run to stop")
    view.line(
        f"preemption: killed the training process group with SIGKILL at step {stopped.step} "
        f"(its last committed checkpoint); the run reads {stopped.state}"
    )
    return run_id


def _resume(view: DemoView, api: Any, run_id: str, *, steps: int) -> Any:
    view.stage("resume")
    record = api.resume(run_id, local=True)
    view.line(f"resume: run {run_id} relaunched (launch {len(record.launches)}), continuing from its checkpoint")
    final = _wait(view, api, run_id, until=lambda s: _terminal(s.state), total=steps, what="the resumed run to end")
    view.line(
        f"resume: run {run_id} ended {final.state} at step {final.step}; "
        f"{final.recoveries} recovery, {final.launches} launches"
    )
    if final.state != "SUCCEEDED":
        raise LaunchError(f"run {run_id} ended {final.state}: {final.detail or 'see its log'}")
    return final


def _energy(view: DemoView, status: Any) -> None:
    from skygreen.launch.report import print_statement

    view.stage("energy")
    text = io.StringIO()
    print_statement(status, text)
    view.line(text.getvalue().strip())


def _cost(view: DemoView, api: Any, run_id: str, folder: Path, *, steps: int, catalog_dir: Path | None):
    from skygreen.costs.report import print_run_cost

    view.stage("cost")
    report = api.run_cost(run_id, catalog_dir=catalog_dir)
    early = any(s.end == "early-stopped" for s in report.segments)
    if early:
        view.line(f"early stopping: fired at step {report.cost.steps} of {steps} (val_loss stopped improving)")
    else:
        view.line(
            f"early stopping: did not fire (val_loss improved within its patience) by step {report.cost.steps} of {steps}"
        )
    text = io.StringIO()
    print_run_cost(report, text)
    for line in text.getvalue().splitlines():
        view.line(line)
    plot: Path | None = folder / f"{run_id}-cost.png"
    hint = _matplotlib_missing()
    if hint is None:
        assert plot is not None
        api.plot_runs(plot, [run_id], catalog_dir=catalog_dir)
        view.line(f"plot: {plot}")
    else:
        plot = None
        view.line(hint)
    return report, early, plot, hint


def _report(
    view: DemoView, api: Any, run_id: str, folder: Path, catalog_dir: Path | None, *, plot_hint: str | None
) -> Path | None:
    view.stage("report")
    if plot_hint is not None:
        view.line("report: skipped (the HTML page draws its figure with matplotlib)")
        return None
    path = api.write_report(run_id, folder / f"{run_id}-report.html", catalog_dir=catalog_dir)
    view.line(f"report: {path}")
    return path


def _matplotlib_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "plot: matplotlib is not installed; pip install 'skygreen[report]' for the plot and the HTML report"
    return None


# ---------------------------------------------------------------- helpers


def _terminal(state: str) -> bool:
    return state in ("SUCCEEDED", "FAILED", "STOPPED", "CANCELLED", "BUDGET")


def _record(run_id: str):
    from skygreen.launch.registry import Registry

    return Registry().load(run_id)


def _wait(view: DemoView, api: Any, run_id: str, *, until, total: int, what: str):
    """Poll the run's status until `until(status)`, showing its step; fail if it ends first."""
    deadline = time.monotonic() + WAIT_S
    while True:
        (status,) = api.status(run_id)
        view.progress(status.step or 0, total)
        if until(status):
            return status
        if _terminal(status.state):
            raise LaunchError(
                f"run {run_id} ended {status.state} before {what}: {status.detail or ''}\n"
                f"  fix: see its log (skygreen logs {run_id}, with SKYGREEN_DATA_DIR set to the demo folder)"
            )
        if time.monotonic() > deadline:
            raise LaunchError(f"run {run_id}: waited {WAIT_S:.0f} s for {what}, in vain")
        time.sleep(POLL_S)
