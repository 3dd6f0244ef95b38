"""The local launcher's job state, read from a real detached job while it ends.

`status` reads the job's exit code, then whether its process lives. A job that writes its exit
code and ends between those two reads finished normally; it must not read as killed.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from skygreen.launch.launcher import JobState
from skygreen.launch.local_launcher import LocalLauncher


def wait_until(predicate, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_job_that_ends_between_the_exit_code_read_and_the_liveness_check_reads_as_succeeded(tmp_path, monkeypatch):
    release = tmp_path / "release"
    script = tmp_path / "wait.py"
    script.write_text(f"import os, time\nwhile not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n")
    launcher = LocalLauncher(tmp_path / "jobs")
    job_id = launcher.launch({"run": f"{sys.executable} {script}", "workdir": str(tmp_path)}, name="ending")
    assert launcher.status(job_id).state is JobState.RUNNING
    read_exit_code = launcher._exit_code
    reads: list[int | None] = []

    def exit_code_read_just_before_the_end(job: str) -> int | None:
        """The real read; on the first one, the job then ends before `status` goes on (the
        interleaving a loaded machine produces by pausing `status` right after this read)."""
        code = read_exit_code(job)
        if not reads:
            release.touch()
            wait_until(lambda: (Path(launcher.root) / job / "exit_code").exists(), "the job's exit code")
            wait_until(lambda: launcher._children[job].poll() is not None, "the job's process to end")
        reads.append(code)
        return code

    monkeypatch.setattr(launcher, "_exit_code", exit_code_read_just_before_the_end)
    status = launcher.status(job_id)
    assert reads[0] is None  # the first read came before the end
    assert status.state is JobState.SUCCEEDED and status.exit_code == 0, status


def test_a_cancel_signal_that_reaches_the_job_while_it_records_its_exit_code_does_not_lose_it(tmp_path):
    # `cancel` signals the job's process group, then each process that carries the job's mark,
    # found by a scan of /proc: on a loaded machine the scan ends after the run script has, and its
    # SIGTERM reached the `mv` that records the exit code (the job then read as killed). Here that
    # `mv` signals its own process group before it moves the file, as that late SIGTERM would.
    shims = tmp_path / "shims"
    shims.mkdir()
    mv = shims / "mv"
    mv.write_text(f'#!/bin/sh\nkill -TERM 0\nexec {shutil.which("mv")} "$@"\n')
    mv.chmod(0o755)
    launcher = LocalLauncher(tmp_path / "jobs")
    task = {"run": "echo trained", "workdir": str(tmp_path), "envs": {"PATH": f"{shims}:{os.environ['PATH']}"}}
    job_id = launcher.launch(task, name="recording")
    wait_until(lambda: launcher.status(job_id).state.terminal, "the job to end")
    status = launcher.status(job_id)
    assert status.state is JobState.SUCCEEDED and status.exit_code == 0, status
    assert not (Path(launcher.root) / job_id / "exit_code.tmp").exists()
