"""The one narrow seam between skygreen and whatever runs a rendered task.

Two real launchers implement it: `skygreen.launch.skypilot_launcher.SkyPilotLauncher` (managed spot
jobs) and `skygreen.launch.local_launcher.LocalLauncher` (`--local`, this machine). Tests of
the CLI flows use `skygreen.testing.FakeLauncher`, selected by the environment variable
`SKYGREEN_LAUNCHER=module:factory` so no internals are patched (`skygreen.launch.launcher_factory`
builds them; the core only ever receives one).

Job states are skygreen's own small enum, so the run registry and `skygreen status` never
depend on SkyPilot's spelling (which grows between releases).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TextIO, runtime_checkable


class JobState(str, enum.Enum):
    """Where a launched job is in its life, from the launcher's point of view."""

    PENDING = "PENDING"
    """Submitted, waiting for resources or the controller."""
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    """Preempted (or failed with a recoverable code) and being relaunched by SkyPilot."""
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    """Ended without finishing and without failing: a local run killed, or preempted with
    nothing left to recover it. `skygreen resume` continues it."""
    UNKNOWN = "UNKNOWN"
    """The launcher no longer knows the job (its records are gone)."""

    @property
    def terminal(self) -> bool:
        """The job has ended: succeeded, cancelled, failed, stopped, or no longer known to the launcher."""
        return self in _TERMINAL

    @property
    def resumable(self) -> bool:
        """A run in this state can be relaunched by `skygreen resume`."""
        return self in _RESUMABLE


_JOB_RUN_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}\Z")
"""A run id (`skygreen.launch.registry.check_run_id`), as a job's name starts."""


def launch_name(run_id: str, launch: int) -> str:
    """The name of the job of the run's `launch`-th launch: `<run_id>-<launch>`. Every launcher
    gets it, so a job whose launch call never returned (the command was killed inside it) can
    still be told apart and tied to its run (`run_of_job`)."""
    return f"{run_id}-{launch}"


def run_of_job(name: str) -> tuple[str, int] | None:
    """The run id and launch number a job name carries (`launch_name`), or None for another name."""
    run_id, sep, number = (name or "").rpartition("-")
    if not sep or not number.isdecimal() or not _JOB_RUN_ID.match(run_id):
        return None
    return run_id, int(number)


_TERMINAL = {JobState.SUCCEEDED, JobState.CANCELLED, JobState.FAILED, JobState.STOPPED, JobState.UNKNOWN}
_RESUMABLE = {JobState.CANCELLED, JobState.FAILED, JobState.STOPPED, JobState.UNKNOWN}


def settled_state(state: str, *, completed: bool) -> str:
    """The state a run reads once its job has ended: SUCCEEDED when its final checkpoint is
    committed (`completed`), whatever ended the job (its wrapper killed while the trainer
    finished, a cancel after the last commit), for STOPPED and the other resumable states
    promise that `skygreen resume` continues the run, and this one has nothing left to do.
    Any other state (still running, BUDGET, not a job state) is returned as it is."""
    if completed and state in JobState.__members__ and JobState(state).terminal:
        return JobState.SUCCEEDED.value
    return state


@dataclass(frozen=True, kw_only=True, slots=True)
class JobStatus:
    """One job as its launcher sees it."""

    job_id: str
    state: JobState
    recovery_count: int = 0
    duration_s: float | None = None
    """Time the job has run on a cluster (SkyPilot's job_duration; wall time for local runs)."""
    cloud: str | None = None
    region: str | None = None
    accelerators: Mapping[str, float] | None = None
    failure_reason: str | None = None
    exit_code: int | None = None
    detail: str | None = None
    """The launcher's own status word (e.g. SkyPilot's FAILED_NO_RESOURCE), for display."""

    def __post_init__(self) -> None:
        if self.recovery_count < 0:
            raise ValueError("recovery_count must be >= 0")

    def to_json(self) -> dict[str, Any]:
        """The status as plain JSON values: the state by its value, accelerators as a dict (None when none)."""
        return {
            "job_id": self.job_id,
            "state": self.state.value,
            "recovery_count": self.recovery_count,
            "duration_s": self.duration_s,
            "cloud": self.cloud,
            "region": self.region,
            "accelerators": dict(self.accelerators) if self.accelerators else None,
            "failure_reason": self.failure_reason,
            "exit_code": self.exit_code,
            "detail": self.detail,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchedJob:
    """One job in a launcher's own list, by the name it was launched with."""

    job_id: str
    name: str
    state: JobState | None = None
    """None when the list does not say (ask `status`)."""


@runtime_checkable
class Launcher(Protocol):
    """Runs rendered tasks. Every method raises `skygreen.errors.LaunchError` (with the fix)
    when the backend refuses; none of them prints."""

    kind: str
    """"skypilot", "local", or a fake's name: recorded with the run."""

    def launch(self, task: Mapping[str, Any], *, name: str, secrets: Mapping[str, str] | None = None) -> str:
        """Start the task; returns the job id. `secrets` are values for the task's declared
        secret names, handed over in memory only."""
        ...

    def status(self, job_id: str) -> JobStatus:
        """The job's state now, as the backend sees it."""
        ...

    def cancel(self, job_id: str) -> None:
        """Stop the job; returns once the backend has taken the request."""
        ...

    def logs(self, job_id: str, *, follow: bool, out: TextIO) -> int | None:
        """Write the job's output to `out`; with `follow`, until it ends (returns its exit
        code where known)."""
        ...


def launcher_jobs(launcher: Launcher) -> list[LaunchedJob] | None:
    """The launcher's own list of jobs (its optional `jobs()` method), so `status` can find jobs
    no record knows; None for a launcher that cannot list them."""
    jobs = getattr(launcher, "jobs", None)
    return None if jobs is None else list(jobs())
