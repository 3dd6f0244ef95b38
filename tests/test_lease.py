"""One writer per run: the lease in the bucket fences an older life out of commits and retention.

The store operations on a real local store and on S3 (moto), then two real `Checkpointer`s of
the same run in one process: the older one, finding a newer launch's lease, commits nothing,
deletes nothing and exits with the superseded code after one line that says why. An older life
held after its lease check uploads beside the newer life's blobs, never over them, for full
checkpoints and for sharded (DCP) ones alike.
"""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from skygreen.checkpoint.lease import (
    LAUNCH_ENV,
    LEASE_KEY,
    Lease,
    LeaseLostError,
    check_lease,
    launch_number,
    read_lease,
    take_lease,
)
from skygreen.checkpoint.manifest import base_blob_name, committed_steps
from skygreen.checkpoint.retention import apply_retention
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import RuntimeSetupError
from skygreen.exit_codes import SUPERSEDED
from skygreen.runtime.checkpointer import Checkpointer
from skygreen.runtime.sharded import ShardedCheckpointer
from skygreen.task.settings import env_names


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "bucket" / "run")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/run"


def state(step: int) -> dict:
    torch.manual_seed(step)
    return {"model": torch.nn.Linear(4, 2).state_dict(), "step": step}


def test_a_newer_launch_takes_the_lease_and_the_older_one_loses_it(url):
    store = open_store(url)
    first = take_lease(store, 1)
    check_lease(store, first)  # still ours
    second = take_lease(store, 2)
    assert read_lease(store) == second
    with pytest.raises(LeaseLostError, match="launch 1 of this run is superseded: a newer launch") as lost:
        check_lease(store, first)
    assert lost.value.exit_code == SUPERSEDED == 3
    with pytest.raises(LeaseLostError):
        take_lease(store, 1)  # an older life that starts late never takes it back
    assert read_lease(store) == second


def test_a_newer_vm_of_the_same_launch_wins_and_an_older_launch_written_over_ours_is_taken_back(tmp_path):
    store = open_store(str(tmp_path / "run"))
    old_vm = take_lease(store, 3)
    new_vm = take_lease(store, 3)  # the controller's recovery: same launch number, newer VM
    with pytest.raises(LeaseLostError, match="a newer VM of the same launch"):
        check_lease(store, old_vm)
    store.put(LEASE_KEY, Lease(launch=2, holder="stale", taken_at="").dumps())  # a late writer of launch 2
    check_lease(store, new_vm)
    assert read_lease(store) == new_vm


def test_launch_number_comes_from_the_environment_through_the_settings_codec():
    assert launch_number({LAUNCH_ENV: "4"}) == 4 and launch_number({}) is None
    assert LAUNCH_ENV in env_names()  # one of the runtime settings (`RuntimeSettings.launch`)
    with pytest.raises(RuntimeSetupError, match=r"SKYGREEN_LAUNCH.*must be an integer >= 1"):
        launch_number({LAUNCH_ENV: "0"})
    with pytest.raises(RuntimeSetupError, match=r"SKYGREEN_LAUNCH.*expected an integer"):
        launch_number({LAUNCH_ENV: "two"})


def test_retention_of_a_writer_that_lost_its_lease_deletes_nothing(tmp_path):
    url = str(tmp_path / "run")
    with Checkpointer(url, keep=2) as ck:  # no launch number: no lease, the old behaviour
        for step in (10, 20, 30):
            ck.save(step, state(step))
            ck.wait()
    store = open_store(url)
    assert committed_steps(store) == [20, 30]
    with Checkpointer(url, keep=5) as ck:
        for step in (40, 50):
            ck.save(step, state(step))
            ck.wait()
    mine = take_lease(store, 1)
    take_lease(store, 2)
    with pytest.raises(LeaseLostError):
        apply_retention(store, keep=2, committed_step=50, lease=mine)
    assert committed_steps(store) == [20, 30, 40, 50]


def test_an_older_life_stops_committing_and_deleting_once_a_newer_one_starts(url, caplog):
    old = Checkpointer(url, keep=2, launch=1)
    assert old.load_latest() is None  # takes launch 1's lease
    for step in (10, 20):
        old.save(step, state(step))
        old.wait()
    store = open_store(url)
    assert committed_steps(store) == [10, 20] and read_lease(store).launch == 1

    new = Checkpointer(url, keep=2, launch=2)
    assert new.load_latest().step == 20  # launch 2 takes over
    new.save(21, state(21))
    new.wait()

    caplog.set_level(logging.ERROR, logger="skygreen.checkpoint")
    old.save(30, state(30))
    with pytest.raises(SystemExit) as stopped:
        old.wait()
    assert stopped.value.code == SUPERSEDED
    assert "launch 1 of this run is superseded" in caplog.text and "without committing or deleting" in caplog.text
    assert committed_steps(store) == [20, 21]  # no step 30, and nothing of launch 2's deleted

    new.save(22, state(22))
    new.close()
    assert committed_steps(store) == [21, 22]
    assert Checkpointer(url).load_latest().step == 22


def test_a_life_that_starts_after_a_newer_one_stops_before_it_deletes_anything(tmp_path, caplog):
    url = str(tmp_path / "run")
    newer = Checkpointer(url, keep=2, launch=5)
    newer.load_latest()
    newer.save(7, state(7))
    newer.close()
    store = open_store(url)
    store.put("ckpt/000000000009/rank0.pt", b"a save of launch 5 in flight")
    late = Checkpointer(url, keep=2, launch=4)
    with pytest.raises(SystemExit) as stopped:
        late.load_latest()
    assert stopped.value.code == SUPERSEDED
    assert "ckpt/000000000009/rank0.pt" in store.list("ckpt/")  # not removed as a leftover


class GatedUploads:
    """The run's real store, with the blob uploads of one step held at a gate until `release()`:
    a life that passed its lease check and is still uploading when a newer life takes over."""

    def __init__(self, store, step: int) -> None:
        self.store, self.prefix = store, f"ckpt/{step:012d}/"
        self.reached, self.released = threading.Event(), threading.Event()
        self.uploaded: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    def put_file(self, key: str, path) -> None:
        if key.startswith(self.prefix):
            self.reached.set()
            assert self.released.wait(120), "the gate was never released"
            self.uploaded.append(key)
        self.store.put_file(key, path)

    def release(self) -> None:
        self.released.set()


def test_an_older_life_that_passed_its_check_uploads_beside_the_newer_lifes_blobs_never_over_them(url, caplog):
    old = Checkpointer(url, keep=3, launch=1)
    old.load_latest()
    old.save(10, state(10))
    old.wait()
    gate = GatedUploads(old.store, 20)
    old.store = gate  # the same bucket, its uploads of step 20 held
    old.save(20, state(99))  # passes its lease check, then stalls uploading
    assert gate.reached.wait(120), "the older life never started uploading step 20"

    new = Checkpointer(url, keep=3, launch=2)
    assert new.load_latest().step == 10  # takes the lease
    new.save(20, state(20))  # the same step, as a relaunch redoes it
    new.wait()
    caplog.set_level(logging.ERROR, logger="skygreen.checkpoint")
    gate.release()
    with pytest.raises(SystemExit) as stopped:
        old.wait()  # uploaded, then found the newer lease before its manifest
    assert stopped.value.code == SUPERSEDED
    assert gate.uploaded, "the older life's uploads went through"

    store = open_store(url)
    names = {key.rsplit("/", 1)[1] for key in store.list("ckpt/000000000020/")}
    assert {key.rsplit("/", 1)[1] for key in gate.uploaded} <= names  # beside the newer life's files
    loaded = Checkpointer(url).load_latest()
    assert loaded is not None and loaded.step == 20  # the newer life's commit still verifies
    assert torch.equal(loaded.state["model"]["weight"], state(20)["model"]["weight"])
    assert all(new.life in name for name in loaded.manifest.blobs)  # it lists its own life's blobs only
    assert not any(old.life in name for name in loaded.manifest.blobs)


def test_checkpoints_of_lives_with_and_without_a_launch_read_each_other_and_ranks_find_their_own(tmp_path):
    url = str(tmp_path / "run")
    with Checkpointer(url) as plain:  # written before blobs were named after their life
        plain.save(5, state(5))
    assert open_store(url).exists("ckpt/000000000005/shared.pt")
    ranks = [Checkpointer(url, rank=r, world_size=2, launch=3, rank_wait_s=120) for r in (0, 1)]
    assert [ck.load_latest().step for ck in ranks] == [5, 5]  # a launched life reads the plain names
    assert ranks[0].life != ranks[1].life and ranks[0].life.startswith("l3-")
    threads = [threading.Thread(target=lambda r=r: ranks[r].save(6, state(6), rank_state={"rank": r})) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ck in ranks:
        ck.close()
    names = {key.rsplit("/", 1)[1] for key in open_store(url).list("ckpt/000000000006/")}
    assert {"rank00000.l3.json", "rank00001.l3.json", "manifest.json"} <= names  # notes of launch 3
    loaded = [Checkpointer(url, rank=r, world_size=2).load_latest() for r in (0, 1)]  # and read without one
    assert [each.step for each in loaded] == [6, 6] and [each.rank_state["rank"] for each in loaded] == [0, 1]
    assert set(loaded[0].manifest.blobs) == {f"shared.{ranks[0].life}.pt", f"rank00000.{ranks[0].life}.pt",
                                             f"rank00001.{ranks[1].life}.pt"}  # fmt: skip


def sharded_state(scale: float) -> dict:
    return {
        "model": {"w": torch.arange(12.0).reshape(3, 4) * scale, "b": torch.ones(4) * scale},
        "progress": {"step": int(scale)},
    }


def sharded(url: str, **kwargs) -> ShardedCheckpointer:
    return ShardedCheckpointer(url, template=lambda: sharded_state(0.0), environ={}, **kwargs)


SHARDED_BASES = {"dcp.metadata", "dcp__0_0.distcp", "shared.pt", "rank00000.pt"}


def test_an_older_sharded_life_that_passed_its_check_uploads_beside_the_newer_lifes_shard_files(url, caplog):
    old = sharded(url, keep=3, launch=1)
    assert old.load_latest() is None
    old.save(10, sharded_state(1.0))
    old.wait()
    gate = GatedUploads(old.store, 20)
    old.store = gate  # the same bucket, its uploads of step 20 held
    old.save(20, sharded_state(99.0))  # stages its DCP files, passes its lease check, then stalls uploading
    assert gate.reached.wait(120), "the older life never started uploading step 20"

    new = sharded(url, keep=3, launch=2)
    assert new.load_latest().step == 10  # takes the lease
    new.save(20, sharded_state(2.0))  # the same step, as a relaunch redoes it
    new.wait()
    caplog.set_level(logging.ERROR, logger="skygreen.checkpoint")
    gate.release()
    with pytest.raises(SystemExit) as stopped:
        old.wait()  # uploaded every file, then found the newer lease before its manifest
    assert stopped.value.code == SUPERSEDED
    uploaded = {key.rsplit("/", 1)[1] for key in gate.uploaded}
    assert {base_blob_name(name) for name in uploaded} == SHARDED_BASES  # the same files as the newer life's

    names = {key.rsplit("/", 1)[1] for key in open_store(url).list("ckpt/000000000020/")}
    assert uploaded <= names  # beside the newer life's files
    loaded = sharded(url).load_latest()
    assert loaded is not None and loaded.step == 20  # the newer life's commit still verifies
    assert torch.equal(loaded.state["model"]["w"], sharded_state(2.0)["model"]["w"])
    assert loaded.state["progress"] == {"step": 2}
    assert {base_blob_name(name) for name in loaded.manifest.blobs} == SHARDED_BASES
    assert all(new.life in name for name in loaded.manifest.blobs)  # it lists its own life's files only
    assert not uploaded & set(loaded.manifest.blobs)
    assert set(loaded.fetched or ()) == set(loaded.manifest.blobs)  # one rank: it reads every file


def test_sharded_checkpoints_of_lives_with_and_without_a_launch_read_each_other(tmp_path):
    url = str(tmp_path / "run")
    with sharded(url) as plain:  # written before shard files were named after their life
        plain.save(5, sharded_state(5.0))
    assert {key.rsplit("/", 1)[1] for key in open_store(url).list("ckpt/000000000005/")} == SHARDED_BASES | {
        "rank00000.json",
        "manifest.json",
    }
    life = sharded(url, launch=3)
    loaded = life.load_latest()  # a launched life reads the plain names
    assert loaded is not None and loaded.step == 5 and set(loaded.fetched or ()) == SHARDED_BASES
    assert torch.equal(loaded.state["model"]["w"], sharded_state(5.0)["model"]["w"])
    life.save(6, sharded_state(6.0), rank_state={"rank": 0})
    life.close()
    assert life.life is not None and life.life.startswith("l3-")

    names = {key.rsplit("/", 1)[1] for key in open_store(url).list("ckpt/000000000006/")}
    tag = life.life
    assert names == {
        f"dcp.{tag}.metadata",
        f"dcp__0_0.{tag}.distcp",
        f"shared.{tag}.pt",
        f"rank00000.{tag}.pt",
        "rank00000.l3.json",
        "manifest.json",
    }
    again = sharded(url).load_latest()  # and a reader without a launch reads the life's names
    assert again is not None and again.step == 6 and again.rank_state == {"rank": 0}
    assert torch.equal(again.state["model"]["b"], sharded_state(6.0)["model"]["b"])
    assert set(again.fetched or ()) == set(again.manifest.blobs) == names - {"rank00000.l3.json", "manifest.json"}
