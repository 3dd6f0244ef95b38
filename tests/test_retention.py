"""Retention never deletes the only good checkpoint, in the local store and in S3 (moto).

Real checkpoints written by the real `Checkpointer`, then really corrupted in the store: bytes
flipped in place (same size, caught only by the sha256 check) or a blob deleted. A checkpoint
that does not verify never counts towards `keep` and never pushes out one that does; the one
just committed is never deleted; unloadable ones are moved to `quarantine/` and named in one
log line. The last test runs the whole story through the `skygreen` command: newer
checkpoints corrupt, restart, commit, kill again, and the progress is still there.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import user_env, wait_for
from skygreen.checkpoint.manifest import SHARED_BLOB, blob_key, committed_steps, find_blob, read_manifest
from skygreen.checkpoint.retention import QUARANTINE_DIR, deletable_steps
from skygreen.checkpoint.store_factory import open_store
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.hold import HOLD_ENV, RELEASE_ENV

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tasks" / "tiny.yaml"
SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "bucket" / "run")
    bucket = request.getfixturevalue("s3_bucket")  # a fresh bucket on the session's moto_server
    return f"s3://{bucket}/run"


def state(step: int) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Linear(8, 4)
    return {"model": model.state_dict(), "step": step}


def save_all(url: str, steps, *, keep: int) -> None:
    with Checkpointer(url, keep=keep) as ck:
        for step in steps:
            ck.save(step, state(step))
            ck.wait()


def flip_a_byte(store, step: int) -> None:
    """Bit rot after the commit: same size, so only the sha256 check on load catches it. A life
    launched by skygreen names the blob after itself: the manifest says which it is."""
    key = blob_key(step, find_blob(read_manifest(store, step).blobs, SHARED_BLOB) or SHARED_BLOB)
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))


def loaded_step(url: str) -> int | None:
    loaded = Checkpointer(url).load_latest()
    return None if loaded is None else loaded.step


def quarantined_steps(store) -> list[int]:
    return sorted({int(key.split("/")[1]) for key in store.list(QUARANTINE_DIR + "/")})


def test_corrupt_newer_checkpoints_never_push_out_the_one_just_committed(url, caplog):
    caplog.set_level(logging.INFO, logger="skygreen")
    store = open_store(url)
    save_all(url, (100, 200, 300), keep=2)
    assert committed_steps(store) == [200, 300]
    for step in (200, 300):
        flip_a_byte(store, step)

    ck = Checkpointer(url, keep=2)
    assert ck.load_latest() is None  # nothing newer verifies: the run starts over
    assert committed_steps(store) == [200, 300], "loading alone moves nothing"
    ck.save(11, state(11))
    ck.wait()
    assert committed_steps(store) == [11], "the new checkpoint stays; the corrupt ones are moved aside"
    assert quarantined_steps(store) == [200, 300]
    assert store.exists(f"{QUARANTINE_DIR}/000000000300/{SHARED_BLOB}")
    lines = [r.getMessage() for r in caplog.records if "quarantined" in r.getMessage()]
    assert len(lines) == 1 and "steps 300, 200" in lines[0] and "does not match the manifest" in lines[0], lines
    assert not any("retention: deleted" in r.getMessage() and "11" in r.getMessage() for r in caplog.records)

    for step in (12, 13, 14):
        ck.save(step, state(step))
        ck.wait()
    ck.close()
    assert committed_steps(store) == [13, 14]  # ordinary retention goes on as before
    assert loaded_step(url) == 14


def test_an_older_checkpoint_that_does_not_verify_does_not_count_towards_keep(url):
    store = open_store(url)
    save_all(url, (1, 2), keep=2)
    store.delete(blob_key(2, SHARED_BLOB))  # step 2's manifest now points at nothing

    save_all(url, (3,), keep=2)
    assert committed_steps(store) == [1, 3], "step 1 still counts: step 2 may not push it out"
    assert quarantined_steps(store) == [2]
    assert loaded_step(url) == 3


def test_the_checkpoint_just_committed_is_never_deletable():
    from skygreen.checkpoint.manifest import Manifest, blob_info
    from skygreen.timestamps import utc_now_iso

    newer = [
        Manifest(step=s, created_at=utc_now_iso(), blobs={SHARED_BLOB: blob_info(b"x")}, metric=0.1 * s)
        for s in (5, 6, 7)
    ]
    assert 4 not in deletable_steps(newer, [4, 5, 6, 7], keep=2, newest=4)
    assert deletable_steps(newer, [1, 4, 5, 6, 7], keep=2, newest=4) == [1]


# ---------------------------------------------------------------- the whole story, through the CLI


@pytest.fixture
def env(private_home):
    return user_env(private_home, TINY_STEPS="200000", TINY_EVAL_EVERY="1000000")  # runs until killed; no early stop


def skygreen(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SKYGREEN, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)


def record(env, run_id: str) -> dict:
    return json.loads((Path(env["XDG_DATA_HOME"]) / "skygreen" / "runs" / run_id / "run.json").read_text())


def launch_log(env, run_id: str) -> str:
    job = record(env, run_id)["launches"][-1]["job_id"]
    return (Path(env["XDG_DATA_HOME"]) / "skygreen" / "local-jobs" / job / "output.log").read_text()


def commits_logged(env, run_id: str) -> list[int]:
    return [
        int(line.split("checkpoint step ")[1].split()[0])
        for line in launch_log(env, run_id).splitlines()
        if " committed to " in line
    ]


def kill_training(env, run_id: str) -> None:
    os.killpg(record(env, run_id)["launches"][-1]["pid"], signal.SIGKILL)
    wait_for(
        lambda: json.loads(skygreen(env, "status", run_id, "--json").stdout)["state"] == "STOPPED", "the run to stop"
    )


def held_at(env, run_id: str, step: int) -> None:
    """Wait until the launch is held at `step`: its checkpoint committed, retention done, logged."""
    wait_for(lambda: f"held at step {step} (" in launch_log(env, run_id), f"the run held at step {step}")


@pytest.mark.slow
def test_corrupt_checkpoints_restart_commit_kill_again_and_the_progress_is_kept(env, tmp_path):
    started = skygreen(env, "up", str(TINY), "--local", "--no-smoke", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split("launched run ")[1].split()[0]
    wait_for(lambda: len(commits_logged(env, run_id)) >= 3, "three commits")
    kill_training(env, run_id)
    bucket = Path(env["XDG_DATA_HOME"]) / "skygreen" / "buckets" / run_id
    store = open_store(str(bucket))
    corrupt = committed_steps(store)
    for step in corrupt:  # every checkpoint the run has is now bad
        flip_a_byte(store, step)

    # The new life commits steps 3 and 6 (and any its schedule asks for) and is held at 6:
    # retention has run after its first commit, and no commit is in flight (or unlogged) when
    # it is killed.
    release = tmp_path / "release"
    release.mkdir()
    resumed = skygreen({**env, HOLD_ENV: "3,6", RELEASE_ENV: str(release)}, "resume", run_id, "--detach")
    assert resumed.returncode == 0, resumed.stderr
    held_at(env, run_id, 3)
    (release / "3").touch()
    held_at(env, run_id, 6)
    assert "resumed run" not in launch_log(env, run_id), "nothing verified, so the run started over"
    kill_training(env, run_id)
    new_commits = commits_logged(env, run_id)
    assert {3, 6} <= set(new_commits) and new_commits[-1] == 6, new_commits
    kept = set(committed_steps(store))
    assert new_commits[-1] in kept, "the newest commit of the new life was not deleted"
    assert kept & set(corrupt) <= set(new_commits)  # a corrupt step survives only if this life rewrote it
    # Retention moves aside every corrupt step this life did not rewrite first. A step it rewrote
    # after the move has its corrupt copy in quarantine and a good one committed: both are right.
    quarantined = set(quarantined_steps(store))
    assert set(corrupt) - set(new_commits) <= quarantined, (corrupt, new_commits, quarantined)
    assert quarantined <= set(corrupt), "only the corrupt checkpoints were moved aside"
    assert "quarantined unloadable checkpoint steps" in launch_log(env, run_id)

    again = skygreen(env, "resume", run_id, "--detach")
    assert again.returncode == 0, again.stderr
    resumed_at = wait_for(
        lambda: [line for line in launch_log(env, run_id).splitlines() if "resumed run" in line], "the resume line"
    )
    step = int(resumed_at[0].split(" at step ")[1].split()[0])
    assert step >= new_commits[-1], resumed_at[0]  # the progress made after the restart was kept
    skygreen(env, "cancel", run_id)
