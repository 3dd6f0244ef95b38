"""Fakes of the outermost edges, shipped so that users' and skygreen's own tests can use them.

`FakeLauncher` stands in for SkyPilot's managed jobs where no cloud can be reached: select it
with `SKYGREEN_LAUNCHER=skygreen.testing:FakeLauncher`. It keeps its jobs in a JSON file
(`$SKYGREEN_FAKE_LAUNCHER_DIR/jobs.json`), so separate `skygreen` invocations see the same
jobs, and it fails the way the real adapter fails: `SKYGREEN_FAKE_LAUNCHER_FAIL=<action>:<SkyPilot
exception class>` (actions: launch, status, cancel, logs) raises exactly the `LaunchError` the
SkyPilot adapter raises for that exception. Like SkyPilot's client, it rejects a task whose
`envs` hold a null, whose recovery strategy SkyPilot does not know, or that has no `run`.
It never stores secret values: only which names were given a value at launch.
A launch takes SkyPilot a while; `SKYGREEN_FAKE_LAUNCHER_HOLD=DIR` makes a test choose what
happens meanwhile: `launch` stores the job (a submitted request creates its managed job even if
the client dies), writes `DIR/launching` and returns once `DIR/release` exists.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from skygreen.errors import LaunchError
from skygreen.launch.launcher import JobState, JobStatus, LaunchedJob

FAKE_DIR_ENV = "SKYGREEN_FAKE_LAUNCHER_DIR"
FAKE_FAIL_ENV = "SKYGREEN_FAKE_LAUNCHER_FAIL"
FAKE_HOLD_ENV = "SKYGREEN_FAKE_LAUNCHER_HOLD"
HOLD_TIMEOUT_S = 300.0
_ACTIONS = {
    "launch": "launching the managed job",
    "status": "reading managed job {job_id}",
    "cancel": "cancelling managed job {job_id}",
    "logs": "reading the logs of managed job {job_id}",
}
_STRATEGIES = ("EAGER_NEXT_REGION", "FAILOVER")


class FakeLauncher:
    """Managed jobs that live in a JSON file; tests move them along with `set_state`."""

    kind = "fake"

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is None:
            if not os.environ.get(FAKE_DIR_ENV):
                raise LaunchError(f"FakeLauncher needs {FAKE_DIR_ENV} (a folder for its job table)")
            root = os.environ[FAKE_DIR_ENV]
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ Launcher

    def launch(self, task: Mapping[str, Any], *, name: str, secrets: Mapping[str, str] | None = None) -> str:
        """Store the task as a new PENDING job and return its id (one more than the highest so far).
        Raises the `LaunchError` that `SKYGREEN_FAKE_LAUNCHER_FAIL` asks for, or the one SkyPilot's
        client would for a task it rejects; of `secrets` only the names are kept."""
        self._maybe_fail("launch", "")
        _check_task(task)
        jobs = self._jobs()
        job_id = str(max((int(j) for j in jobs), default=0) + 1)
        jobs[job_id] = {
            "name": name,
            "state": JobState.PENDING.value,
            "recovery_count": 0,
            "submitted_at": time.time(),
            "duration_s": 0.0,
            "cloud": None,
            "region": None,
            "accelerators": None,
            "task": dict(task),
            "secrets_given": sorted((secrets or {}).keys()),
            "log": [f"fake: managed job {job_id} ({name}) submitted"],
        }
        self._save(jobs)
        _hold_launch()  # submitted: the job exists, as a managed job does once its request is in
        return job_id

    def jobs(self) -> list[LaunchedJob]:
        """Every job in the table, as `sky jobs queue` lists them (a `status` failure fails this too)."""
        self._maybe_fail("status", "")
        return [
            LaunchedJob(job_id=job_id, name=job["name"], state=JobState(job["state"]))
            for job_id, job in sorted(self._jobs().items(), key=lambda item: int(item[0]))
        ]

    def status(self, job_id: str) -> JobStatus:
        """The job as stored; an UNKNOWN status, not an error, for an id the table does not hold."""
        self._maybe_fail("status", job_id)
        job = self._jobs().get(str(job_id))
        if job is None:
            return JobStatus(job_id=str(job_id), state=JobState.UNKNOWN, detail="not in `sky jobs queue`")
        return JobStatus(
            job_id=str(job_id),
            state=JobState(job["state"]),
            recovery_count=job["recovery_count"],
            duration_s=job["duration_s"],
            cloud=job["cloud"],
            region=job["region"],
            accelerators=job["accelerators"],
            failure_reason=job.get("failure_reason"),
            detail=job.get("detail", job["state"]),
        )

    def cancel(self, job_id: str) -> None:
        """Mark the job CANCELLED unless it has already ended; an unknown id is ignored, as SkyPilot does."""
        self._maybe_fail("cancel", job_id)
        jobs = self._jobs()
        job = jobs.get(str(job_id))
        if job is None:  # SkyPilot says nothing for an unknown id either
            return
        if not JobState(job["state"]).terminal:
            job["state"] = JobState.CANCELLED.value
            job["log"].append(f"fake: managed job {job_id} cancelled")
        self._save(jobs)

    def logs(self, job_id: str, *, follow: bool, out: TextIO) -> int | None:
        """Write the job's log lines so far to `out` and return at once, `follow` or not: 0 for a
        SUCCEEDED job, 100 for FAILED, 103 for CANCELLED, None in any other state. A `LaunchError`
        for an unknown id."""
        self._maybe_fail("logs", job_id)
        job = self._jobs().get(str(job_id))
        if job is None:
            raise LaunchError(
                f"reading the logs of managed job {job_id} failed: no such job\n  fix: `sky jobs queue` lists the jobs"
            )
        for line in job["log"]:
            out.write(line + "\n")
        state = JobState(job["state"])
        return {JobState.SUCCEEDED: 0, JobState.CANCELLED: 103}.get(state, 100 if state is JobState.FAILED else None)

    # ------------------------------------------------------------ for tests

    def set_state(
        self,
        job_id: str,
        state: JobState | str,
        *,
        recovery_count: int | None = None,
        duration_s: float | None = None,
        cloud: str | None = None,
        region: str | None = None,
        accelerators: Mapping[str, float] | None = None,
        failure_reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Move a job along, as SkyPilot's controller would."""
        jobs = self._jobs()
        job = jobs[str(job_id)]
        job["state"] = JobState(state).value
        updates = {
            "recovery_count": recovery_count,
            "duration_s": duration_s,
            "cloud": cloud,
            "region": region,
            "accelerators": dict(accelerators) if accelerators else None,
            "failure_reason": failure_reason,
            "detail": detail,
        }
        job.update({k: v for k, v in updates.items() if v is not None})
        job["log"].append(f"fake: managed job {job_id} is {job['state']}")
        self._save(jobs)

    def job(self, job_id: str) -> dict[str, Any]:
        """The stored job: its task as launched, the secret names given values, its log."""
        return self._jobs()[str(job_id)]

    # ------------------------------------------------------------ storage

    def _maybe_fail(self, action: str, job_id: str) -> None:
        spec = os.environ.get(FAKE_FAIL_ENV, "")
        wanted, _, class_name = spec.partition(":")
        if wanted == action and class_name:
            from skygreen.launch.skypilot_launcher import describe_failure

            raise describe_failure(
                class_name, f"(fake) {class_name} raised by SkyPilot", _ACTIONS[action].format(job_id=job_id)
            )

    def _jobs(self) -> dict[str, dict[str, Any]]:
        try:
            return json.loads((self.root / "jobs.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def _save(self, jobs: Mapping[str, Any]) -> None:
        tmp = self.root / "jobs.json.tmp"
        tmp.write_text(json.dumps(jobs, indent=1), encoding="utf-8")
        os.replace(tmp, self.root / "jobs.json")


def _hold_launch() -> None:
    """With `SKYGREEN_FAKE_LAUNCHER_HOLD=DIR`: say the launch is under way, wait for the release."""
    hold = os.environ.get(FAKE_HOLD_ENV)
    if not hold:
        return
    (Path(hold) / "launching").touch()
    waited_s = 0.0
    while not (Path(hold) / "release").exists():
        if waited_s > HOLD_TIMEOUT_S:
            raise LaunchError(f"fake launch held for {HOLD_TIMEOUT_S:g} s and never released ({hold}/release)")
        time.sleep(0.05)
        waited_s += 0.05


def _check_task(task: Mapping[str, Any]) -> None:
    """The client-side checks of `sky.Task.from_yaml_config` a rendered task can trip."""
    if not task.get("run"):
        raise LaunchError(
            "building the SkyPilot task failed: SkyPilot rejected the task\n  detail: no run command\n  fix: check the rendered YAML with `skygreen up TASK --dryrun`"
        )
    for key, value in (task.get("envs") or {}).items():
        if value is None:
            raise LaunchError(
                f"building the SkyPilot task failed: SkyPilot rejected the task\n  detail: Environment variable {key!r} is None.\n  fix: check the rendered YAML with `skygreen up TASK --dryrun`"
            )
    recovery = (task.get("resources") or {}).get("job_recovery") or {}
    strategy = recovery.get("strategy") if isinstance(recovery, Mapping) else recovery
    if strategy is not None and str(strategy).upper() not in _STRATEGIES:
        raise LaunchError(
            f"launching the managed job failed: SkyPilot rejected the task\n  detail: unknown job recovery strategy {strategy!r}\n  fix: use EAGER_NEXT_REGION or FAILOVER"
        )


class FakeDeviceMemory:
    """A GPU's memory where there is none (CPU tests of `micro: auto`), as `DeviceMemory` reads it
    (`skygreen.runtime.autotune`), and failing as a full GPU fails.

    Once `install`ed on a module, each forward of it takes `base_bytes + bytes_per_sample x rows`
    (rows: the first input's first dimension) as its peak; above `capacity_bytes` it raises
    torch's own `OutOfMemoryError` with CUDA's message, as an allocation on a full GPU does.

    Args:
        capacity_bytes: the device's total memory.
        base_bytes: what a step holds whatever its micro-batch (weights, gradients, optimizer states).
        bytes_per_sample: activation memory per sample of a micro-batch.
    """

    def __init__(self, *, capacity_bytes: int, base_bytes: int, bytes_per_sample: int) -> None:
        self._capacity = capacity_bytes
        self.base_bytes = base_bytes
        self.bytes_per_sample = bytes_per_sample
        self._peak = 0
        self.out_of_memory: list[int] = []
        """The micro-batch sizes that ran out of memory."""

    def install(self, module: Any) -> None:
        """Charge each forward of `module` to this memory."""
        module.register_forward_pre_hook(lambda _module, inputs: self.allocate(int(inputs[0].shape[0])))

    def allocate(self, rows: int) -> None:
        """A forward over `rows` samples: the peak it reaches, or CUDA's out-of-memory error."""
        import torch

        need = self.base_bytes + self.bytes_per_sample * rows
        if need > self._capacity:
            self.out_of_memory.append(rows)
            mib = self.bytes_per_sample * rows / 2**20
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {mib:.2f} MiB. GPU 0 has a total capacity of "
                f"{self._capacity / 2**30:.2f} GiB"
            )
        self._peak = max(self._peak, need)

    def reset_peak(self) -> None:
        """Start a new peak measurement."""
        self._peak = 0

    def peak_bytes(self) -> int:
        """The largest forward since `reset_peak`."""
        return self._peak

    def capacity_bytes(self) -> int:
        """The device's total memory."""
        return self._capacity
