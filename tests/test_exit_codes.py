"""Every exit code of `skygreen.exit_codes`, through the real `skygreen` command.

Commands that follow a run (`up --local` and `resume` in the foreground, `logs --follow`)
exit with the run's outcome. The quick tests run `python -c` scripts as the task's `run`
(no torch); the 75 test cancels a real training run of `tasks/tiny.yaml` after its first
checkpoint. Interrupts are gated on progress: the run prints a line and then waits for a file
the test creates, so SIGINT always lands while the command is following a live run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import user_env
from skygreen import exit_codes
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.runtime.hold import HOLD_ENV

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


@pytest.fixture
def env(private_home):
    return user_env(private_home)


def skygreen(env, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def task(tmp_path: Path, run: str, name: str = "codes") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nrun: {json.dumps(run)}\n")
    return path


def only_run_id(env) -> str:
    (row,) = json.loads(skygreen(env, "status", "--json").stdout)
    return row["run_id"]


def wait_for(predicate, what: str, timeout_s: float = 240, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what}: {output[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_table_matches_the_runtime():
    from skygreen.runtime import PREEMPTED_EXIT_CODE as runtime_code

    assert exit_codes.STOPPED_WITH_CHECKPOINT == PREEMPTED_EXIT_CODE == runtime_code == 75
    assert exit_codes.for_outcome("SUCCEEDED", has_checkpoint=False) == 0
    assert exit_codes.for_outcome("FAILED", has_checkpoint=True) == 1
    assert exit_codes.for_outcome("STOPPED", has_checkpoint=True) == 75
    assert exit_codes.for_outcome("CANCELLED", has_checkpoint=True) == 75
    assert exit_codes.for_outcome("CANCELLED", has_checkpoint=False) == 1


def test_a_run_that_succeeds_exits_0(env, tmp_path):
    out = skygreen(env, "up", str(task(tmp_path, "python -c 'print(42)'")), "--local", "--no-smoke")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCEEDED" in out.stdout


def test_a_failed_run_exits_1_from_up_resume_and_logs_follow(env, tmp_path):
    failing = task(tmp_path, 'python -c "import sys; sys.exit(3)"')
    up = skygreen(env, "up", str(failing), "--local", "--no-smoke")
    assert up.returncode == exit_codes.FAILED, up.stdout + up.stderr
    assert "FAILED - exit code 3" in up.stdout
    assert "ended FAILED" in up.stderr and "Traceback" not in up.stderr
    run_id = only_run_id(env)

    follow = skygreen(env, "logs", run_id, "--follow")
    assert follow.returncode == exit_codes.FAILED, follow.stderr
    plain = skygreen(env, "logs", run_id)  # not following: printing the log worked
    assert plain.returncode == 0, plain.stderr

    resumed = skygreen(env, "resume", run_id)  # fails again, in the foreground
    assert resumed.returncode == exit_codes.FAILED, resumed.stdout + resumed.stderr
    assert "FAILED - exit code 3" in resumed.stdout


def test_bad_input_exits_2_and_launches_nothing(env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nskygreen: {precision: fp8}\nrun: python -c 'print(1)'\n")
    out = skygreen(env, "up", str(bad), "--local", "--no-smoke")
    assert out.returncode == exit_codes.BAD_INPUT, out.stdout + out.stderr
    assert "skygreen.precision" in out.stderr and "Traceback" not in out.stderr
    assert json.loads(skygreen(env, "status", "--json").stdout) == []


AS_A_SHELL_STARTS_IT = [
    sys.executable,
    "-c",
    (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "signal.pthread_sigmask(signal.SIG_SETMASK, set()); os.execv(sys.argv[1], sys.argv[1:])"
    ),
]
"""Runs a command with the signal state a shell gives a foreground command: SIGINT at its
default and no signal blocked. The test process may not have it: a POSIX shell without job
control starts a background command (`bash scripts/test.sh &` in a CI script) with SIGINT and
SIGQUIT ignored, Python then installs no KeyboardInterrupt handler, and an ignored disposition
is inherited across exec, so `skygreen up` would never see the Ctrl-C this test sends."""


def test_ctrl_c_while_following_exits_130_and_the_run_goes_on(env, tmp_path):
    release = tmp_path / "release"
    script = tmp_path / "hold.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, time
        print("ready", flush=True)
        while not os.path.exists({str(release)!r}):
            time.sleep(0.1)
        print("released", flush=True)
    """)
    )
    held = task(tmp_path, f"python {script}")
    foreground = subprocess.Popen([*AS_A_SHELL_STARTS_IT, *SKYGREEN, "up", str(held), "--local", "--no-smoke"],
                                  env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        # Gate on progress: the command has printed the run's own output, so it is following it.
        assert foreground.stdout is not None
        stdout = foreground.stdout
        lines: list[str] = []

        def ready() -> bool:
            lines.append(stdout.readline())
            return "ready\n" in lines

        wait_for(ready, "the run's first line", proc=foreground)
        foreground.send_signal(signal.SIGINT)
        try:
            rest = foreground.communicate(timeout=300)[0]
        except subprocess.TimeoutExpired:
            state = Path(f"/proc/{foreground.pid}/status").read_text()
            foreground.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            stacks = foreground.communicate(timeout=60)[0]
            pytest.fail(f"up did not end after Ctrl-C:\n{state}\n{stacks[-6000:]}")
    finally:
        if foreground.poll() is None:
            foreground.kill()
    assert foreground.returncode == exit_codes.INTERRUPTED, rest
    assert "stopped following" in rest and "Traceback" not in rest
    run_id = only_run_id(env)
    assert json.loads(skygreen(env, "status", run_id, "--json").stdout)["state"] == "RUNNING"

    release.touch()
    follow = skygreen(env, "logs", run_id, "--follow")
    assert follow.returncode == exit_codes.SUCCEEDED, follow.stderr
    assert "released" in follow.stdout


@pytest.mark.slow
def test_a_run_cancelled_after_a_checkpoint_exits_75_from_up_and_logs_follow(env):
    # Held at step 20 after its checkpoint: neither the end nor early stopping can come first.
    env = {**env, "TINY_STEPS": "100000", HOLD_ENV: "20"}
    foreground = subprocess.Popen([*SKYGREEN, "up", str(TINY), "--local", "--no-smoke"], env=env, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        run_id = wait_for(lambda: json.loads(skygreen(env, "status", "--json").stdout), "the run", proc=foreground)[0][
            "run_id"
        ]
        wait_for(
            lambda: json.loads(skygreen(env, "status", run_id, "--json").stdout)["step"] == 20,
            "the checkpoint at the held step",
            proc=foreground,
        )
        cancelled = skygreen(env, "cancel", run_id)
        assert cancelled.returncode == 0, cancelled.stderr
        rest = foreground.communicate(timeout=120)[0]
    finally:
        if foreground.poll() is None:
            foreground.kill()
    assert foreground.returncode == exit_codes.STOPPED_WITH_CHECKPOINT, rest[-3000:]
    assert f"skygreen resume {run_id}" in rest
    follow = skygreen(env, "logs", run_id, "--follow")
    assert follow.returncode == exit_codes.STOPPED_WITH_CHECKPOINT, follow.stderr


def test_an_unexpected_error_is_one_line_and_exit_1(env, tmp_path, moto_server, s3_bucket):
    """A launcher that raises something no adapter maps (here a plugin's RuntimeError)."""
    (tmp_path / "broken_launcher.py").write_text("def factory():\n    raise RuntimeError('plugin crashed')\n")
    path = tmp_path / "cloud.yaml"
    path.write_text(
        f"name: cloud\nskygreen: {{gpus: [L4], checkpoint: {{bucket: s3://{s3_bucket}/runs}}}}\nrun: python train.py\n"
    )
    cloud_env = {**env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}
    cloud_env.update(PYTHONPATH=str(tmp_path), SKYGREEN_LAUNCHER="broken_launcher:factory")
    catalog = str(REPO / "tests" / "data" / "catalog" / "v8")
    out = skygreen(cloud_env, "up", str(path), "--no-smoke", "--catalog", catalog)
    assert out.returncode == exit_codes.FAILED, out.stdout + out.stderr
    assert "error: unexpected RuntimeError: plugin crashed" in out.stderr and "SKYGREEN_DEBUG=1" in out.stderr
    assert "Traceback" not in out.stderr
    debug = skygreen({**cloud_env, "SKYGREEN_DEBUG": "1"}, "up", str(path), "--no-smoke", "--catalog", catalog)
    assert "Traceback" in debug.stderr and "plugin crashed" in debug.stderr
