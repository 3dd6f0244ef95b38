"""A run's state on this machine: its launcher's view joined with the progress in its bucket.

`skygreen status` and `resume`'s checks read runs through here. Stores, launchers and the
registry come in through a `Wiring` (`skygreen.launch.wiring`); this module imports no adapter.

What a run has spent so far (`run_spend`) comes from the run's ledger when it has one, priced
by `skygreen.costs.costing.load_run_cost`, the same function `skygreen cost` and `compare` use,
so the three agree to the cent; its energy and CO2e are the ledger's, segment by segment
(`skygreen.ledger.energy`), so a run that moved between clouds reads the same in all three. A run started by a runtime without a ledger falls back to the
launcher's view: each launch's run time times the catalog price of the offer it landed on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skygreen.checkpoint.manifest import Manifest, latest_manifest
from skygreen.checkpoint.store import OpenStore
from skygreen.errors import BucketUnreachableError, CheckpointError, InputError, LaunchError, SkygreenError, StoreError
from skygreen.exit_codes import STOPPED_WITH_CHECKPOINT, for_outcome
from skygreen.launch.bucket import within_deadline
from skygreen.launch.launcher import (
    JobState,
    JobStatus,
    LaunchedJob,
    Launcher,
    launch_name,
    launcher_jobs,
    run_of_job,
    settled_state,
)
from skygreen.launch.registry import RunRecord
from skygreen.launch.wiring import LOCAL, Wiring, launcher_for

if TYPE_CHECKING:
    from skygreen.ledger.energy import RunEnergy
    from skygreen.ledger.pricing import RunCost
    from skygreen.ledger.records import Segment

_LAUNCHER_ENV = "SKYGREEN_LAUNCHER"
"""`skygreen.launch.launcher_factory.LAUNCHER_ENV`: a launcher named by the environment (a fake, a plugin)."""
BUDGET_STATE = "budget"
"""The runtime's checkpoint state when it stopped at `budget_usd` (shown as BUDGET)."""


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
    """Preemptions the runtime counted across launches: SIGTERMs and notices, and VMs lost
    without a word (a segment that never wrote its end), as `skygreen cost` counts them."""
    recoveries: int
    """Relaunches by SkyPilot's job recovery plus `skygreen resume`s."""
    spend_usd: float | None
    spend_estimated: bool
    """True when the price is the plan's best offer, not the offer the job landed on."""
    energy_kwh: float | None
    """Facility energy (GPU boards x each segment's PUE), as `skygreen cost` counts it."""
    wall_s: float | None
    checkpoint_interval_s: float | None
    """The interval the runtime last chose (fixed, or `auto`'s Daly optimum)."""
    where: str | None
    checkpoint_url: str
    progress_error: str | None = None
    unreachable_bucket: str | None = None
    """The checkpoint URL, when its bucket did not answer (`progress_error` says how)."""
    energy: dict[str, Any] | None = None
    """`skygreen.power.statement.EnergyReport` as JSON: GPU and facility kWh, PUE, CO2e, method, cap."""
    deadline: dict[str, Any] | None = None
    """For a run launched with a deadline: progress against it and the watcher's latest decision
    (`skygreen.deadline.status`)."""
    changeovers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Each resumed segment's changeover (`skygreen.ledger.changeover.Changeover` as JSON)."""
    job_duration_s: float | None = None
    """The current launch's run time as its launcher reports it (None when it does not say)."""
    gpu_energy_kwh: float | None = None
    """The GPU boards' energy as metered (`energy_kwh` without the PUE)."""
    co2e_kg: float | None = None
    """CO2e of `energy_kwh`, each segment at its region's grid intensity."""
    compute_usd: float | None = None
    """The GPU machines' part of `spend_usd` (no controller, no storage): the energy statement's cost."""
    memory: dict[str, Any] | None = None
    """The plan's memory per GPU beside the runtime's measured peak, from the ledger (`memory_view`):
    `planned_gb` {low, high, tensors, gpus}, `peak_gb`, `measure` and the `segment` that measured."""
    checkpoint_save: dict[str, Any] | None = None
    """What a save costs in data dollars: the newest commit's measured bytes x the list rates from
    where the run is to its bucket (`skygreen.bill.save_cost`); None for a local bucket."""

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON values, for `skygreen status --json`."""
        return dataclasses.asdict(self)


def status(run_id: str | None = None, *, wiring: Wiring) -> list[RunStatus]:
    """The named run, or every run on this machine (newest last). A record whose launch call never
    returned first adopts the job its launcher holds for that launch (`adopt_pending`)."""
    records = [wiring.registry.load(run_id)] if run_id else wiring.registry.list()
    records = [adopt_pending(record, wiring) for record in records]
    unreachable: dict[str, str] = {}  # one wait per bucket that does not answer, not one per run
    return [run_status(record, wiring=wiring, unreachable=unreachable) for record in records]


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownJob:
    """A job that is still going, named as skygreen names its jobs (`<run>-<launch>`), that no run
    record on this machine knows: a paid machine nobody watches. `skygreen cancel NAME` stops it."""

    name: str
    run_id: str
    launch: int
    job_id: str
    launcher: str
    state: str

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON values, marked as an unknown job for `status --json`."""
        return {"unknown_job": True, **dataclasses.asdict(self)}

    def line(self) -> str:
        """The job as `skygreen status` lists it after the runs, with the command that stops it."""
        return (
            f"unknown skygreen job {self.name} ({self.launcher} job {self.job_id}, {self.state}): "
            f"no run record here knows it; `skygreen cancel {self.name}` stops it"
        )


def adopt_pending(record: RunRecord, wiring: Wiring) -> RunRecord:
    """The record, with the job of its pending launch adopted when the launcher has it.

    `skygreen up`, `resume` or a deadline watcher killed inside the launcher's launch call leaves
    the record's `pending_launch` set and the job unrecorded; the launcher lists that job under the
    name `launch_name(run, launch)`. A launcher that cannot list its jobs, or does not answer,
    leaves the record as it is (the next `status` tries again)."""
    if record.pending_launch is None:
        return record
    try:
        launcher = launcher_for(record, wiring)
        jobs = launcher_jobs(launcher)
    except (LaunchError, InputError):
        return record
    recorded = {launch.job_id for launch in record.launches}
    name = launch_name(record.run_id, record.pending_launch)
    found = [job for job in jobs or () if job.name == name and job.job_id not in recorded]
    if not found:
        return record
    job = found[-1]
    state = (job.state or launcher.status(job.job_id).state).value
    pid = launcher.pid(job.job_id) if hasattr(launcher, "pid") else None
    return wiring.registry.save(record.with_launch(job.job_id, pid=pid, state=state, started_at_s=record.pending_at_s))


def unknown_jobs(records: list[RunRecord], *, wiring: Wiring) -> list[UnknownJob]:
    """Jobs still going that skygreen launched (by their name) but no record here knows, on this
    machine's launcher and on the cloud launcher (SkyPilot's queue only when some run here used it:
    reading it starts SkyPilot's API server)."""
    known = {(r.run_id, launch.job_id) for r in records for launch in r.launches}
    found = []
    for launcher in _launchers_to_reconcile(records, wiring):
        try:
            jobs = launcher_jobs(launcher) or []
        except LaunchError:
            continue  # `status` of each run says what the launcher answered
        for job in jobs:
            parsed = run_of_job(job.name)
            if parsed is None or (parsed[0], job.job_id) in known:
                continue
            state = _state_of(launcher, job)
            if state is not None and not state.terminal:
                found.append(UnknownJob(name=job.name, run_id=parsed[0], launch=parsed[1], job_id=job.job_id,
                                        launcher=launcher.kind, state=state.value))  # fmt: skip
    return found


def _launchers_to_reconcile(records: list[RunRecord], wiring: Wiring) -> list[Launcher]:
    launchers = [wiring.local_launcher()]
    chosen = bool(wiring.environ.get(_LAUNCHER_ENV))  # a named launcher (a fake, a plugin) is cheap to ask
    if chosen or any(record.launcher == "skypilot" for record in records):
        with contextlib.suppress(InputError, LaunchError, ImportError):  # no cloud launcher here: none to list
            launchers.append(wiring.cloud_launcher())
    return launchers


def _state_of(launcher: Launcher, job: LaunchedJob) -> JobState | None:
    if job.state is not None:
        return job.state
    try:
        return launcher.status(job.job_id).state
    except (LaunchError, InputError):
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunState:
    """Where a run is: its job as the launcher sees it joined with its latest checkpoint; the
    part of `RunStatus` that deciding anything about a run needs (`resume`, the deadline watcher)."""

    job: JobStatus | None
    state: str
    """The job's `JobState` value, the record's last known one, or BUDGET."""
    detail: str | None
    manifest: Manifest | None
    progress_error: str | None

    @property
    def meta(self) -> dict[str, Any]:
        """The latest checkpoint's meta (empty before the first)."""
        return dict(self.manifest.meta) if self.manifest else {}

    @property
    def completed(self) -> bool:
        """The runtime committed its final checkpoint."""
        return self.meta.get("state") == "completed"


def run_state(record: RunRecord, *, wiring: Wiring, unreachable: dict[str, str] | None = None) -> RunState:
    """The launcher's view of the run's job joined with its latest checkpoint (the record
    learns the job's newer state)."""
    job, job_error = _job_status(record, wiring)
    manifest, progress_error = _progress(record, wiring, {} if unreachable is None else unreachable)
    state = job.state.value if job else record.state
    detail = job_error or (job.detail if job else None)
    if job and job.failure_reason:
        detail = f"{detail}: {job.failure_reason}" if detail else job.failure_reason
    if job and job.exit_code == STOPPED_WITH_CHECKPOINT and manifest is None and progress_error is None:
        # the wrapper's "stopped after a checkpoint" code, from a script that never committed one
        code = for_outcome(job.state.value, has_checkpoint=False)
        detail = f"exit code {code}: stopped with no checkpoint to resume from (a resume starts at step 0)"
    completed = manifest is not None and manifest.meta.get("state") == "completed"
    if settled_state(state, completed=completed) != state and manifest is not None:
        state = JobState.SUCCEEDED.value
        ended = f" (the job: {detail})" if detail else ""
        detail = f"finished: its final checkpoint, step {manifest.step}, is committed{ended}"
    if job and state != record.state:
        wiring.registry.save(dataclasses.replace(record, state=state))
    if manifest and manifest.meta.get("state") == BUDGET_STATE and (job is None or job.state.terminal):
        state, detail = (
            BUDGET_STATE.upper(),
            f"stopped at its budget; raise it with `skygreen resume {record.run_id} --budget-usd N`",
        )
    return RunState(job=job, state=state, detail=detail, manifest=manifest, progress_error=progress_error)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumePoint:
    """Where a relaunch of a run continues: the step of its latest checkpoint, or from scratch."""

    step: int | None
    from_scratch: bool
    """No checkpoint in the bucket (and the bucket answered): training starts again at step 0."""
    note: str | None
    """One line for the user when it restarts from step 0."""


def resume_point(record: RunRecord, *, wiring: Wiring) -> ResumePoint:
    """The run's latest checkpoint, read before a relaunch; a bucket that does not answer is no
    claim either way (the relaunch's own bucket check says what is wrong)."""
    manifest, error = _progress(record, wiring, {})
    if manifest is not None:
        return ResumePoint(step=manifest.step, from_scratch=False, note=None)
    if error is not None:
        return ResumePoint(step=None, from_scratch=False, note=None)
    note = f"no checkpoint in {record.checkpoint_url} yet: the run restarts from step 0"
    return ResumePoint(step=None, from_scratch=True, note=note)


def run_status(record: RunRecord, *, wiring: Wiring, unreachable: dict[str, str] | None = None) -> RunStatus:
    """One run's state: its launcher's view joined with the progress in its bucket."""
    unreachable = {} if unreachable is None else unreachable
    current = run_state(record, wiring=wiring, unreachable=unreachable)
    job, manifest, meta = current.job, current.manifest, current.meta
    cost = ledger_cost(record, open_store=wiring.open_store)
    spend, estimated = run_spend(record, job, cost, job_status_of=lambda job_id: _job_status_of(record, job_id, wiring))
    energy = _run_energy(cost, meta, job if record.mode != LOCAL else None)
    segments = _segments(record, wiring) if record.bucket not in unreachable else []
    return RunStatus(
        run_id=record.run_id,
        task=record.task_path,
        mode=record.mode,
        state=current.state,
        detail=current.detail,
        job_id=record.job_id,
        launches=len(record.launches),
        step=manifest.step if manifest else None,
        model_sha256=manifest.model_sha256 if manifest else None,
        checkpoint_at=manifest.created_at if manifest else None,
        completed=current.completed,
        preemptions=cost.preemptions if cost is not None else _int_or_none(meta.get("preemptions")),
        recoveries=(job.recovery_count if job else 0) + max(0, len(record.launches) - 1),
        spend_usd=spend,
        spend_estimated=estimated,
        energy_kwh=energy.energy_kwh,
        wall_s=_float_or_none(meta.get("wall_s")),
        checkpoint_interval_s=_float_or_none(meta.get("checkpoint_interval_s")),
        where=_where(job),
        checkpoint_url=record.checkpoint_url,
        progress_error=current.progress_error,
        unreachable_bucket=record.checkpoint_url if record.bucket in unreachable else None,
        energy=_energy(meta, energy, job if record.mode != LOCAL else None) if manifest else None,
        deadline=_deadline(record, wiring),
        changeovers=_changeovers(segments) if manifest else [],
        memory=memory_view(segments),
        job_duration_s=job.duration_s if job else None,
        gpu_energy_kwh=energy.gpu_energy_kwh,
        co2e_kg=energy.co2e_kg,
        compute_usd=cost.compute_usd if cost is not None else spend,
        checkpoint_save=_checkpoint_save(record, manifest, segments),
    )


def _checkpoint_save(
    record: RunRecord, manifest: Manifest | None, segments: Sequence[Segment]
) -> dict[str, Any] | None:
    """`RunStatus.checkpoint_save` (`skygreen.costs.costing.checkpoint_save`)."""
    from skygreen.costs.costing import checkpoint_save

    found = checkpoint_save(record.checkpoint_url, manifest, segments, record.spec_snapshot)
    return None if found is None else dict(found.to_json())


def _run_energy(cost: RunCost | None, meta: Mapping[str, Any], job: JobStatus | None) -> RunEnergy:
    """The ledger's energy, segment by segment, as `cost` reads it (None where it metered
    nothing: a CPU, no NVML); only a run without a ledger reads the checkpoint's joules, at the
    place the job reports."""
    from skygreen.power.statement import meta_energy

    if cost is not None:
        return cost.energy
    return meta_energy(meta, cloud=job.cloud if job else None, region=job.region if job else None)


def _changeovers(segments: Sequence[Segment]) -> list[dict[str, Any]]:
    """Each resumed segment's changeover, as JSON."""
    from skygreen.ledger.changeover import changeovers

    return [c.to_json() for c in changeovers(segments)]


def _segments(record: RunRecord, wiring: Wiring) -> list[Segment]:
    """The run's ledger segments (changeovers, memory); none when the ledger cannot be read."""
    from skygreen.ledger.io import read_ledger

    try:
        return read_ledger(wiring.open_store(record.checkpoint_url))
    except SkygreenError:
        return []


def memory_view(segments: Sequence[Segment]) -> dict[str, Any] | None:
    """The plan's memory per GPU and the peak the runtime measured, side by side: the newest
    segment that measured one (else the newest that carries the plan's); None when no segment
    carries either."""
    measured = [s for s in segments if s.memory_peak_gb is not None]
    planned = [s for s in segments if s.memory_planned_gb is not None]
    if not measured and not planned:
        return None
    seg = (measured or planned)[-1]
    plan = (
        seg.memory_planned_gb
        if seg.memory_planned_gb is not None
        else planned[-1].memory_planned_gb
        if planned
        else None
    )
    return {
        "planned_gb": None if plan is None else dict(plan),
        "peak_gb": seg.memory_peak_gb,
        "measure": seg.memory_measure,
        "segment": seg.segment,
    }


def _deadline(record: RunRecord, wiring: Wiring) -> dict[str, Any] | None:
    if record.deadline is None:
        return None
    from skygreen.deadline.clock import now_s
    from skygreen.deadline.status import deadline_status

    return deadline_status(record, run_dir=wiring.registry.run_dir(record.run_id), now_s=now_s(wiring.environ))


def _energy(meta: Mapping[str, Any], energy: RunEnergy, job: JobStatus | None) -> dict[str, Any]:
    from skygreen.power.statement import energy_report

    return energy_report(meta, energy, cloud=job.cloud if job else None).to_json()


def _job_status(record: RunRecord, wiring: Wiring) -> tuple[JobStatus | None, str | None]:
    if record.job_id is None:
        return None, None
    try:
        return launcher_for(record, wiring).status(record.job_id), None
    except LaunchError as e:
        return None, str(e).splitlines()[0]


def _progress(record: RunRecord, wiring: Wiring, unreachable: dict[str, str]) -> tuple[Manifest | None, str | None]:
    """The run's latest committed checkpoint (no torch involved), or None and a one-line error.
    `unreachable` maps the buckets that did not answer to their error, filled in here and
    skipped after."""
    if record.bucket in unreachable:
        return None, unreachable[record.bucket]
    try:
        return within_deadline(record.bucket, lambda: latest_manifest(wiring.open_store(record.checkpoint_url))), None
    except BucketUnreachableError as e:
        unreachable[record.bucket] = str(e)
        return None, str(e)
    except (StoreError, CheckpointError) as e:
        return None, str(e).splitlines()[0]


def _job_status_of(record: RunRecord, job_id: str, wiring: Wiring) -> JobStatus | None:
    try:
        return launcher_for(record, wiring).status(job_id)
    except LaunchError:
        return None


def _where(job: JobStatus | None) -> str | None:
    if job is None or job.cloud is None:
        return None
    return "/".join(p for p in (job.cloud, job.region) if p)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def ledger_cost(record: RunRecord, *, open_store: OpenStore) -> RunCost | None:
    """The run's cost from its ledger, priced by `skygreen.costs.costing.load_run_cost`, the same
    function `skygreen cost` and `compare` use: `status` takes its spend and its preemptions from
    it, so the commands agree. None without a ledger, or when it (or the catalog) cannot be read."""
    from skygreen.costs.costing import load_run_cost

    try:
        return load_run_cost(record, open_store=open_store)
    except SkygreenError:  # an unreadable ledger or catalog: the caller falls back to the launcher's view
        return None


def run_spend(
    record: RunRecord,
    job: JobStatus | None,
    cost: RunCost | None,
    *,
    job_status_of: Callable[[str], JobStatus | None],
) -> tuple[float | None, bool]:
    """Spend of every launch of the run so far, and whether any part of it is a guess.

    From the run's ledger cost when it has one (`ledger_cost`). Otherwise (a run
    from a runtime without a ledger):
    SkyPilot reports no cost per managed job, so each launch costs its job's run time times
    the catalog price of the offer it landed on; a job that does not say where it runs is
    priced at the plan's best offer (a guess). `job` is the current launch's status, already
    fetched; earlier launches (before a `resume`) are asked for theirs. A launch whose status
    is gone from SkyPilot's queue is left out."""
    if cost is not None:  # the run ledger (`ledger_cost`)
        return cost.total_usd, cost.unpriced_segments > 0
    if record.mode == "local":
        return 0.0, False
    offers = list((record.plan_summary or {}).get("offers", ()))
    if not offers:
        return None, False
    jobs = [job_status_of(launch.job_id) for launch in record.launches[:-1]] + [job]
    priced = [_launch_spend(offers, j) for j in jobs if j is not None and j.duration_s is not None]
    if not priced:
        return None, False
    return sum(usd for usd, _ in priced), any(guessed for _, guessed in priced)


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
