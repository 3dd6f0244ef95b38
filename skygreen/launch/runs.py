"""A run's life on the user's machine: up, status, resume, cancel, logs.

The order that keeps every failure cheap: nothing is launched until the task validated,
planned, passed its smoke test and its bucket took a test write. What touches the outside
world (the planner over a catalog, the smoke test, stores, launchers, the registry) comes in
through `Wiring`, built by the composition root `skygreen.api`; this module imports no
adapter. The CLI prints what `skygreen.api` returns.
"""

from __future__ import annotations

import dataclasses
import secrets as _random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from skygreen.checkpoint.interval import preemption_rate_per_hour
from skygreen.checkpoint.manifest import Manifest, latest_manifest
from skygreen.checkpoint.store import Store
from skygreen.errors import (
    CheckpointError,
    InputError,
    LaunchError,
    SkygreenError,
    StoreError,
)
from skygreen.files import write_atomic
from skygreen.launch.launcher import JobState, JobStatus, Launcher
from skygreen.launch.registry import Registry, RunRecord, data_dir, default_local_bucket, new_run_id
from skygreen.launch.render import RuntimeInstall, declared_secrets, render_task, secret_values, to_yaml
from skygreen.settings import RuntimeSettings
from skygreen.spec import TaskSpec, load_spec
from skygreen.timestamps import utc_now_iso

if TYPE_CHECKING:
    from skygreen.launch.smoke import SmokeResult
    from skygreen.plan.rank import Plan

LOCAL = "local"
CLOUD = "cloud"


@dataclass(frozen=True, kw_only=True, slots=True)
class Wiring:
    """The outside world a run's life touches, handed in by the composition root (`skygreen.api`)."""

    registry: Registry
    environ: Mapping[str, str]
    plan: Callable[[TaskSpec], Plan]
    """Ranks the offers for a task (the catalog is the caller's choice)."""
    smoke: Callable[[Path], SmokeResult]
    """Runs the task's CPU smoke test; raises `SmokeTestError` when it fails."""
    open_store: Callable[[str], Store]
    cloud_launcher: Callable[[], Launcher]
    local_launcher: Callable[[], Launcher]


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
    """The interval the runtime last chose (fixed, or `auto`'s Daly optimum)."""
    where: str | None
    checkpoint_url: str
    progress_error: str | None = None

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
    wiring: Wiring,
) -> UpResult:
    """Validate, plan, smoke-test, preflight the bucket, render and launch one run."""
    environ, registry = wiring.environ, wiring.registry
    task_path = Path(task_path)
    spec = load_spec(task_path)
    run_id = new_run_id(spec.name)
    bucket = _bucket(spec, local=local, environ=environ)
    plan = None if local else wiring.plan(spec)
    task = _render(spec, plan, run_id=run_id, bucket=bucket, task_dir=task_path.resolve().parent)
    yaml_text = to_yaml(task)
    if dryrun:
        path = Path(output) if output else data_dir(environ) / "dryrun" / f"{run_id}.yaml"
        write_atomic(path, yaml_text)
        return UpResult(yaml_path=path, run_id=run_id, plan=plan, record=None)
    smoke_result = wiring.smoke(task_path) if smoke else None
    preflight_bucket(wiring.open_store(f"{bucket.rstrip('/')}/{run_id}"), bucket)
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
        plan_summary=_plan_summary(spec, plan),
        secret_names=_secret_names(spec),
    )
    record = registry.save(record)
    record = _launch(registry, record, launcher, task, secret_values(spec, environ))
    return UpResult(yaml_path=yaml_path, run_id=run_id, plan=plan, record=record, smoke=smoke_result)


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


def _render(spec: TaskSpec, plan: Plan | None, *, run_id: str, bucket: str, task_dir: Path) -> dict[str, Any]:
    rate = None
    if plan is not None:  # the planner's assumption for the cloud it ranked first
        rate = preemption_rate_per_hour(plan.best.cloud, spec.green.preemption.rate_per_hour)
    settings = RuntimeSettings.from_spec(spec.green, run_id=run_id, bucket=bucket, preemptions_per_hour=rate)
    return render_task(spec, plan, settings=settings, task_dir=task_dir, install=runtime_install())


def runtime_install() -> RuntimeInstall:
    """How the VM installs skygreen: from this source checkout when skygreen runs from one
    (its folder is mounted to the VM), else the released package of the same version."""
    project = Path(__file__).resolve().parents[2]
    if (project / "pyproject.toml").is_file() and (project / "skygreen" / "__init__.py").is_file():
        return RuntimeInstall(source_dir=str(project))
    return RuntimeInstall.default()


def preflight_bucket(store: Store, bucket: str) -> None:
    """Write, read back and delete one small object in the run's store (under its prefix in
    `bucket`), so a missing bucket or a missing permission stops `up` before any VM starts."""
    key = f"preflight-{_random.token_hex(4)}"
    probe = b"skygreen preflight\n"
    try:
        store.put(key, probe)
        if store.get(key) != probe:
            raise StoreError(f"{store.url}: a test object read back different bytes")
        store.delete(key)
    except StoreError as e:
        raise StoreError(
            f"checkpoint bucket {bucket} is not usable: {e}\n"
            "  fix: create the bucket (or folder) and grant this machine and the VMs write access, "
            "or set another skygreen.checkpoint.bucket"
        ) from e


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


def status(run_id: str | None = None, *, wiring: Wiring) -> list[RunStatus]:
    """The named run, or every run on this machine (newest last)."""
    records = [wiring.registry.load(run_id)] if run_id else wiring.registry.list()
    return [run_status(record, wiring=wiring) for record in records]


def run_status(record: RunRecord, *, wiring: Wiring) -> RunStatus:
    """One run's state: its launcher's view joined with the progress in its bucket."""
    registry = wiring.registry
    job, job_error = _job_status(record, wiring)
    manifest, progress_error = _progress(record.checkpoint_url, wiring)
    meta = dict(manifest.meta) if manifest else {}
    state = job.state.value if job else record.state
    detail = job_error or (job.detail if job else None)
    if job and job.failure_reason:
        detail = f"{detail}: {job.failure_reason}" if detail else job.failure_reason
    if job and job.state.value != record.state:
        registry.save(dataclasses.replace(record, state=job.state.value))
    spend, estimated = _spend(record, job, wiring)
    energy_j = meta.get("energy_j")
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
    )


def _job_status(record: RunRecord, wiring: Wiring) -> tuple[JobStatus | None, str | None]:
    if record.job_id is None:
        return None, None
    try:
        return launcher_for(record, wiring).status(record.job_id), None
    except LaunchError as e:
        return None, str(e).splitlines()[0]


def _progress(url: str, wiring: Wiring) -> tuple[Manifest | None, str | None]:
    """The run's latest committed checkpoint (no torch involved), or why it cannot be read."""
    try:
        return latest_manifest(wiring.open_store(url)), None
    except (StoreError, CheckpointError) as e:
        return None, str(e).splitlines()[0]


def _spend(record: RunRecord, job: JobStatus | None, wiring: Wiring) -> tuple[float | None, bool]:
    """Spend of every launch of the run so far, and whether any part of it is a guess.

    SkyPilot reports no cost per managed job, so each launch costs its job's run time times
    the catalog price of the offer it landed on; a job that does not say where it runs is
    priced at the plan's best offer (a guess). `job` is the current launch's status, already
    fetched; earlier launches (before a `resume`) are asked for theirs. A launch whose status
    is gone from SkyPilot's queue is left out."""
    if record.mode == LOCAL:
        return 0.0, False
    offers = list((record.plan_summary or {}).get("offers", ()))
    if not offers:
        return None, False
    jobs = [_job_status_of(record, launch.job_id, wiring) for launch in record.launches[:-1]] + [job]
    priced = [_launch_spend(offers, j) for j in jobs if j is not None and j.duration_s is not None]
    if not priced:
        return None, False
    return sum(usd for usd, _ in priced), any(guessed for _, guessed in priced)


def _job_status_of(record: RunRecord, job_id: str, wiring: Wiring) -> JobStatus | None:
    try:
        return launcher_for(record, wiring).status(job_id)
    except LaunchError:
        return None


def _launch_spend(offers: list[Mapping[str, Any]], job: JobStatus) -> tuple[float, bool]:
    landed = [
        o
        for o in offers
        if o["cloud"] == job.cloud
        and (job.region is None or o["region"] == job.region)
        and (not job.accelerators or o["accelerator"] in job.accelerators)
    ]
    offer = landed[0] if landed else offers[0]
    price = float(offer["price_usd_per_hour"]) * int(offer.get("num_nodes") or 1)
    return (job.duration_s or 0.0) / 3600.0 * price, not landed


def _where(job: JobStatus | None) -> str | None:
    if job is None or job.cloud is None:
        return None
    return "/".join(p for p in (job.cloud, job.region) if p)


# ---------------------------------------------------------------- resume, cancel, logs


def resume(run_id: str, *, local: bool = False, wiring: Wiring) -> RunRecord:
    """Relaunch a stopped run with the same run id: the runtime continues from the latest
    checkpoint in its bucket. `local` runs it on this machine whatever it ran on before."""
    environ, registry = wiring.environ, wiring.registry
    record = registry.load(run_id)
    current = run_status(record, wiring=wiring)
    if current.completed:
        raise InputError(
            f"run {run_id} already completed at step {current.step}\n  fix: start a new run with `skygreen up`"
        )
    if current.state == JobState.SUCCEEDED.value:
        raise InputError(
            f"run {run_id} finished (SUCCEEDED); there is nothing to resume\n  fix: start a new run with `skygreen up`"
        )
    stopped = current.state in JobState.__members__ and JobState(current.state).resumable
    if record.launches and not stopped:
        raise InputError(
            f"run {run_id} is {current.state}; only a stopped run can be resumed\n"
            f"  fix: wait for it, or `skygreen cancel {run_id}` first"
        )
    to_local = local or record.mode == LOCAL
    if to_local == (record.mode == LOCAL):
        task = _read_task_yaml(record)
    else:  # a cloud run continued here: the same run id and bucket, rendered for this machine
        spec = load_spec(record.task_path)
        task = _render(spec, None, run_id=record.run_id, bucket=record.bucket, task_dir=Path(record.task_path).parent)
    launcher = wiring.local_launcher() if to_local else launcher_for(record, wiring)
    record = dataclasses.replace(record, mode=LOCAL if to_local else record.mode, launcher=launcher.kind)
    return _launch(registry, record, launcher, task, _resume_secrets(record, environ))


def _read_task_yaml(record: RunRecord) -> dict[str, Any]:
    path = Path(record.task_yaml)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise SkygreenError(f"run {record.run_id}: cannot read its rendered task {path}: {e}") from e


def _resume_secrets(record: RunRecord, environ: Mapping[str, str]) -> dict[str, str]:
    """Secret values for a relaunch: from the environment, else still from the task file."""
    try:
        return secret_values(load_spec(record.task_path), environ)
    except InputError:
        return {name: environ[name] for name in record.secret_names if environ.get(name)}


def cancel(run_id: str, *, wiring: Wiring) -> RunStatus:
    """Stop a run: SIGTERM (the runtime commits a checkpoint), then its launcher's cancel."""
    registry = wiring.registry
    record = registry.load(run_id)
    if record.job_id is None:
        raise InputError(f"run {run_id} was never launched; nothing to cancel")
    launcher_for(record, wiring).cancel(record.job_id)
    registry.save(dataclasses.replace(record, cancelled=True))
    return run_status(registry.load(run_id), wiring=wiring)


def logs(run_id: str, *, follow: bool = False, out: TextIO | None = None, wiring: Wiring) -> int | None:
    """Write a run's output to `out` (stdout); with `follow`, until it ends."""
    record = wiring.registry.load(run_id)
    if record.job_id is None:
        raise InputError(f"run {run_id} was never launched; it has no logs")
    return launcher_for(record, wiring).logs(record.job_id, follow=follow, out=out or sys.stdout)


# ---------------------------------------------------------------- helpers


def launcher_for(record: RunRecord, wiring: Wiring) -> Launcher:
    """The launcher a run was launched with."""
    if record.launcher == "local":
        return wiring.local_launcher()
    launcher = wiring.cloud_launcher()
    if launcher.kind != record.launcher:
        raise InputError(
            f"run {record.run_id} was launched with the {record.launcher!r} launcher, but this shell selects {launcher.kind!r}\n"
            "  fix: set or unset SKYGREEN_LAUNCHER as it was when the run started"
        )
    return launcher


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
    return declared_secrets(spec)


def _plan_summary(spec: TaskSpec, plan: Plan | None) -> dict[str, Any] | None:
    if plan is None:
        return None
    offers = [c.to_json() for c in plan.candidates[: spec.green.max_candidates]]
    return {"objective": plan.objective, "offers": offers, "reason": list(getattr(plan, "reason", ()))}


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
