"""`skygreen up --local --deadline` and `skygreen watch` on a multi-region market: the nomad moves
a real training run twice, its watcher is killed in the middle of a move, and the run ends with
the weights of an uninterrupted run, the deadline met.

The market is three GCP zones in the format of the real H100 trace (`SKYGREEN_TEST_SPOT_TRACE`
naming the folder), ten-minute ticks: us-central1-a at $1.90/h, up for two hours, then gone;
us-east4-a at $2.00/h, always up; europe-west4-a at $3.00/h, down to $1.00/h from hour four.
The clock (`SKYGREEN_TEST_CLOCK_FILE`) is moved by hand, holds at known steps
(`skygreen.runtime.hold`) keep the run where the test put it, and each poll is one
`skygreen watch RUN --once`, so every decision happens when the test says. The test plays the
cloud: it preempts the run (SIGTERM) when its zone goes.

6 h of compute (150 steps, 25 a compute hour) are due in 12 h: deadline pressure stays low, so
the nomad follows prices: the run lands in us-central1-a (cheapest with spot up), moves to
us-east4-a when us-central1-a goes (within 15% of the cheapest listed price), and to
europe-west4-a when that becomes cheaper than us-east4-a by more than its margin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import user_env, wait_for
from skygreen.checkpoint.lease import read_lease
from skygreen.checkpoint.store_factory import open_store
from skygreen.deadline.clock import CLOCK_ENV
from skygreen.deadline.market import TRACE_ENV
from skygreen.launch.registry import LAUNCH_LOCK_FILE
from skygreen.ledger.io import read_ledger
from skygreen.locks import exclusive_lock
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV
from test_deadline_local_e2e import SKYGREEN, T0, TINY, _stop_leftovers, held_at, record, run_dir, set_clock
from test_local_e2e import REPO, skygreen, status

pytestmark = pytest.mark.slow
TICKS = 120  # 20 h of ten-minute ticks


def write_market(folder: Path) -> Path:
    """Three zones as the H100 trace holds them (`data`: 1 = preempted; `prices` per tick)."""
    zones = {
        "us-central1-a": ([0] * 12 + [1] * (TICKS - 12), [1.9] * TICKS),
        "us-east4-a": ([0] * TICKS, [2.0] * TICKS),
        "europe-west4-a": ([0] * TICKS, [3.0] * 24 + [1.0] * (TICKS - 24)),
    }
    for zone, (data, prices) in zones.items():
        (folder / f"{zone}_h100_16").mkdir(parents=True)
        doc = {
            "metadata": {"gap_seconds": 600, "price_info": {"price": prices[0], "on_demand_price": 10.0}},
            "data": data,
            "prices": prices,
        }
        (folder / f"{zone}_h100_16" / "full.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture
def env(private_home, tmp_path):
    clock = tmp_path / "clock"
    clock.write_text(f"{T0}\n")
    release = tmp_path / "release"
    release.mkdir()
    environ = {
        **user_env(private_home, TINY_STEPS="150", PYTHONPATH=str(REPO)),  # the training imports this checkout
        CLOCK_ENV: str(clock),
        TRACE_ENV: str(write_market(tmp_path / "market")),
        HOLD_ENV: "50,75",
        RELEASE_ENV: str(release),
    }
    yield environ
    _stop_leftovers(private_home)


def journey(env, run_id: str) -> dict:
    path = run_dir(env, run_id) / "journey.json"
    return json.loads(path.read_text()) if path.exists() else {}


def poll(env, run_id: str) -> str:
    """One poll of the watcher: decide, take one step."""
    done = skygreen(env, "watch", run_id, "--once")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_nomad_run_moves_twice_survives_a_watcher_killed_mid_move_and_ends_bit_identical(env):
    up = skygreen(env, "up", str(TINY), "--local", "--no-smoke", "--deadline", "12h", "--compute", "6h", "--no-watch")
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = up.stdout.split("launched run ")[1].split()[0]

    # Hour 0: the first launch, unpinned, lands where spot is cheapest: us-central1-a. It stays.
    held_at(env, run_id, 50)
    poll(env, run_id)
    assert journey(env, run_id)["place"]["name"] == "us-central1-a"
    assert status(env, run_id)["deadline"]["decision"] == "spot"

    # Hour 2.5: us-central1-a is gone and the cloud reclaims the VM; the nomad moves to us-east4-a.
    set_clock(env, 2.5)
    os.killpg(record(env, run_id)["launches"][-1]["pid"], signal.SIGTERM)
    wait_for(lambda: status(env, run_id)["state"] == "STOPPED", "the preempted run to stop")
    out = poll(env, run_id)
    assert "relaunched spot at us-east4-a" in out, out
    (first,) = journey(env, run_id)["moves"]
    assert (first["src"]["name"], first["dst"]["name"], first["mode"]) == ("us-central1-a", "us-east4-a", "spot")
    assert first["reason"].startswith("availability: us-central1-a down; us-east4-a at $2.09/useful h"), first
    held_at(env, run_id, 75)
    shown = status(env, run_id)["deadline"]
    assert shown["place"]["name"] == "us-east4-a" and shown["place_mode"] == "spot"

    # Hour 4.5: europe-west4-a drops to $1/h. A watcher cancels the run to move there and is
    # killed before it relaunches it: the test holds the run's relaunch lock meanwhile, so the
    # relaunch cannot happen first whatever the machine's load.
    set_clock(env, 4.5)
    job = record(env, run_id)["launches"][-1]["job_id"]
    with exclusive_lock(run_dir(env, run_id) / LAUNCH_LOCK_FILE, wait_s=60) as taken:
        assert taken
        watcher = subprocess.Popen([*SKYGREEN, "watch", run_id, "--poll", "1s"], env=env, cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            state = run_dir(env, run_id) / "watch.json"
            wait_for(lambda: json.loads(state.read_text()).get("cancelled_job") == job, "the cancel half of the move")
        finally:
            watcher.send_signal(signal.SIGKILL)
            out, _ = watcher.communicate(timeout=60)
    assert "us-east4-a -> spot at europe-west4-a (price:" in out, out
    assert len(record(env, run_id)["launches"]) == 2 and status(env, run_id)["state"] != "RUNNING"
    assert journey(env, run_id)["target"]["name"] == "europe-west4-a"
    text = skygreen(env, "status", run_id).stdout
    assert "moving to europe-west4-a" in text, text

    # A new watcher finishes the move; the run resumes there and completes.
    assert "relaunched spot at europe-west4-a" in poll(env, run_id)
    wait_for(lambda: status(env, run_id)["state"] == "SUCCEEDED", "the run to finish", timeout_s=300)
    out = poll(env, run_id)
    assert "deadline met" in out, out

    final = status(env, run_id)
    moves = final["deadline"]["moves"]
    assert [(m["src"]["name"], m["dst"]["name"]) for m in moves] == [
        ("us-central1-a", "us-east4-a"),
        ("us-east4-a", "europe-west4-a"),
    ]
    for m in moves:  # measured once the new life's first step was in the ledger
        assert m["restore_bytes"] > 0 and m["changeover_s"] > 0 and m["usd"] > 0, m
    assert moves[1]["egress_usd"] > moves[0]["egress_usd"] > 0  # across the Atlantic costs more
    store = open_store(final["checkpoint_url"])
    assert [json.loads(store.get(f"ledger/moves/000{n}.json"))["changeover_s"] for n in (1, 2)] == [
        m["changeover_s"] for m in moves
    ]
    segments = read_ledger(store)
    assert [(s.place.zone, s.end) for s in segments] == [
        (None, "preempted"),
        ("us-east4-a", "cancelled"),
        ("europe-west4-a", "completed"),
    ]
    lease = read_lease(store)
    assert lease is not None and lease.launch == 3  # the last life holds the run's writer lease
    text = skygreen(env, "status", run_id).stdout
    assert "move 2" in text and "us-east4-a -> europe-west4-a (spot)" in text, text

    # The same training, uninterrupted, ends with the same weights.
    plain = {k: v for k, v in env.items() if k not in (HOLD_ENV, TRACE_ENV, CLOCK_ENV)}
    reference = skygreen(plain, "up", str(TINY), "--local", "--no-smoke")
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    ref_id = reference.stdout.split("launched run ")[1].split()[0]
    assert final["model_sha256"] and status(env, ref_id)["model_sha256"] == final["model_sha256"]
