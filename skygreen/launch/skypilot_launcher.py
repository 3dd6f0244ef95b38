"""SkyPilot behind the `skygreen.launch.launcher.Launcher` seam: managed spot jobs.

The only module that imports `sky` to launch (lazily: `import sky` costs about 2.3 s). It
takes an already-rendered task dict; it never renders. SkyPilot's errors become
`LaunchError`s by one table keyed by exception class name (walking the class's MRO, so
subclasses map too), each with the fix a user can apply: `sky check`, `sky api start`,
`skygreen plan`, or `--local` to run on this machine instead.

SkyPilot's client talks to an API server it starts on 127.0.0.1 (port 46580, or
`SKYPILOT_API_SERVER_LOCAL_PORT`) on the first call that needs it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, TextIO

from skygreen.errors import LaunchError
from skygreen.launch.launcher import JobState, JobStatus, LaunchedJob

_LOCAL_FIX = "or run on this machine with `skygreen up TASK --local`"

# SkyPilot exception class name -> (what happened, how to fix it).
ERROR_TABLE: dict[str, tuple[str, str]] = {
    "NoCloudAccessError": (
        "SkyPilot has no cloud enabled (no credentials for AWS, GCP or Azure)",
        f"run `sky check` and follow its instructions for your cloud, {_LOCAL_FIX}",
    ),
    "InvalidCloudCredentials": (
        "SkyPilot rejected the cloud credentials",
        f"run `sky check` to see which cloud's credentials are wrong, {_LOCAL_FIX}",
    ),
    "CloudUserIdentityError": (
        "SkyPilot could not read your cloud identity",
        f"run `sky check`; log in to the cloud's CLI again, {_LOCAL_FIX}",
    ),
    "CloudError": (
        "SkyPilot failed talking to a cloud or fetching its price catalog",
        f"check the network and `sky check`, {_LOCAL_FIX}",
    ),
    "ClusterNotUpError": (
        "the SkyPilot jobs controller is not up",
        "run `sky jobs queue --refresh` to start it (it stops itself when idle), then retry",
    ),
    "ManagedJobStatusError": (
        "SkyPilot could not read the managed job's status",
        "run `sky jobs queue --refresh`, then retry",
    ),
    "ResourcesUnavailableError": (
        "no offer in the plan could be provisioned",
        "see `skygreen plan TASK`; allow more GPUs, clouds or regions, or on_demand_fallback: true",
    ),
    "ProvisionPrechecksError": (
        "SkyPilot's pre-launch checks failed",
        f"run `sky check`, {_LOCAL_FIX}",
    ),
    "ManagedJobReachedMaxRetriesError": (
        "SkyPilot gave up relaunching the job",
        "`skygreen resume RUN` relaunches it from its last checkpoint",
    ),
    "ApiServerConnectionError": (
        "cannot reach the SkyPilot API server",
        "run `sky api start` (or `sky api info` to see which server is configured), then retry",
    ),
    "ApiServerAuthenticationError": (
        "the SkyPilot API server needs a login",
        "run `sky api login`, then retry",
    ),
    "APIVersionMismatchError": (
        "the SkyPilot API server runs another version than this client",
        "run `sky api stop` and retry (a local server restarts at this version), or upgrade the server",
    ),
    "PermissionDeniedError": (
        "SkyPilot denied the request",
        "ask the API server's admin for access, or check `sky api info`",
    ),
    "NotSupportedError": (
        "SkyPilot does not support this request",
        "check the rendered YAML (`skygreen up TASK --dryrun`) against SkyPilot's docs",
    ),
    "ConnectionError": (
        "a network connection failed while talking to SkyPilot",
        "check the network and `sky api info`, then retry",
    ),
    "ValueError": (
        "SkyPilot rejected the task",
        "check the rendered YAML with `skygreen up TASK --dryrun`",
    ),
}

# SkyPilot's ManagedJobStatus value -> skygreen's JobState.
STATE_TABLE: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "SUBMITTED": JobState.PENDING,
    "STARTING": JobState.STARTING,
    "RUNNING": JobState.RUNNING,
    "WINDING_DOWN": JobState.RUNNING,
    "RECOVERING": JobState.RECOVERING,
    "CANCELLING": JobState.CANCELLING,
    "SUCCEEDED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "FAILED_SETUP": JobState.FAILED,
    "FAILED_PRECHECKS": JobState.FAILED,
    "FAILED_NO_RESOURCE": JobState.FAILED,
    "FAILED_CONTROLLER": JobState.FAILED,
}

_STATUS_FIELDS = (
    "job_id", "task_id", "job_name", "task_name", "status", "job_duration", "recovery_count",
    "submitted_at", "end_at", "cloud", "region", "infra", "accelerators", "failure_reason",
)  # fmt: skip


def launch_error(error: BaseException, action: str) -> LaunchError:
    """The skygreen error for a SkyPilot failure during `action` (launch, status, ...)."""
    for cls in type(error).__mro__:
        if cls.__name__ in ERROR_TABLE:
            what, fix = ERROR_TABLE[cls.__name__]
            return LaunchError(f"{action} failed: {what}\n  detail: {_first_line(error)}\n  fix: {fix}")
    return LaunchError(
        f"{action} failed: {type(error).__name__}: {_first_line(error)}\n  fix: run with SKYGREEN_DEBUG=1 for the full error; `sky check` tests the cloud setup"
    )


def describe_failure(class_name: str, detail: str, action: str) -> LaunchError:
    """The same error `launch_error` gives for a SkyPilot exception of that class name
    (used by fakes, so they fail exactly as the real adapter does)."""
    error_type = type(class_name, (Exception,), {})
    return launch_error(error_type(detail), action)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:500]


def _sky():
    import sky

    return sky


class LocalServerWatch:
    """Whether a SkyPilot call started SkyPilot's local API server.

    The client starts one on 127.0.0.1 on its first call when none answers, and leaves it
    running. When the call then fails, the user should hear that a server now runs because of
    skygreen, and how to stop it (`sky api stop`); a server that was already up, or a remote
    one, is not skygreen's business."""

    def __init__(self) -> None:
        from sky.server import common

        self.url = common.get_server_url()
        self.local = bool(common.is_api_server_local(self.url))
        self.was_up = self.local and _answers(self.url)

    def note(self) -> str | None:
        """One line for a failure, when this process started the local server."""
        if self.local and not self.was_up and _answers(self.url):
            return f"SkyPilot's API server at {self.url} was started by this command and is still running; stop it with `sky api stop`"
        return None

    def annotate(self, error: LaunchError) -> LaunchError:
        """`error` with the note about the local API server added (its cause kept) when there is one
        to give; else `error` itself."""
        line = self.note()
        if line is None:
            return error
        annotated = LaunchError(f"{error}\n  note: {line}")
        annotated.__cause__ = error.__cause__
        return annotated


def _answers(url: str) -> bool:
    import socket
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80), timeout=1.0):
            return True
    except OSError:
        return False


class SkyPilotLauncher:
    """Managed jobs through SkyPilot's Python SDK (`sky.jobs.launch` and friends)."""

    kind = "skypilot"
    queues_for_spot = True
    """A managed spot job waits for capacity (and recovers) by itself: a deadline watcher's "wait for spot"."""

    def build_task(self, task: Mapping[str, Any], secrets: Mapping[str, str] | None = None):
        """A real `sky.Task` from a rendered dict (a deep copy: SkyPilot pops keys). Secret
        values join the task here, in memory, as SkyPilot's own `--secret` overrides do."""
        sky = _sky()
        try:
            return sky.Task.from_yaml_config(
                copy.deepcopy(dict(task)),
                secrets_overrides=list((secrets or {}).items()) or None,
            )
        except Exception as e:  # SkyPilot raises ValueError and its own types
            raise launch_error(e, "building the SkyPilot task") from e

    def launch(self, task: Mapping[str, Any], *, name: str, secrets: Mapping[str, str] | None = None) -> str:
        """Submit the task as a managed job (`sky.jobs.launch`, streamed to the end of the request);
        returns SkyPilot's job id. Raises `LaunchError` with the fix when the task cannot be built,
        SkyPilot refuses, or it returns no job id; a refusal also says when this call started the
        local API server.
        """
        sky_task = self.build_task(task, secrets)
        sky = _sky()
        watch = LocalServerWatch()
        try:
            job_ids, _handle = sky.stream_and_get(sky.jobs.launch(sky_task, name=name))
        except Exception as e:
            raise watch.annotate(launch_error(e, "launching the managed job")) from e
        if not job_ids:
            raise LaunchError(
                "launching the managed job failed: SkyPilot returned no job id\n  fix: check `sky jobs queue`"
            )
        return str(job_ids[0])

    def status(self, job_id: str) -> JobStatus:
        """The managed job's state from `sky jobs queue` (not refreshed); UNKNOWN when the queue no longer
        lists it. Raises `LaunchError` when the queue cannot be read.
        """
        sky = _sky()
        try:
            request = sky.jobs.queue_v2(
                refresh=False, skip_finished=False, job_ids=[int(job_id)], fields=list(_STATUS_FIELDS)
            )
            records = sky.get(request)[0]
        except Exception as e:
            raise launch_error(e, f"reading managed job {job_id}") from e
        mine = [r for r in records if str(getattr(r, "job_id", None)) == str(job_id)]
        if not mine:
            return JobStatus(job_id=str(job_id), state=JobState.UNKNOWN, detail="not in `sky jobs queue`")
        return status_from_record(job_id, mine)

    def jobs(self) -> list[LaunchedJob]:
        """The managed jobs that have not finished, from `sky jobs queue` (not refreshed), by name,
        each job once (a pipeline lists a record per task). No jobs controller up means no job in
        progress (SkyPilot raises `ClusterNotUpError` then): an empty list. Raises `LaunchError`
        when the queue cannot be read."""
        sky = _sky()
        try:
            request = sky.jobs.queue_v2(refresh=False, skip_finished=True, fields=["job_id", "job_name", "status"])
            records = sky.get(request)[0]
        except Exception as e:
            if type(e).__name__ == "ClusterNotUpError":
                return []
            raise launch_error(e, "reading the managed jobs queue") from e
        jobs: dict[str, LaunchedJob] = {}
        for r in records:
            job_id = str(getattr(r, "job_id", ""))
            jobs.setdefault(job_id, LaunchedJob(
                job_id=job_id,
                name=str(getattr(r, "job_name", "") or ""),
                state=STATE_TABLE.get(_status_word(r), JobState.UNKNOWN),
            ))  # fmt: skip
        return list(jobs.values())

    def cancel(self, job_id: str) -> None:
        """Cancel the managed job (`sky.jobs.cancel`) and wait for SkyPilot's answer. Raises
        `LaunchError` when it refuses."""
        sky = _sky()
        watch = LocalServerWatch()
        try:
            sky.get(sky.jobs.cancel(job_ids=[int(job_id)]))
        except Exception as e:
            raise watch.annotate(launch_error(e, f"cancelling managed job {job_id}")) from e

    def logs(self, job_id: str, *, follow: bool, out: TextIO) -> int | None:
        """Stream the managed job's logs to `out` (`sky.jobs.tail_logs`); with `follow`, until it ends.
        Returns SkyPilot's return value: the code it gives for how the job ended, where it gives
        one. Raises `LaunchError` when SkyPilot fails.
        """
        sky = _sky()
        watch = LocalServerWatch()
        try:
            return sky.jobs.tail_logs(job_id=int(job_id), follow=follow, output_stream=out)
        except Exception as e:
            raise watch.annotate(launch_error(e, f"reading the logs of managed job {job_id}")) from e


def status_from_record(job_id: str, records: list[Any]) -> JobStatus:
    """skygreen's status from SkyPilot's `ManagedJobRecord`s of one job (one per task; a
    skygreen job has one task, a pipeline reports its least advanced task)."""
    record = records[0]
    for other in records[1:]:
        if STATE_TABLE.get(_status_word(other), JobState.UNKNOWN).terminal is False:
            record = other
            break
    word = _status_word(record)
    accelerators = getattr(record, "accelerators", None)
    return JobStatus(
        job_id=str(job_id),
        state=STATE_TABLE.get(word, JobState.UNKNOWN),
        recovery_count=int(getattr(record, "recovery_count", None) or 0),
        duration_s=_float_or_none(getattr(record, "job_duration", None)),
        cloud=_lower_or_none(getattr(record, "cloud", None)),
        region=getattr(record, "region", None),
        accelerators=dict(accelerators) if accelerators else None,
        failure_reason=getattr(record, "failure_reason", None),
        detail=word,
    )


def _status_word(record: Any) -> str:
    status = getattr(record, "status", None)
    return str(getattr(status, "value", status) or "")


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _lower_or_none(value: Any) -> str | None:
    return None if value is None else str(value).lower()
