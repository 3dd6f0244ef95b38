"""A run's life on the user's machine: up, status, resume, cancel, logs.

Composition only: the task spec, the planner, the CPU smoke test, the checkpoint store, the
renderer, a launcher and the run registry, wired in the order that keeps every failure cheap:
nothing is launched until the task validated, planned, passed its smoke test and its bucket
took a test write. `skygreen.api` exposes these functions; the CLI prints what they return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from skygreen.errors import (
    CheckpointError,
    InputError,
    LaunchError,
    SkygreenError,
    StoreError,
)
from skygreen.files import write_atomic
from skygreen.launch.launcher import JobState, JobStatus, Launcher, cloud_launcher
from skygreen.launch.registry import Registry, RunRecord, data_dir, default_local_bucket, new_run_id
from skygreen.launch.spend import run_spend
from skygreen.spec import TaskSpec
from skygreen.task_checks import load_task

LOCAL = "local"
CLOUD = "cloud"
BUDGET_STATE = "budget"
"""The runtime's checkpoint state when it stopped at `budget_usd` (shown as BUDGET)."""
BUDGET_ENV = "SKYGREEN_BUDGET_USD"


@dataclass(frozen=True, kw_only=True, slots=True)
class UpResult:
    """What `up` did: the rendered YAML, the plan, and (unless a dry run) the launched run."""

    yaml_path: Path
    run_id: str
    plan: Any | None
    """A `skygreen.plan.rank.Plan` for cloud runs; None for local ones."""
    record: RunRecord | None
    """None for a dry run: nothing was launched or recorded."""
    smoke: Any | None = None
    """The smoke test's `SmokeResult`; None with `--no-smoke`."""
    bucket: str | None = None
    bucket_unchecked: str | None = None
    """A dry run that could not check the bucket from this machine says why (no credentials)."""
    notices: tuple[str, ...] = ()
    """One-line remarks for the user: the plan's (which include the task file's), or for a
    local run, the task file's own (a deprecated key)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunStatus:
    """One run's state: the launcher's view joined with the progress in its bucket."""

    run_id: str
    task: str
    mode: str
    state: str
    detail: str | None
    job_id: str | None
    launches: int
    step: int | None
    """Step of the latest committed checkpoint."""
    model_sha256: str | None
    checkpoint_at: str | None
    completed: bool
    """The runtime committed its final checkpoint (manifest meta state "completed")."""
    preemptions: int | None
    """Preemptions the runtime counted (SIGTERMs and notices), across launches."""
    recoveries: int
    """Relaunches by SkyPilot's job recovery plus `skygreen resume`s."""
    spend_usd: float | None
    spend_estimated: bool
    """True when the price is the plan's best offer, not the offer the job landed on."""
    energy_kwh: float | None
    wall_s: float | None
    checkpoint_interval_s: float | None
    """The interval the runtime last chose (fixed, or `auto`'s Young/Daly optimum)."""
    where: str | None
    checkpoint_url: str
    progress_error: str | None = None
    unreachable_bucket: str | None = None
    """The checkpoint URL, when its bucket did not answer (`progress_error` says how)."""
    energy: dict[str, Any] | None = None
    """`skygreen.power.statement.EnergyReport` as JSON: GPU and facility kWh, PUE, CO2e, method, cap."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- up


def up(
    task_path: str | Path,
    *,
    local: bool = False,
    dryrun: bool = False,
    output: str | Path | None = None,
    smoke: bool = True,
    catalog_dir: Path | None = None,
    registry: Registry | None = None,
    environ: Mapping[str, str] | None = None,
) -> UpResult:
    """Validate, plan, smoke-test, preflight the bucket, render and launch one run."""
    environ = os.environ if environ is None else environ
    registry = registry or Registry()
    task_path = Path(task_path)
    spec = load_task(task_path)
    run_id = new_run_id(spec.name)
    bucket = _bucket(spec, local=local, environ=environ)
    plan = None if local else _plan(spec, catalog_dir)
    task = _render(spec, plan, run_id=run_id, bucket=bucket, task_dir=task_path.resolve().parent)
    from skygreen.launch.render import to_yaml

    yaml_text = to_yaml(task)
    smoke_result = _smoke(task_path) if smoke else None
    if dryrun:  # every check `up` makes, then the YAML; only the launch is left out
        unchecked = _preflight_unless_no_credentials(bucket, run_id)
        path = Path(output) if output else data_dir(environ) / "dryrun" / f"{run_id}.yaml"
        write_atomic(path, yaml_text)
        return UpResult(yaml_path=path, run_id=run_id, plan=plan, record=None, smoke=smoke_result,
                        bucket=bucket, bucket_unchecked=unchecked, notices=_notices(spec, plan))  # fmt: skip
    preflight_bucket(bucket, run_id)
    launcher = _local_launcher(environ) if local else cloud_launcher()
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
        created_at=_now(),
        state="CREATED",
        plan_summary=_plan_summary(spec, plan),
        secret_names=_secret_names(spec),
    )
    record = registry.save(record)
    from skygreen.launch.render import secret_values

    record = _launch(registry, record, launcher, task, secret_values(spec, environ))
    return UpResult(
        yaml_path=yaml_path, run_id=run_id, plan=plan, record=record, smoke=smoke_result, notices=_notices(spec, plan)
    )


def _notices(spec: TaskSpec, plan: Any | None) -> tuple[str, ...]:
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
    if not local and not bucket.startswith(("s3://", "gs://")):
        raise InputError(
            f"skygreen.checkpoint.bucket: {bucket!r} is a path on this machine, which cloud VMs cannot reach\n"
            "  fix: use s3://BUCKET/PREFIX or gs://BUCKET/PREFIX, or run here with --local"
        )
    if bucket.startswith("file://"):
        return str(Path(bucket[len("file://") :]).expanduser())
    if "://" not in bucket:
        return str(Path(bucket).expanduser().resolve())
    return bucket


def _plan(spec: TaskSpec, catalog_dir: Path | None):
    from skygreen.api import plan
    from skygreen.costs.costing import measured_speeds

    measured = (
        {gpu: speed for gpu, (speed, _) in measured_speeds(spec, spec.source or "").items()} if spec.source else {}
    )
    return plan(spec, catalog_dir=catalog_dir, measured_speed=measured)


def _render(spec: TaskSpec, plan: Any | None, *, run_id: str, bucket: str, task_dir: Path) -> dict[str, Any]:
    from skygreen.launch.render import render_task
    from skygreen.settings import RuntimeSettings

    rates = offers = None
    if plan is not None:  # the planner's assumption for every cloud among the offers handed over
        from skygreen.ledger.place import offers_env
        from skygreen.plan.cost import DEFAULT_PREEMPTION_RATE_PER_HOUR

        handed_over = plan.candidates[: spec.green.max_candidates]
        table = {**DEFAULT_PREEMPTION_RATE_PER_HOUR, **spec.green.preemption.rate_per_hour}
        rates = {cloud: table[cloud] for cloud in sorted({c.cloud for c in handed_over}) if cloud in table}
        offers = offers_env(handed_over)  # prices for the VM's ledger
    settings = RuntimeSettings.from_spec(
        spec.green, run_id=run_id, bucket=bucket, preemptions_per_hour_by_cloud=rates, offers=offers
    )
    return render_task(spec, plan, settings=settings, task_dir=task_dir, install=runtime_install())


def runtime_install():
    """How the VM installs skygreen: from this source checkout when skygreen runs from one
    (its folder is mounted to the VM), else the released package of the same version."""
    from skygreen.launch.render import RuntimeInstall

    project = Path(__file__).resolve().parents[2]
    if (project / "pyproject.toml").is_file() and (project / "skygreen" / "__init__.py").is_file():
        return RuntimeInstall(source_dir=str(project))
    return RuntimeInstall.default()


def _smoke(task_path: Path):
    from skygreen.launch.smoke import run_smoke

    return run_smoke(task_path)


def preflight_bucket(bucket: str, run_id: str) -> None:
    """Write, read back and delete one small object under the run's prefix, so a missing
    bucket, a missing permission or a bucket that does not answer stops `up` before any VM
    starts (within `skygreen.launch.bucket.DEADLINE_S`)."""
    from skygreen.launch.bucket import BucketUnreachableError, check_writable

    try:
        check_writable(bucket, run_id)
    except BucketUnreachableError:
        raise
    except StoreError as e:
        raise type(e)(
            f"checkpoint bucket {bucket} is not usable: {e}\n"
            "  fix: create the bucket (or folder) and grant this machine and the VMs write access, "
            "or set another skygreen.checkpoint.bucket"
        ) from e


def _preflight_unless_no_credentials(bucket: str, run_id: str) -> str | None:
    """The bucket preflight of a dry run. A laptop without the cloud's credentials cannot
    check a bucket only the VMs can write: that is not a failure, and the reason is returned."""
    from skygreen.checkpoint.store import NoCredentialsError

    try:
        preflight_bucket(bucket, run_id)
    except NoCredentialsError as e:
        return str(e.__cause__ or e).splitlines()[0].partition(": ")[2] or "no credentials on this machine"
    return None


def _launch(
    registry: Registry, record: RunRecord, launcher: Launcher, task: Mapping[str, Any], secrets: Mapping[str, str]
) -> RunRecord:
    try:
        job_id = launcher.launch(task, name=record.run_id, secrets=secrets)
    except SkygreenError:
        registry.save(dataclasses.replace(record, state="LAUNCH_FAILED"))
        raise
    pid = launcher.pid(job_id) if hasattr(launcher, "pid") else None
    return registry.save(record.with_launch(job_id, pid=pid, state=JobState.PENDING.value))


# ---------------------------------------------------------------- status


def status(run_id: str | None = None, *, registry: Registry | None = None) -> list[RunStatus]:
    """The named run, or every run on this machine (newest last)."""
    registry = registry or Registry()
    records = [registry.load(run_id)] if run_id else registry.list()
    unreachable: dict[str, str] = {}  # one wait per bucket that does not answer, not one per run
    return [run_status(record, registry=registry, unreachable=unreachable) for record in records]


def run_status(
    record: RunRecord, *, registry: Registry | None = None, unreachable: dict[str, str] | None = None
) -> RunStatus:
    registry = registry or Registry()
    job, job_error = _job_status(record)
    unreachable = {} if unreachable is None else unreachable
    manifest, progress_error = _progress(record, unreachable)
    meta = dict(manifest.meta) if manifest else {}
    state = job.state.value if job else record.state
    detail = job_error or (job.detail if job else None)
    if job and job.failure_reason:
        detail = f"{detail}: {job.failure_reason}" if detail else job.failure_reason
    if job and job.state.value != record.state:
        registry.save(dataclasses.replace(record, state=job.state.value))
    spend, estimated = run_spend(record, job, job_status_of=lambda job_id: _job_status_of(record, job_id))
    energy_j = meta.get("energy_j")
    if meta.get("state") == BUDGET_STATE and (job is None or job.state.terminal):
        state, detail = (
            BUDGET_STATE.upper(),
            f"stopped at its budget; raise it with `skygreen resume {record.run_id} --budget-usd N`",
        )
    return RunStatus(
        run_id=record.run_id,
        task=record.task_path,
        mode=record.mode,
        state=state,
        detail=detail,
        job_id=record.job_id,
        launches=len(record.launches),
        step=manifest.step if manifest else None,
        model_sha256=manifest.model_sha256 if manifest else None,
        checkpoint_at=manifest.created_at if manifest else None,
        completed=meta.get("state") == "completed",
        preemptions=_int_or_none(meta.get("preemptions")),
        recoveries=(job.recovery_count if job else 0) + max(0, len(record.launches) - 1),
        spend_usd=spend,
        spend_estimated=estimated,
        energy_kwh=None if energy_j is None else float(energy_j) / 3.6e6,
        wall_s=_float_or_none(meta.get("wall_s")),
        checkpoint_interval_s=_float_or_none(meta.get("checkpoint_interval_s")),
        where=_where(job),
        checkpoint_url=record.checkpoint_url,
        progress_error=progress_error,
        unreachable_bucket=record.checkpoint_url if record.bucket in unreachable else None,
        energy=_energy(meta, job if record.mode != "local" else None) if manifest else None,
    )


def _energy(meta: Mapping[str, Any], job: JobStatus | None) -> dict[str, Any]:
    from skygreen.power.statement import energy_report

    return energy_report(meta, cloud=job.cloud if job else None, region=job.region if job else None).to_json()


def _job_status(record: RunRecord) -> tuple[JobStatus | None, str | None]:
    if record.job_id is None:
        return None, None
    try:
        return launcher_for(record).status(record.job_id), None
    except LaunchError as e:
        return None, str(e).splitlines()[0]


def _progress(record: RunRecord, unreachable: dict[str, str]):
    """The latest manifest and None, or None and a one-line error. `unreachable` maps the
    buckets that did not answer to their error, filled in here and skipped after."""
    from skygreen.checkpoint.manifest import read_progress
    from skygreen.launch.bucket import BucketUnreachableError, within_deadline

    if record.bucket in unreachable:
        return None, unreachable[record.bucket]
    try:
        return within_deadline(record.bucket, lambda: read_progress(record.checkpoint_url)), None
    except BucketUnreachableError as e:
        unreachable[record.bucket] = str(e)
        return None, str(e)
    except (StoreError, CheckpointError) as e:
        return None, str(e).splitlines()[0]


def _job_status_of(record: RunRecord, job_id: str) -> JobStatus | None:
    try:
        return launcher_for(record).status(job_id)
    except LaunchError:
        return None


def _where(job: JobStatus | None) -> str | None:
    if job is None or job.cloud is None:
        return None
    return "/".join(p for p in (job.cloud, job.region) if p)


# ---------------------------------------------------------------- resume, cancel, logs


def resume(
    run_id: str,
    *,
    local: bool = False,
    budget_usd: float | None = None,
    registry: Registry | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunRecord:
    """Relaunch a stopped run with the same run id: the runtime continues from the latest
    checkpoint in its bucket. `local` runs it on this machine whatever it ran on before.
    `budget_usd` sets a new budget (a run stopped at its budget needs a higher one)."""
    environ = os.environ if environ is None else environ
    registry = registry or Registry()
    record = registry.load(run_id)
    run_id = record.run_id
    _check_bucket_before_resume(record)
    current = run_status(record, registry=registry)
    if current.completed:
        raise InputError(
            f"run {run_id} already completed at step {current.step}\n  fix: start a new run with `skygreen up`"
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
        task = _render(spec, None, run_id=record.run_id, bucket=record.bucket, task_dir=Path(record.task_path).parent)
    if budget_usd is not None:
        task.setdefault("envs", {})[BUDGET_ENV] = f"{budget_usd:g}"
        from skygreen.launch.render import to_yaml

        write_atomic(Path(record.task_yaml), to_yaml(task))
    launcher = _local_launcher(environ) if to_local else launcher_for(record)
    record = dataclasses.replace(record, mode=LOCAL if to_local else record.mode, launcher=launcher.kind)
    _clear_cancel(record)
    return _launch(registry, record, launcher, task, _resume_secrets(record, environ))


def _check_new_budget(record: RunRecord, budget_usd: float | None) -> None:
    old = (_read_task_yaml(record).get("envs") or {}).get(BUDGET_ENV)
    if budget_usd is None or (old is not None and budget_usd <= float(old)):
        given = "" if budget_usd is None else f" ({budget_usd:g} is not more than {old})"
        raise InputError(
            f"run {record.run_id} stopped at its budget of ${old}{given}\n"
            f"  fix: `skygreen resume {record.run_id} --budget-usd N` with N above {old}"
        )


def _check_bucket_before_resume(record: RunRecord) -> None:
    """Before any process starts: a bucket that does not answer, or refuses, fails here in one
    line. A laptop without the cloud's credentials cannot look into a bucket that only the
    run's VMs can write; that is no reason to refuse the relaunch, so the check is skipped."""
    from skygreen.checkpoint.store import NoCredentialsError
    from skygreen.launch.bucket import check_writable

    try:
        check_writable(record.bucket, record.run_id)
    except NoCredentialsError:
        if record.mode == LOCAL:
            raise


def _read_task_yaml(record: RunRecord) -> dict[str, Any]:
    import yaml

    path = Path(record.task_yaml)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SkygreenError(f"run {record.run_id}: cannot read its rendered task {path}: {e}") from e


def _resume_secrets(record: RunRecord, environ: Mapping[str, str]) -> dict[str, str]:
    """Secret values for a relaunch: from the environment, else still from the task file."""
    from skygreen.launch.render import secret_values

    try:
        return secret_values(load_task(record.task_path), environ)
    except InputError:
        return {name: environ[name] for name in record.secret_names if environ.get(name)}


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelResult:
    status: RunStatus
    already_ended: bool
    """The run had ended before the cancel: nothing was signalled or changed."""


def cancel(run_id: str, *, registry: Registry | None = None) -> CancelResult:
    """Stop a run: mark the cancel in its bucket (so the runtime does not count it as a
    preemption), SIGTERM (the runtime commits a checkpoint), then its launcher's cancel.
    A run that already ended is left exactly as it is."""
    registry = registry or Registry()
    record = registry.load(run_id)
    if record.job_id is None:
        raise InputError(f"run {record.run_id} was never launched; nothing to cancel")
    current = run_status(record, registry=registry)
    if current.state in JobState.__members__ and JobState(current.state).terminal:
        return CancelResult(status=current, already_ended=True)
    _mark_cancel(record)
    launcher_for(record).cancel(record.job_id)
    registry.save(dataclasses.replace(record, cancelled=True))
    return CancelResult(status=run_status(registry.load(record.run_id), registry=registry), already_ended=False)


CANCEL_MARK_DEADLINE_S = 15.0
"""How long `cancel` and `resume` wait for the bucket to take or drop the cancel marker: the
marker only keeps one SIGTERM out of the preemption count, so a bucket that does not answer
must not hold the command up."""


def _mark_cancel(record: RunRecord) -> None:
    from skygreen.checkpoint.cancellation import request_cancel

    try:
        _with_run_store(record, request_cancel)
    except StoreError as e:  # the cancel itself must still happen
        sys.stderr.write(
            f"note: could not mark the cancel in {record.checkpoint_url} ({str(e).splitlines()[0]}); "
            "the runtime may count it as a preemption\n"
        )


def _clear_cancel(record: RunRecord) -> None:
    from skygreen.checkpoint.cancellation import clear_cancel

    # resume checks the bucket itself; an old marker only makes one SIGTERM read as a cancel
    with contextlib.suppress(StoreError):
        _with_run_store(record, clear_cancel)


def _with_run_store(record: RunRecord, action) -> None:
    """`action(store)` on the run's checkpoint folder, bounded as every laptop bucket call is."""
    from skygreen.checkpoint.store import open_store
    from skygreen.launch.bucket import within_deadline

    url = record.checkpoint_url
    within_deadline(record.bucket, lambda: action(open_store(url)), deadline_s=CANCEL_MARK_DEADLINE_S)


def logs(
    run_id: str, *, follow: bool = False, out: TextIO | None = None, registry: Registry | None = None
) -> int | None:
    registry = registry or Registry()
    record = registry.load(run_id)
    if record.job_id is None:
        raise InputError(f"run {record.run_id} was never launched; it has no logs")
    return launcher_for(record).logs(record.job_id, follow=follow, out=out or sys.stdout)


# ---------------------------------------------------------------- helpers


def launcher_for(record: RunRecord) -> Launcher:
    """The launcher a run was launched with."""
    if record.launcher == "local":
        return _local_launcher(os.environ)
    launcher = cloud_launcher()
    if launcher.kind != record.launcher:
        raise InputError(
            f"run {record.run_id} was launched with the {record.launcher!r} launcher, but this shell selects {launcher.kind!r}\n"
            "  fix: set or unset SKYGREEN_LAUNCHER as it was when the run started"
        )
    return launcher


def _local_launcher(environ: Mapping[str, str]):
    from skygreen.launch.local_launcher import LocalLauncher

    return LocalLauncher(data_dir(environ) / "local-jobs")


def _snapshot(spec: TaskSpec) -> dict[str, Any]:
    """The task as parsed, for the record: SkyPilot keys with secret values removed, and the
    validated skygreen section."""
    sky = dict(spec.sky)
    if isinstance(sky.get("secrets"), Mapping):
        sky["secrets"] = {str(k): None for k in sky["secrets"]}
    return {"sky": sky, "skygreen": _plain(dataclasses.asdict(spec.green)), "num_nodes": spec.num_nodes}


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _secret_names(spec: TaskSpec) -> tuple[str, ...]:
    from skygreen.launch.render import declared_secrets

    return declared_secrets(spec)


def _plan_summary(spec: TaskSpec, plan: Any | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    offers = [c.to_json() for c in plan.candidates[: spec.green.max_candidates]]
    return {"objective": plan.objective, "offers": offers, "reason": list(getattr(plan, "reason", ()))}


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
