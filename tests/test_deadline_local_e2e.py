"""`skygreen up --local --deadline` end to end: real training, a real background watcher, a
scripted spot market and a clock moved by hand.

The market is a trace in the format of the real spot traces (`SKYGREEN_TEST_SPOT_TRACE`): spot
for the first 2 hours, gone for 4, back from hour 6. The clock (`SKYGREEN_TEST_CLOCK_FILE`)
stands still while training runs, so the test decides what hour it is at every moment, and
holds at known steps (`skygreen.runtime.hold`) keep progress where the test put it. The test
plays the cloud: it preempts the spot run (SIGTERM, as a reclaimed VM) when the market goes.

Policy: Uniform Progress (Wu et al.), whose decisions follow from the numbers by hand: 6 h of
compute due in 16 h, an even pace of 0.375 h of progress per hour.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import end_processes_of, user_env, wait_for
from skygreen.checkpoint.store_factory import open_store
from skygreen.deadline.clock import CLOCK_ENV
from skygreen.deadline.market import TRACE_ENV
from skygreen.deadline.watch_process import POLL_ENV
from skygreen.ledger.io import read_ledger
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV
from test_local_e2e import launch_log, skygreen, status

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]
T0 = 1_800_000_000
H = 3600

pytestmark = pytest.mark.slow


@pytest.fixture
def env(private_home, tmp_path):
    clock = tmp_path / "clock"
    clock.write_text(f"{T0}\n")
    trace = tmp_path / "market.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": H, "nodes": 1}, "data": [1, 1, 0, 0, 0, 0] + [1] * 20}))
    release = tmp_path / "release"
    release.mkdir()
    environ = {
        **user_env(private_home, TINY_STEPS="300"),
        CLOCK_ENV: str(clock),
        TRACE_ENV: str(trace),
        POLL_ENV: "1s",
        HOLD_ENV: "100,102,150",
        RELEASE_ENV: str(release),
    }
    yield environ
    _stop_leftovers(private_home)


def _stop_leftovers(home: Path) -> None:
    """A failed test leaves no watcher or held training process behind."""
    end_processes_of(home)


def run_dir(env, run_id: str) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id


def record(env, run_id: str) -> dict:
    return json.loads((run_dir(env, run_id) / "run.json").read_text())


def watch_state(env, run_id: str) -> dict:
    path = run_dir(env, run_id) / "watch.json"
    return json.loads(path.read_text()) if path.exists() else {}


def set_clock(env, hours: float) -> float:
    at_s = T0 + hours * H
    Path(env[CLOCK_ENV]).write_text(f"{at_s}\n")
    return at_s


def release(env, step: int) -> None:
    (Path(env[RELEASE_ENV]) / str(step)).touch()


def decision_at(env, run_id: str, at_s: float) -> dict:
    """The watcher's first decision taken at clock time `at_s` (it polls every second)."""

    def taken():
        decisions = [d for d in watch_state(env, run_id).get("decisions", []) if d["at_s"] == at_s]
        return decisions[0] if decisions else None

    return wait_for(taken, f"the watcher's decision at {(at_s - T0) / H:g} h")


def held_at(env, run_id: str, step: int) -> dict:
    """Status once the run is held at `step` (its checkpoint and ledger segment written, the
    log says so); fails at once if the run ended first."""

    def at_step():
        s = status(env, run_id)
        assert s["state"] in ("RUNNING", "PENDING", "STARTING"), f"the run ended ({s['state']}) before step {step}"
        return s if s["step"] == step and f"held at step {step} (" in launch_log(env, run_id) else None

    return wait_for(at_step, f"the run held at step {step}")


def launch_count(env, run_id: str, count: int) -> list[dict]:
    def launched():
        launches = record(env, run_id)["launches"]
        return launches if len(launches) == count else None

    return wait_for(launched, f"launch {count}")


def test_a_deadline_run_moves_to_on_demand_in_an_outage_and_back_to_spot(env):
    up = skygreen(env, "up", str(TINY), "--local", "--no-smoke", "--deadline", "16h", "--compute", "6h",
                  "--policy", "uniform_progress")  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]
    assert "deadline:    16 h" in up.stdout and "watcher:     pid" in up.stdout
    assert "moves between jobs, so it is not followed here" in up.stderr  # returned at once, run held

    # Hour 0: on spot, spot available; held at step 100 = 2 of 6 compute hours.
    held_at(env, run_id, 100)
    first = decision_at(env, run_id, T0)
    assert (first["mode"], first["current"]) == ("spot", "spot")

    # Hour 2.5: the market is gone and the cloud reclaims the VM (SIGTERM: a checkpoint, exit 75).
    at = set_clock(env, 2.5)
    os.killpg(record(env, run_id)["launches"][-1]["pid"], signal.SIGTERM)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the preempted run to stop")
    assert decision_at(env, run_id, at)["mode"] == "idle"  # 2 h done, the even pace is at 0.94 h: wait

    # Hours 3.5 and 4.5: still ahead of the even pace (1.31, 1.69 h); 5.5: behind it (2.06 h).
    for hours in (3.5, 4.5):
        assert decision_at(env, run_id, set_clock(env, hours))["mode"] == "idle"
    assert len(record(env, run_id)["launches"]) == 1
    on_demand = decision_at(env, run_id, set_clock(env, 5.5))
    assert on_demand["mode"] == "on_demand" and on_demand["current"] == "idle"
    launches = launch_count(env, run_id, 2)
    assert launches[-1]["spot"] is False
    held_at(env, run_id, 102)  # resumed from the checkpoint the SIGTERM committed, on on-demand

    # The watcher dies; the run carries on where it is, and status says who can restart it.
    watcher_pid = watch_state(env, run_id)["pid"]
    os.kill(watcher_pid, signal.SIGKILL)
    wait_for(lambda: not status(env, run_id)["deadline"]["watcher"]["running"], "the watcher to read as stopped")
    text = skygreen(env, "status", run_id).stdout
    assert "not running: the run stays where it is" in text and f"skygreen watch {run_id}" in text
    restarted = subprocess.Popen([*SKYGREEN, "watch", run_id, "--poll", "1s"], env=env, cwd=REPO,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_for(lambda: watch_state(env, run_id).get("pid") == restarted.pid, "the restarted watcher")
        again = skygreen(env, "watch", run_id, "--once")
        assert again.returncode == 0 and "already watched" in again.stdout

        # Hour 6.5: spot is back, but Uniform Progress holds on-demand until the run is ahead of
        # the even pace two changeovers from now (2.51 h): released, the run gets there.
        assert decision_at(env, run_id, set_clock(env, 6.5))["mode"] == "on_demand"
        release(env, 102)
        launches = launch_count(env, run_id, 3)
        assert launches[-1]["spot"] is True

        for step in (100, 150):
            release(env, step)
        out, _ = restarted.communicate(timeout=300)
    finally:
        if restarted.poll() is None:
            restarted.kill()
    assert restarted.returncode == 0, out
    assert "idle -> on-demand" not in out  # that was the first watcher's; this one:
    assert "on-demand -> spot" in out and "deadline met" in out

    # the watcher ends on the final checkpoint; the process exits a moment later
    def exited():
        s = status(env, run_id)
        return s if s["state"] != "RUNNING" else None

    final = wait_for(exited, "the run to exit")
    assert final["state"] == "SUCCEEDED" and final["completed"]
    assert final["preemptions"] == 1  # the market's; the watcher's own switch is not one
    assert final["deadline"]["switches"] == 2 and "deadline met" in final["deadline"]["watcher"]["ended"]
    listing = skygreen(env, "status")
    assert listing.returncode == 0 and listing.stdout.splitlines()[1].endswith("  deadline met"), listing.stdout
    detail = skygreen(env, "status", run_id)
    # the end is dated from the ledger: the fake clock's 6.5 h less the real seconds until the poll
    assert "16 h, by " in detail.stdout and re.search(r"\(ended at 6\.[45]\d h: deadline met\)", detail.stdout), (
        detail.stdout
    )
    segments = read_ledger(open_store(final["checkpoint_url"]))
    assert [(s.place.spot, s.end) for s in segments] == [
        (True, "preempted"),
        (False, "cancelled"),
        (True, "completed"),
    ]
