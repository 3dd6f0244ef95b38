"""A run's life on the user's machine: up, resume, cancel, logs (`status` is `skygreen.launch.status`).

The order that keeps every failure cheap: nothing is launched until the task validated,
planned, passed its smoke test and its bucket took a test write. What touches the outside
world (the planner over a catalog, the smoke test, stores, launchers, the registry) comes in
through `Wiring`, built by the composition root `skygreen.api`; this module imports no
adapter. The CLI prints what `skygreen.api` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import msgspec
import yaml

from skygreen.checkpoint.bucket_set import SET_SCHEME
from skygreen.checkpoint.cancellation import clear_cancel, request_cancel
from skygreen.checkpoint.interval import preemption_rate_per_hour
from skygreen.checkpoint.lease import LAUNCH_ENV
from skygreen.checkpoint.store import Store
from skygreen.deadline.capacity import with_capacity
from skygreen.deadline.clock import now_s
from skygreen.deadline.policy import POLICIES
from skygreen.deadline.terms import DeadlineAsk, deadline_ask, deadline_terms
from skygreen.deadline.watch_state import clear_user_cancel, mark_user_cancel, switching_to_spot
from skygreen.errors import (
    BucketUnreachableError,
    InputError,
    NoCredentialsError,
    SkygreenError,
    SpecError,
    StoreError,
)
from skygreen.files import write_atomic
from skygreen.launch.bucket import check_writable, within_deadline
from skygreen.launch.launcher import JobState, Launcher, launch_name
from skygreen.launch.registry import (
    Registry,
    RunRecord,
    data_dir,
    default_local_bucket,
    launching_user,
    new_run_id,
)
from skygreen.launch.render import RuntimeInstall, declared_secrets, render_task, secret_values, to_yaml
from skygreen.launch.status import (
    BUDGET_STATE,
    RunStatus,
    UnknownJob,
    adopt_pending,
    run_state,
    run_status,
    unknown_jobs,
)
from skygreen.launch.wiring import CLOUD, LOCAL, Wiring, launcher_for
from skygreen.task.checks import load_task
from skygreen.task.declare import Record
from skygreen.task.settings import RuntimeSettings
from skygreen.task.spec import TaskSpec, with_deadline
from skygreen.timestamps import utc_now_iso

if TYPE_CHECKING:
    from skygreen.launch.smoke import SmokeResult
    from skygreen.plan.rank import Plan

BUDGET_ENV = "SKYGREEN_BUDGET_USD"


@dataclass(frozen=True, kw_only=True, slots=True)
class UpRequest:
    """What `skygreen up` is asked, as typed: the CLI builds one from its flags, `api.up` takes
    it, and `up` below reads it. Durations stay as written (`36h`); they are read, and bad
    ones refused naming the flag, when the record is made."""

    task_path: Path
    local: bool = False
    dryrun: bool = False
    output: Path | None = None
    """Also write the rendered SkyPilot YAML here."""
    smoke: bool = True
    deadline: str | None = None
    """`--deadline`: finish within this time; None: the task's `skygreen.deadline`, if any."""
    compute: str | None = None
    """`--compute`: the compute time the run needs; None: the plan's estimate."""
    policy: str | None = None
    """`--policy`: the deadline switching policy; None: skygreen's own."""
    watch: bool = True
    """Start the deadline watcher in the background (False: `--no-watch`)."""
    catalog_dir: Path | None = None
    deadline_h: float | None = field(init=False, default=None)
    compute_h: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        from skygreen.task.readers import read_duration_h

        object.__setattr__(self, "task_path", Path(self.task_path))
        if self.output is not None:
            object.__setattr__(self, "output", Path(self.output))
        if self.deadline is not None:
            object.__setattr__(self, "deadline_h", read_duration_h(self.deadline, "--deadline"))
        if self.compute is not None:
            object.__setattr__(self, "compute_h", read_duration_h(self.compute, "--compute"))
        if self.policy is not None and self.policy not in POLICIES:
            raise SpecError(
                "--policy", "unknown policy", value=self.policy, allowed=", ".join(POLICIES), hint="or leave it out"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class UpResult:
    """What `up` did: the rendered YAML, the plan, and (unless a dry run) the launched run."""

    yaml_path: Path
    run_id: str
    plan: Plan | None
    """The ranked offers for cloud runs; None for local ones."""
    record: RunRecord | None
    """None for a dry run: nothing was launched or recorded."""
    smoke: SmokeResult | None = None
    """The smoke test's result; None with `--no-smoke`."""
    bucket: str | None = None
    bucket_unchecked: str | None = None
    """A dry run that could not check the bucket from this machine says why (no credentials)."""
    notices: tuple[str, ...] = ()
    """One-line remarks for the user: the plan's (which include the task file's), or for a
    local run, the task file's own (a deprecated key)."""
    watcher_pid: int | None = None
    """With a deadline: the background `skygreen watch` started for the run."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelResult:
    """What `cancel` found and did."""

    status: RunStatus
    already_ended: bool
    """The run had ended before the cancel: nothing was signalled or changed."""


# ---------------------------------------------------------------- up


def up(request: UpRequest, *, deadline: DeadlineAsk | None = None, wiring: Wiring) -> UpResult:
    """Validate, plan, smoke-test, preflight the bucket, render and launch one run.

    With a deadline (`deadline`, else the task's `skygreen.deadline`) the plan keeps only the
    offers that can finish in time, the run starts on spot, and its record carries the terms a
    deadline watcher (`skygreen.deadline.watch`) holds it to.

    The run's id is claimed first (its folder made, `Registry.claim_run_id`), so runs started
    at the same moment never share one; the folder is given back when `up` fails before
    writing anything into it.
    """
    spec = load_task(request.task_path)
    if request.dryrun:
        return _up(request, spec, new_run_id(spec.name), deadline=deadline, wiring=wiring)
    run_id = wiring.registry.claim_run_id(spec.name)
    try:
        return _up(request, spec, run_id, deadline=deadline, wiring=wiring)
    except BaseException:
        wiring.registry.release_unused(run_id)
        raise


def _up(request: UpRequest, spec: TaskSpec, run_id: str, *, deadline: DeadlineAsk | None, wiring: Wiring) -> UpResult:
    environ, registry = wiring.environ, wiring.registry
    task_path, local, dryrun, output, smoke = (
        request.task_path, request.local, request.dryrun, request.output, request.smoke
    )  # fmt: skip
    bucket = _bucket(spec, local=local, environ=environ)
    deadline = deadline_ask(spec, deadline)
    if deadline is not None:
        spec = with_deadline(spec, deadline.deadline_h, "--deadline")
    plan = None if local else wiring.plan(spec)
    terms = None if deadline is None else deadline_terms(spec, plan, deadline)
    user = launching_user(environ)
    task = _render(spec, plan, run_id=run_id, bucket=bucket, task_dir=task_path.resolve().parent, user=user)
    summary = _plan_summary(spec, plan)
    if terms is not None:  # on spot, its offers priced as spot, as a watcher's relaunch on spot has them
        task = with_capacity(task, spot=True, offers=(summary or {}).get("offers") or ())
    yaml_text = to_yaml(task)
    smoke_result = wiring.smoke(task_path) if smoke else None
    if dryrun:  # every check `up` makes, then the YAML; only the launch is left out
        unchecked = _preflight_unless_no_credentials(wiring, bucket, run_id)
        path = Path(output) if output else data_dir(environ) / "dryrun" / f"{run_id}.yaml"
        write_atomic(path, yaml_text)
        return UpResult(yaml_path=path, run_id=run_id, plan=plan, record=None, smoke=smoke_result,
                        bucket=bucket, bucket_unchecked=unchecked, notices=_notices(spec, plan))  # fmt: skip
    preflight_bucket(wiring, bucket, run_id)
    launcher = wiring.local_launcher() if local else wiring.cloud_launcher()
    yaml_path = registry.run_dir(run_id) / "task.yaml"
    write_atomic(yaml_path, yaml_text)
    if output:
        write_atomic(Path(output), yaml_text)
    record = RunRecord(
        run_id=run_id,
        task_path=str(task_path.resolve()),
        task_name=spec.name,
        mode=LOCAL if local else CLOUD,
        launcher=launcher.kind,
        bucket=bucket,
        task_yaml=str(yaml_path),
        spec_snapshot=_snapshot(spec),
        created_at=utc_now_iso(),
        state="CREATED",
        plan_summary=summary,
        secret_names=declared_secrets(spec),
        deadline=None if terms is None else terms.to_json(),
        user=user,
    )
    record = registry.save(record)
    spot = None if terms is None else True
    record = _launch(registry, record, launcher, task, secret_values(spec, environ), spot=spot, environ=environ)
    return UpResult(
        yaml_path=yaml_path, run_id=run_id, plan=plan, record=record, smoke=smoke_result, notices=_notices(spec, plan)
    )


def _notices(spec: TaskSpec, plan: Plan | None) -> tuple[str, ...]:
    return tuple(plan.notices) if plan is not None else spec.notices


def _bucket(spec: TaskSpec, *, local: bool, environ: Mapping[str, str]) -> str:
    """The run's base checkpoint URL. Cloud runs need a bucket the VM can reach."""
    bucket = spec.green.checkpoint.bucket
    if bucket is None:
        if not local:
            raise InputError(
                "skygreen.checkpoint.bucket: a cloud run needs a checkpoint bucket its VMs can reach\n"
                "  fix: set skygreen.checkpoint.bucket: s3://BUCKET/PREFIX (or gs://...), or run here with --local"
            )
        return str(default_local_bucket(environ))
    if not local and not bucket.startswith(("s3://", "gs://", "az://", f"{SET_SCHEME}://")):
        raise InputError(
            f"skygreen.checkpoint.bucket: {bucket!r} is a path on this machine, which cloud VMs cannot reach\n"
            "  fix: use s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://ACCOUNT/CONTAINER/PREFIX, or run here with --local"
        )
    if bucket.startswith("file://"):
        return str(Path(bucket[len("file://") :]).expanduser())
    if "://" not in bucket:
        return str(Path(bucket).expanduser().resolve())
    return bucket


def _render(
    spec: TaskSpec, plan: Plan | None, *, run_id: str, bucket: str, task_dir: Path, user: str | None = None
) -> dict[str, Any]:
    from skygreen.plan.memory import planned_memory

    rates = offers = None
    gpus = spec.green.gpu_count * spec.num_nodes
    if plan is not None:  # the planner's assumption for every cloud among the offers handed over
        from skygreen.ledger.place import offers_env

        handed_over = plan.candidates[: spec.green.max_candidates]
        overrides = spec.green.preemption.rate_per_hour
        clouds = sorted({c.cloud for c in handed_over})
        rates = {cloud: rate for cloud in clouds if (rate := preemption_rate_per_hour(cloud, overrides)) is not None}
        offers = offers_env(handed_over)  # prices for the VM's ledger
        gpus = handed_over[0].accelerator_count * handed_over[0].num_nodes
    memory = planned_memory(spec.green.model, precision=spec.green.precision, total_gpus=gpus)
    settings = RuntimeSettings.from_spec(
        spec.green, run_id=run_id, bucket=bucket, preemptions_per_hour_by_cloud=rates or None, offers=offers, user=user,
        memory_planned_gb=memory,
    )  # fmt: skip
    return render_task(spec, plan, settings=settings, task_dir=task_dir, install=runtime_install())


def runtime_install() -> RuntimeInstall:
    """How the VM installs skygreen: from this source checkout when skygreen runs from one
    (its folder is mounted to the VM), else the released package of the same version."""
    project = Path(__file__).resolve().parents[2]
    if (project / "pyproject.toml").is_file() and (project / "skygreen" / "__init__.py").is_file():
        return RuntimeInstall(source_dir=str(project))
    return RuntimeInstall.default()


def preflight_bucket(wiring: Wiring, bucket: str, run_id: str) -> None:
    """Write, read back and delete one small object under the run's prefix, so a missing
    bucket, a missing permission or a bucket that does not answer stops `up` before any VM
    starts (within `skygreen.launch.bucket.DEADLINE_S`)."""
    try:
        check_writable(wiring.open_store, bucket, run_id)
    except BucketUnreachableError:
        raise
    except StoreError as e:
        said = str(e)
        fix = (
            ""  # the store's own error says what to do, for its cloud; one fix line, not two
            if "\n  fix:" in said
            else "\n  fix: create the bucket (or folder) and grant this machine and the VMs write access, "
            "or set another skygreen.checkpoint.bucket"
        )
        raise type(e)(f"checkpoint bucket {bucket} is not usable: {said}{fix}") from e


def _preflight_unless_no_credentials(wiring: Wiring, bucket: str, run_id: str) -> str | None:
    """The bucket preflight of a dry run. A laptop without the cloud's credentials cannot
    check a bucket only the VMs can write: that is not a failure, and the reason is returned."""
    try:
        preflight_bucket(wiring, bucket, run_id)
    except NoCredentialsError as e:
        return str(e.__cause__ or e).splitlines()[0].partition(": ")[2] or "no credentials on this machine"
    return None


def _launch(
    registry: Registry,
    record: RunRecord,
    launcher: Launcher,
    task: Mapping[str, Any],
    secrets: Mapping[str, str],
    *,
    spot: bool | None = None,
    environ: Mapping[str, str],
) -> RunRecord:
    """Launch the run's next life: its job is named for the run and the launch number, and the
    number travels to the runtime (`SKYGREEN_LAUNCH`, its writer lease). The record says a launch
    is under way before the launcher is called, so a command killed inside the call leaves a
    record that `status` reconciles with the launcher's jobs."""
    number = len(record.launches) + 1
    task = {**task, "envs": {**(task.get("envs") or {}), LAUNCH_ENV: str(number)}}
    started_at_s = now_s(environ)
    record = registry.save(dataclasses.replace(record, pending_launch=number, pending_at_s=started_at_s))
    try:
        job_id = launcher.launch(task, name=launch_name(record.run_id, number), secrets=secrets)
    except SkygreenError:
        registry.save(dataclasses.replace(record, state="LAUNCH_FAILED", pending_launch=None, pending_at_s=None))
        raise
    pid = launcher.pid(job_id) if hasattr(launcher, "pid") else None
    launched = record.with_launch(job_id, pid=pid, state=JobState.PENDING.value, spot=spot, started_at_s=started_at_s)
    return registry.save(launched)


# ---------------------------------------------------------------- resume, cancel, logs


def resume(
    run_id: str, *, local: bool = False, budget_usd: float | None = None, spot: bool | None = None, wiring: Wiring
) -> RunRecord:
    """Relaunch a stopped run with the same run id: the runtime continues from the latest
    checkpoint in its bucket. `local` runs it on this machine whatever it ran on before.
    `budget_usd` sets a new budget (a run stopped at its budget needs a higher one). `spot`
    relaunches it on spot (True) or on-demand (False): a deadline watcher's switch. One relaunch
    of a run at a time: another one under way is an `InputError`."""
    run_id = wiring.registry.load(run_id).run_id
    with wiring.registry.relaunching(run_id) as mine:
        if not mine:
            raise InputError(
                f"run {run_id} is being relaunched right now (by its deadline watcher, or another `skygreen resume`)\n"
                f"  fix: `skygreen status {run_id}` in a moment shows where it runs"
            )
        return _resume(run_id, local=local, budget_usd=budget_usd, spot=spot, wiring=wiring)


def _resume(run_id: str, *, local: bool, budget_usd: float | None, spot: bool | None, wiring: Wiring) -> RunRecord:
    environ, registry = wiring.environ, wiring.registry
    record = adopt_pending(registry.load(run_id), wiring)
    _check_bucket_before_resume(record, wiring)
    current = run_state(record, wiring=wiring)
    if current.completed and current.manifest is not None:
        raise InputError(
            f"run {run_id} finished (SUCCEEDED): its final checkpoint, step {current.manifest.step}, is committed, "
            "so there is nothing to resume\n  fix: start a new run with `skygreen up`"
        )
    if current.state == JobState.SUCCEEDED.value:
        raise InputError(
            f"run {run_id} finished (SUCCEEDED); there is nothing to resume\n  fix: start a new run with `skygreen up`"
        )
    at_budget = current.state == BUDGET_STATE.upper()
    if at_budget:
        _check_new_budget(record, budget_usd)
    stopped = at_budget or (current.state in JobState.__members__ and JobState(current.state).resumable)
    if record.launches and not stopped:
        raise InputError(
            f"run {run_id} is {current.state}; only a stopped run can be resumed\n"
            f"  fix: wait for it, or `skygreen cancel {run_id}` first"
        )
    to_local = local or record.mode == LOCAL
    if to_local == (record.mode == LOCAL):
        task = _read_task_yaml(record)
    else:  # a cloud run continued here: the same run id and bucket, rendered for this machine
        spec = load_task(record.task_path)
        where = Path(record.task_path).parent
        task = _render(spec, None, run_id=record.run_id, bucket=record.bucket, task_dir=where, user=record.user)
    if budget_usd is not None:
        task.setdefault("envs", {})[BUDGET_ENV] = f"{budget_usd:g}"
    if spot is None:  # the user's resume in the middle of a watcher's switch finishes that switch
        spot = switching_to_spot(registry.run_dir(run_id), record.job_id)
    if spot is not None:
        task = with_capacity(task, spot=spot, offers=(record.plan_summary or {}).get("offers") or ())
    if budget_usd is not None or spot is not None:
        write_atomic(Path(record.task_yaml), to_yaml(task))
    launcher = wiring.local_launcher() if to_local else launcher_for(record, wiring)
    record = dataclasses.replace(record, mode=LOCAL if to_local else record.mode, launcher=launcher.kind)
    _clear_cancel(record, wiring)
    if spot is None and record.launches:  # a plain resume keeps the capacity a watcher chose last
        spot = record.launches[-1].spot
    return _launch(registry, record, launcher, task, _resume_secrets(record, environ), spot=spot, environ=environ)


def _check_new_budget(record: RunRecord, budget_usd: float | None) -> None:
    old = (_read_task_yaml(record).get("envs") or {}).get(BUDGET_ENV)
    if budget_usd is None or (old is not None and budget_usd <= float(old)):
        given = "" if budget_usd is None else f" ({budget_usd:g} is not more than {old})"
        raise InputError(
            f"run {record.run_id} stopped at its budget of ${old}{given}\n"
            f"  fix: `skygreen resume {record.run_id} --budget-usd N` with N above {old}"
        )


def _check_bucket_before_resume(record: RunRecord, wiring: Wiring) -> None:
    """Before any process starts: a bucket that does not answer, or refuses, fails here in one
    line. A laptop without the cloud's credentials cannot look into a bucket that only the
    run's VMs can write; that is no reason to refuse the relaunch, so the check is skipped."""
    try:
        check_writable(wiring.open_store, record.bucket, record.run_id)
    except NoCredentialsError:
        if record.mode == LOCAL:
            raise


def _read_task_yaml(record: RunRecord) -> dict[str, Any]:
    path = Path(record.task_yaml)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SkygreenError(f"run {record.run_id}: cannot read its rendered task {path}: {e}") from e


def _resume_secrets(record: RunRecord, environ: Mapping[str, str]) -> dict[str, str]:
    """Secret values for a relaunch: from the environment, else still from the task file."""
    try:
        return secret_values(load_task(record.task_path), environ)
    except InputError:
        return {name: environ[name] for name in record.secret_names if environ.get(name)}


def cancel(run_id: str, *, wiring: Wiring, by_user: bool = True) -> CancelResult:
    """Stop a run: mark the cancel in its bucket (so the runtime does not count it as a
    preemption), SIGTERM (the runtime commits a checkpoint), then its launcher's cancel.
    A run that already ended is left exactly as it is. The user's cancel of a run with a
    deadline also stops its watcher (`by_user=False` is the watcher's own switch)."""
    registry = wiring.registry
    record = adopt_pending(registry.load(run_id), wiring)
    if record.job_id is None:
        raise InputError(f"run {record.run_id} was never launched; nothing to cancel")
    marked = by_user and record.deadline is not None
    if marked:
        mark_user_cancel(registry.run_dir(record.run_id))
    bucket_marked = False
    try:
        current = run_status(record, wiring=wiring)
        if current.state in JobState.__members__ and JobState(current.state).terminal:
            return CancelResult(status=current, already_ended=True)
        bucket_marked = _mark_cancel(record, wiring)
        launcher_for(record, wiring).cancel(record.job_id)
    except SkygreenError:  # the run goes on: so must its watcher, and its next SIGTERM is a preemption
        if marked:
            clear_user_cancel(registry.run_dir(record.run_id))
        if bucket_marked:
            _clear_cancel(record, wiring)
        raise
    registry.save(dataclasses.replace(record, cancelled=True))
    return CancelResult(status=run_status(registry.load(record.run_id), wiring=wiring), already_ended=False)


def cancel_unknown_jobs(name: str, *, wiring: Wiring) -> list[UnknownJob]:
    """Stop the jobs no record here knows (`skygreen.launch.status.unknown_jobs`) whose name is
    `name`, or whose run id is; returns them (empty when there is none: the caller says so).
    Their bucket is left as it is: no record says where it is."""
    found = [job for job in unknown_jobs(wiring.registry.list(), wiring=wiring) if name in (job.name, job.run_id)]
    for job in found:
        launcher = wiring.local_launcher() if job.launcher == LOCAL else wiring.cloud_launcher()
        launcher.cancel(job.job_id)
    return found


CANCEL_MARK_DEADLINE_S = 15.0
"""How long `cancel` and `resume` wait for the bucket to take or drop the cancel marker: the
marker only keeps one SIGTERM out of the preemption count, so a bucket that does not answer
must not hold the command up."""


def _mark_cancel(record: RunRecord, wiring: Wiring) -> bool:
    """Leave the cancel marker in the run's bucket folder; whether it was left."""
    try:
        _with_run_store(record, wiring, request_cancel)
    except StoreError as e:  # the cancel itself must still happen
        sys.stderr.write(
            f"note: could not mark the cancel in {record.checkpoint_url} ({str(e).splitlines()[0]}); "
            "the runtime may count it as a preemption\n"
        )
        return False
    return True


def _clear_cancel(record: RunRecord, wiring: Wiring) -> None:
    # resume checks the bucket itself; an old marker only makes one SIGTERM read as a cancel
    with contextlib.suppress(StoreError):
        _with_run_store(record, wiring, clear_cancel)


def _with_run_store(record: RunRecord, wiring: Wiring, action: Callable[[Store], None]) -> None:
    """`action(store)` on the run's checkpoint folder, bounded as every laptop bucket call is."""
    url = record.checkpoint_url
    within_deadline(record.bucket, lambda: action(wiring.open_store(url)), deadline_s=CANCEL_MARK_DEADLINE_S)


def logs(run_id: str, *, follow: bool = False, out: TextIO | None = None, wiring: Wiring) -> int | None:
    """Write a run's output to `out` (stdout); with `follow`, until it ends."""
    record = wiring.registry.load(run_id)
    if record.job_id is None:
        raise InputError(f"run {record.run_id} was never launched; it has no logs")
    return launcher_for(record, wiring).logs(record.job_id, follow=follow, out=out or sys.stdout)


# ---------------------------------------------------------------- helpers


def _snapshot(spec: TaskSpec) -> dict[str, Any]:
    """The task as parsed, for the record: SkyPilot keys with secret values removed, and the
    validated skygreen section."""
    sky = dict(spec.sky)
    if isinstance(sky.get("secrets"), Mapping):
        sky["secrets"] = {str(k): None for k in sky["secrets"]}
    return {"sky": sky, "skygreen": _plain(spec.green), "num_nodes": spec.num_nodes}


def _plain(value: Any) -> Any:
    if isinstance(value, Record):  # a section declared once (`skygreen.task.declare`)
        return _plain(msgspec.structs.asdict(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a value such as `power.cap`
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _plan_summary(spec: TaskSpec, plan: Plan | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    offers = [c.to_json() for c in plan.candidates[: spec.green.max_candidates]]
    return {"objective": plan.objective, "offers": offers, "reason": list(getattr(plan, "reason", ()))}
