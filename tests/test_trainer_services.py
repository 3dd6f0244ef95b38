"""What the HF and Lightning callbacks give alike, each checked with the real framework's Trainer
(tasks/hf_trainer.py, tasks/lightning_task.py, small, on CPU): SIGTERM commits then exits with the
preempted code, a cloud's preemption notice saves at the next step and training goes on, a
budget stops the run with a committed checkpoint, the task's `checkpoint.every` makes the callback
ask the trainer for saves, early stopping on the evaluation metric saves
and stops, checkpoints round-trip through S3 (moto) and GCS (the emulator), and a setup error at
train start ends the script as one at the callback's construction does (exit 2, no traceback).

Every run that the test acts on is held at a committed step (`SKYGREEN_TEST_HOLD_AT_STEPS`) first,
so nothing races it."""

from __future__ import annotations

import json
import signal

import pytest

from helpers import wait_for
from local_runs import (
    HF_TASK,
    LIGHTNING_STEPS_PER_EPOCH,
    LIGHTNING_TASK,
    TrainerTask,
    finish,
    same_weights,
    wait_for_commit,
)
from metadata_server import MetadataServer
from skygreen.checkpoint.folders import committed_folder_steps, folder_manifests
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.ledger import read_ledger

pytestmark = pytest.mark.slow


def _task(name: str) -> TrainerTask:
    if name == "hf":
        pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
        return HF_TASK
    pytest.importorskip("lightning")
    return LIGHTNING_TASK


@pytest.fixture(params=["hf", "lightning"])
def task(request) -> TrainerTask:
    return _task(request.param)


OFFERS = json.dumps([["gcp", "us-central1", "g2-standard-4", "L4", 1, True, 0.28]])


def on_gcp(metadata: MetadataServer) -> dict[str, str]:
    """What SkyPilot gives a managed job's VM on GCP (the plan's priced offer rendered by `up`),
    with the metadata endpoint on loopback and a fast notice poll."""
    info = {"cluster_name": "sky-1", "cloud": "GCP", "region": "us-central1", "zone": "us-central1-a"}
    return {"SKYPILOT_CLUSTER_INFO": json.dumps(info), "SKYPILOT_NUM_NODES": "1", "SKYGREEN_OFFERS": OFFERS,
            "SKYGREEN_GCP_METADATA_URL": metadata.url, "SKYGREEN_NOTICE_POLL_S": "0.05"}  # fmt: skip


def test_sigterm_commits_then_exits_with_the_preempted_code(task, tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), task.run_id))
    work = task.workdir(tmp_path, "work")
    held = task.first_commit
    proc = task.train(work, task.env(tmp_path, bucket, SKYGREEN_TEST_HOLD_AT_STEPS=str(held)))
    wait_for_commit(proc, store, held)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, 300)
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    # HF's hold is inside its save: it exits there. Lightning's is in its checkpoint write, before
    # the batch ends: the SIGTERM is seen at the next batch end, which saves, commits and exits
    assert committed_folder_steps(store) == ([held] if task is HF_TASK else [held, held + 1]), out
    assert not (work / task.final).exists()
    (segment,) = read_ledger(store)
    assert segment.end == "preempted" and segment.step == committed_folder_steps(store)[-1]


def test_a_preemption_notice_saves_at_the_next_step_and_training_goes_on(task, tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), task.run_id))
    work = task.workdir(tmp_path, "work")
    held, release = task.first_commit, tmp_path / "release"
    release.mkdir()
    with MetadataServer("gcp") as metadata:
        env = task.env(tmp_path, bucket, SKYGREEN_CHECKPOINT_KEEP="10", SKYGREEN_TEST_HOLD_AT_STEPS=str(held),
                       SKYGREEN_TEST_HOLD_RELEASE=str(release), **on_gcp(metadata))  # fmt: skip
        proc = task.train(work, env)
        wait_for_commit(proc, store, held)
        metadata.notice = True  # the cloud announces the end while the run holds at `held`
        polls = metadata.polls
        wait_for(lambda: metadata.polls >= polls + 2 or proc.poll() is not None, "the watcher to see the notice")
        assert proc.poll() is None, finish(proc)[-3000:]
        (release / str(held)).touch()
        out = finish(proc)
    assert proc.returncode == 0, out
    steps = committed_folder_steps(store)
    # the notice's save at the step after the hold, then the task's own saves; the notice stayed
    # up and was acted on once
    assert held + 1 in steps and steps[-1] == task.last_commit, (steps, out)
    assert [s for s in steps if s % task.first_commit] == [held + 1], steps
    assert (work / task.final).exists()
    (segment,) = read_ledger(store)
    assert segment.end == "completed" and segment.step == task.last_commit


def test_a_budget_stops_the_run_with_a_committed_checkpoint(task, tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), task.run_id))
    work = task.workdir(tmp_path, "work")
    with MetadataServer("gcp") as metadata:
        # a budget spent within the first step at the L4's price: the first check stops the run
        env = task.env(tmp_path, bucket, SKYGREEN_BUDGET_USD="0.000000000001", **on_gcp(metadata))
        proc = task.train(work, env)
        out = finish(proc)
    assert proc.returncode == 0, out
    assert "reached its budget" in out and f"skygreen resume {task.run_id} --budget-usd" in out, out[-3000:]
    (segment,) = read_ledger(store)
    assert segment.end == "budget" and 0 < segment.step < task.last_commit, segment
    assert committed_folder_steps(store)[-1] == segment.step  # the stop saved and committed its step


def test_checkpoint_every_n_steps_asks_the_trainer_to_save_at_multiples_of_n(task, tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), task.run_id))
    work = task.workdir(tmp_path, "work")
    # the script's own saves out of the way: HF's save_steps past the end, Lightning's one epoch end
    own = {"HF_MAX_STEPS": "7", "HF_SAVE_STEPS": "1000"} if task is HF_TASK else {"LT_EPOCHS": "1"}
    env = task.env(tmp_path, bucket, **own, SKYGREEN_CHECKPOINT_EVERY_STEPS="3", SKYGREEN_CHECKPOINT_KEEP="10")
    proc = task.train(work, env)
    out = finish(proc)
    assert proc.returncode == 0, out
    steps = committed_folder_steps(store)
    assert [s for s in steps if s % 3 == 0] == [3, 6], (steps, out[-3000:])
    assert steps[-1] == (7 if task is HF_TASK else LIGHTNING_STEPS_PER_EPOCH), steps  # the run's own last save


def test_early_stopping_on_the_evaluation_metric_saves_and_stops(task, tmp_path):
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), task.run_id))
    work = task.workdir(tmp_path, "work")
    # the loss falls evaluation after evaluation, so with mode max the second one does not improve
    stop = {"SKYGREEN_EARLY_STOP_METRIC": "val_loss", "SKYGREEN_EARLY_STOP_MODE": "max",
            "SKYGREEN_EARLY_STOP_PATIENCE": "1"}  # fmt: skip
    longer = {"HF_MAX_STEPS": "20"} if task is HF_TASK else {"LT_EPOCHS": "5"}
    proc = task.train(work, task.env(tmp_path, bucket, **longer, **stop))
    out = finish(proc)
    assert proc.returncode == 0, out
    second = 2 * task.first_commit
    assert committed_folder_steps(store) == [task.first_commit, second], "stopped at the second evaluation, saved"
    (segment,) = read_ledger(store)
    assert (segment.end, segment.step) == ("early-stopped", second)
    assert "val_loss" in segment.metrics


@pytest.mark.parametrize("cloud", ["s3", "gcs"])
@pytest.mark.parametrize("name", ["hf", "lightning"])
def test_checkpoints_round_trip_through_a_cloud_bucket(name, cloud, request, tmp_path):
    task = _task(name)
    scheme = {"s3": "s3", "gcs": "gs"}[cloud]
    bucket = f"{scheme}://{request.getfixturevalue(f'{cloud}_bucket')}/runs"
    store = open_store(join_url(bucket, task.run_id))
    first = task.workdir(tmp_path, "vm1")
    # HF's own save_total_limit prunes the local folders only: the bucket keeps what `keep` says
    limit = {"HF_SAVE_TOTAL_LIMIT": "1"} if task is HF_TASK else {}
    out = finish(task.train(first, task.env(tmp_path, bucket, **limit)))
    assert (first / task.final).exists(), out
    last_two = [task.last_commit - task.first_commit, task.last_commit]
    assert committed_folder_steps(store) == last_two  # keep: 2
    if task is HF_TASK:
        assert [p.name for p in (first / task.restore_parent).glob("checkpoint-*")] == [
            f"checkpoint-{task.last_commit}"
        ]
    assert all(m.meta["run_id"] == task.run_id for m in folder_manifests(store))

    second = task.workdir(tmp_path, "vm2")  # a new machine: only the bucket survived
    out = finish(task.train(second, task.env(tmp_path, bucket)))
    assert (second / task.final).exists(), out
    folders = [p for p in (second / task.restore_parent).iterdir() if p.is_dir()]
    restored = next((p for p in folders if p.name.endswith(f"-{task.last_commit}")), None)
    assert restored is not None, folders
    saved = first / task.saved_files.format(folder=restored.name)
    for path in restored.iterdir():  # every file came back as the script wrote it
        assert path.read_bytes() == (saved / path.name).read_bytes(), path.name
    if task is LIGHTNING_TASK:  # the restart resumed at the end and wrote the same weights
        same_weights(task.weights(second), task.weights(first))
        assert committed_folder_steps(store) == last_two
    # HF's Trainer (transformers 5.17) trains one more step when it resumes at max_steps: its
    # `_run_epoch` checks `should_training_stop` only after a step


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SKYGREEN_CLOUD": "oracle"}, "skygreen: no preemption notice check for cloud 'oracle'"),
        ({"SKYGREEN_POWER_CAP": "0.6", "SKYGREEN_POWER_REQUIRED": "true"},
         "skygreen: power.required is true but this process has no GPU to cap"),
    ],
    ids=["unknown-cloud", "power-required-without-a-gpu"],
)  # fmt: skip
def test_a_setup_error_at_train_start_exits_2_with_its_fix_and_no_traceback(task, tmp_path, env, message):
    """Raised when the framework starts training (not when the callback is built): the same
    one-line error and exit code as at construction, and no ledger segment half-written."""
    bucket = tmp_path / "bucket"
    store = open_store(join_url(str(bucket), task.run_id))
    work = task.workdir(tmp_path, "work")
    proc = task.train(work, task.env(tmp_path, bucket, **env))
    out = finish(proc, 600)
    assert proc.returncode == 2, out
    assert message in out and "\n  fix: " in out and "Traceback" not in out, out[-3000:]
    assert read_ledger(store) == [] and committed_folder_steps(store) == []
    assert not list(store.list("")), "nothing written to the bucket"


def test_a_setup_error_at_train_start_shows_its_traceback_under_skygreen_debug(tmp_path):
    task = _task("lightning")
    work = task.workdir(tmp_path, "work")
    proc = task.train(work, task.env(tmp_path, tmp_path / "bucket", SKYGREEN_CLOUD="oracle", SKYGREEN_DEBUG="1"))
    out = finish(proc, 600)
    assert proc.returncode != 0 and "Traceback" in out and "RuntimeSetupError" in out, out[-3000:]
