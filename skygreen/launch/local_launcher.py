"""`--local`: the same rendered task, run as a process on this machine.

The task's `run` script starts detached from the terminal (its own session and process
group), with the task's `envs` (the SKYGREEN_* runtime contract), the secrets in memory, and
the single-node SkyPilot variables, in the task's workdir. Output goes to a log file. So
`skygreen up --local` can follow it in the foreground, and if that command (or the terminal)
dies, training goes on; `skygreen status/logs/cancel/resume` find it again from its job
folder.

Each launch has a folder `<root>/<job_id>/` with `job.json` (pid and the kernel's start time
of the process, to tell it from a recycled pid; the pid is also the id of the job's process
group; and the job's mark), `output.log`, and `exit_code` (written by `templates/local_job.sh`
when the script ends; absent when it was killed).

Every process of the job carries its mark in its environment (`SKYGREEN_LOCAL_JOB`), also
those that leave the process group: torchrun starts each worker in a session of its own. The job
lives while any process of its group or with its mark does: a wrapper killed alone leaves its
trainer running, and `status`, `cancel` and `logs --follow` see and stop the trainer too; a run
reads stopped only when none of its processes is left.
The task's `setup` is not run here: the runtime is already installed on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from secrets import token_hex
from typing import Any, TextIO

from skygreen.errors import InputError, LaunchError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.launch.launcher import JobState, JobStatus, LaunchedJob, run_of_job

CANCEL_GRACE_S = 60.0
"""How long `cancel` waits after SIGTERM for the final checkpoint before SIGKILL."""

_POLL_S = 0.2
_KILL_WAIT_S = 30.0
"""How long `cancel` keeps sending SIGKILL until no process of the job is left."""

JOB_MARK_ENV = "SKYGREEN_LOCAL_JOB"
"""The variable every process of a local job carries: `<job id>:<random hex>`, unique on this machine."""


class LocalLauncher:
    """Runs rendered tasks as detached local processes; job folders live under `root`."""

    kind = "local"
    queues_for_spot = False
    """A local run does not wait for spot: a deadline watcher relaunches it when spot is back."""

    def __init__(self, root: str | os.PathLike[str], *, cancel_grace_s: float = CANCEL_GRACE_S) -> None:
        self.root = Path(root)
        self.cancel_grace_s = cancel_grace_s
        self._children: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------ Launcher

    def launch(self, task: Mapping[str, Any], *, name: str, secrets: Mapping[str, str] | None = None) -> str:
        """Start the task's `run` script, detached, in the task's workdir; returns the job id `<name>-<n>`
        (the first n from 1 without a folder), or `name` itself when it already carries its launch
        number (`skygreen.launch.registry.launch_name`) and has no folder yet. Output is appended to the job folder's output.log.

        Raises `InputError` when the task has no `run` or its workdir is not a folder, `LaunchError`
        when the process cannot be started.
        """
        run_script = task.get("run")
        if not run_script:
            raise InputError("the task has no `run` command\n  fix: add e.g. `run: python train.py` to the task file")
        workdir = Path(str(task.get("workdir") or "."))
        if not workdir.is_dir():
            raise InputError(
                f"workdir {workdir} is not a folder\n  fix: set `workdir:` in the task file to the folder with the training script"
            )
        job_id = self._new_job_id(name)
        folder = self.root / job_id
        folder.mkdir(parents=True)
        mark = f"{job_id}:{token_hex(6)}"
        env = {**_job_env(task.get("envs") or {}, secrets or {}), JOB_MARK_ENV: mark}
        log = (folder / "output.log").open("ab")
        try:
            child = subprocess.Popen(
                ["bash", "-c", _wrapper_script(), "skygreen-local", str(run_script), str(folder / "exit_code")],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise LaunchError(
                f"cannot start the local run: {e}\n  fix: check that bash is installed and the workdir is readable"
            ) from e
        finally:
            log.close()
        self._children[job_id] = child
        _write_json(
            folder / "job.json",
            {
                "pid": child.pid,
                "start_ticks": _start_ticks(child.pid),
                "mark": mark,
                "started_at": time.time(),
                "workdir": str(workdir),
            },
        )
        return job_id

    def status(self, job_id: str) -> JobStatus:
        """The job's state from its folder. While the process lives: RUNNING, or CANCELLING once
        cancelled. After it, the first that applies: SUCCEEDED on exit code 0; CANCELLED when it was
        cancelled; STOPPED on the preempted exit code or with no exit code at all (killed); else
        FAILED, with the log's failure line. Raises `InputError` for an unknown job id (no job.json
        under `root`).
        """
        folder = self._folder(job_id)
        info = _read_json(folder / "job.json")
        pid = info.get("pid")
        exit_code = self._exit_code(job_id)
        cancelled = (folder / "cancelled").exists()
        alive = exit_code is None and self._alive(job_id, info)
        if exit_code is None and not alive:
            # It may have written its exit code and ended between the two reads above: only a
            # process gone without one was killed.
            exit_code = self._exit_code(job_id)
        ended_at = _mtime(folder / "exit_code") if exit_code is not None else None
        if alive:
            leader = _what_lives(pid, info.get("start_ticks"))
            state, detail = (JobState.CANCELLING, "stopping") if cancelled else (JobState.RUNNING, leader)
        elif exit_code is None:
            state, detail = (
                (JobState.CANCELLED if cancelled else JobState.STOPPED),
                "the process ended without an exit code (killed)",
            )
            ended_at = _mtime(folder / "output.log")
        elif exit_code == 0:
            state, detail = JobState.SUCCEEDED, "exit code 0"
        elif cancelled:
            state, detail = JobState.CANCELLED, f"exit code {exit_code}"
        elif exit_code == PREEMPTED_EXIT_CODE:
            state, detail = JobState.STOPPED, f"exit code {exit_code}: stopped after a checkpoint"
        else:
            state, detail = JobState.FAILED, f"exit code {exit_code}"
        started = info.get("started_at")
        duration = None if started is None else max(0.0, (ended_at or time.time()) - float(started))
        return JobStatus(
            job_id=job_id,
            state=state,
            duration_s=duration,
            cloud="local",
            exit_code=exit_code,
            failure_reason=self._tail(job_id) if state is JobState.FAILED else None,
            detail=detail,
        )

    def cancel(self, job_id: str) -> None:
        """Mark the job cancelled and send SIGTERM to its process group and every process with its
        mark, then SIGKILL to them all if any still runs `cancel_grace_s` later (the time it has for
        its final checkpoint); waits until none is left. A job that already ended is left as it
        ended. Raises `InputError` for an unknown job id (no job.json under `root`).
        """
        folder = self._folder(job_id)
        info = _read_json(folder / "job.json")
        pid = info.get("pid")
        if pid is None or not self._alive(job_id, info):
            return  # it ended on its own: it stays as it ended (stopped, failed, succeeded)
        (folder / "cancelled").write_text("cancelled\n", encoding="utf-8")
        _signal_job(pid, info.get("mark"), signal.SIGTERM)
        deadline = time.monotonic() + self.cancel_grace_s
        while time.monotonic() < deadline and self._alive(job_id, info):
            time.sleep(_POLL_S)
        deadline = time.monotonic() + _KILL_WAIT_S
        while self._alive(job_id, info) and time.monotonic() < deadline:  # a process forked meanwhile is next
            _signal_job(pid, info.get("mark"), signal.SIGKILL)
            time.sleep(_POLL_S)

    def logs(self, job_id: str, *, follow: bool, out: TextIO) -> int | None:
        """Copy the job's output.log to `out`; with `follow`, keep copying until the job has ended.
        Returns its exit code, None while it runs or when it was killed. Raises `InputError` for an
        unknown job id (no job.json under `root`).
        """
        path = self._folder(job_id) / "output.log"
        with path.open("r", encoding="utf-8", errors="replace") as f:
            while True:
                chunk = f.read()
                if chunk:
                    out.write(chunk)
                    out.flush()
                if not follow or self.status(job_id).state.terminal:
                    rest = f.read()
                    if rest:
                        out.write(rest)
                        out.flush()
                    break
                time.sleep(_POLL_S)
        return self._exit_code(job_id)

    def jobs(self) -> list[LaunchedJob]:
        """Every job with a folder under `root`, named by its folder (`launch` names it); their
        states are left to `status`, which looks at the processes."""
        if not self.root.is_dir():
            return []
        return [LaunchedJob(job_id=p.parent.name, name=p.parent.name) for p in sorted(self.root.glob("*/job.json"))]

    # ------------------------------------------------------------ helpers

    def pid(self, job_id: str) -> int | None:
        """The job's process id as recorded at launch; None when job.json cannot be read. Raises
        `InputError` for an unknown job id (no job.json under `root`)."""
        return _read_json(self._folder(job_id) / "job.json").get("pid")

    def _new_job_id(self, name: str) -> str:
        if run_of_job(name) is not None and not (self.root / name).exists():
            return name  # already numbered by its launch
        attempt = 1
        while (self.root / f"{name}-{attempt}").exists():
            attempt += 1
        return f"{name}-{attempt}"

    def _folder(self, job_id: str) -> Path:
        folder = self.root / job_id
        if "/" in job_id or job_id in ("", ".", "..") or not (folder / "job.json").exists():
            raise InputError(
                f"no local job {job_id!r} under {self.root}\n  fix: `skygreen status` lists the runs and their jobs"
            )
        return folder

    def _exit_code(self, job_id: str) -> int | None:
        try:
            return int((self.root / job_id / "exit_code").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _alive(self, job_id: str, info: Mapping[str, Any]) -> bool:
        """Whether any process of the job's group or with its mark is left: the trainer outlives a
        wrapper killed alone, and torchrun's workers leave the group."""
        child = self._children.get(job_id)
        if child is not None:
            child.poll()  # reap our own leader, so it does not linger as a zombie
        mark = info.get("mark")
        return _group_alive(info.get("pid"), info.get("start_ticks")) or bool(mark and marked_pids(JOB_MARK_ENV, mark))

    def _tail(self, job_id: str) -> str | None:
        try:
            text = (self.root / job_id / "output.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
        return failure_line(text)


_RUNTIME_ERROR = re.compile(r"skygreen: (\w+Error: .*)")
"""The line the runtime ends a script with on an uncaught skygreen error
(`skygreen.runtime.environment.end_quietly_on_skygreen_errors`)."""


def failure_line(output: str) -> str | None:
    """One line that says why a run failed, from the end of its output: the exception of the
    last Python traceback (without the module path) or the skygreen error the runtime ended the
    script with, whichever came last, else the last line printed. Never a piece of the traceback
    itself: `status` shows this as the run's state."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    ended = [i for i, line in enumerate(lines) if _RUNTIME_ERROR.fullmatch(line)]
    if ended and (not starts or ended[-1] > starts[-1]):
        return lines[ended[-1]].removeprefix("skygreen: ")
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if not line[:1].isspace():  # the frames are indented; the exception line is not
                name, sep, message = line.partition(": ")
                return f"{name.rpartition('.')[2]}{sep}{message}" if " " not in name else line
    return lines[-1] if lines else None


def _wrapper_script() -> str:
    return resources.files("skygreen").joinpath("templates").joinpath("local_job.sh").read_text(encoding="utf-8")


def _job_env(envs: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus the task's envs and secrets, with SkyPilot's
    single-node variables so scripts written for SkyPilot see the layout they expect."""
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in envs.items() if v is not None})
    env.update({str(k): str(v) for k, v in secrets.items()})
    env.update({"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_IPS": "127.0.0.1"})
    env.setdefault("PYTHONUNBUFFERED", "1")
    # `python` in the run command means the interpreter skygreen runs in (it has the runtime).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to detect pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def _process_alive(pid: int | None, start_ticks: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return True  # no /proc (macOS): the pid exists, trust it
    if fields[0] == "Z":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks


def _group_alive(pgid: int | None, start_ticks: int | None) -> bool:
    """Whether a live (not zombie) process of the group `pgid` is left. On Linux each process in
    /proc is checked, and one started before the group's leader (`start_ticks`) is another,
    older group that reuses the number; elsewhere the kernel's answer for the group is trusted."""
    if not pgid:
        return False
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdecimal():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # it ended while we looked
        if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
            continue
        if start_ticks is not None and int(fields[19]) < start_ticks:
            continue
        return True
    return False


def _what_lives(pid: int | None, start_ticks: int | None) -> str:
    """`status`'s detail of a live job: its leader, else its group, else its marked processes."""
    if _process_alive(pid, start_ticks):
        return f"pid {pid}"
    if _group_alive(pid, start_ticks):
        return f"process group {pid}"
    return f"processes outside process group {pid} (marked {JOB_MARK_ENV})"


def marked_pids(name: str, value: str) -> list[int]:
    """The live (not zombie) processes whose environment has `name=value`, found through
    /proc/*/environ (Linux; empty elsewhere). A process that sets a variable after it started
    keeps its first environment there, and its children carry the mark on."""
    entry = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if entry not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue  # it ended while we looked, or it is not ours to read
        if state not in ("Z", "X"):
            found.append(int(proc.name))
    return found


def _signal_job(pid: int, mark: str | None, sig: signal.Signals) -> None:
    """`sig` to the job's process group and to every process with its mark."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    for marked in marked_pids(JOB_MARK_ENV, mark) if mark else []:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(marked, sig)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(data)), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
