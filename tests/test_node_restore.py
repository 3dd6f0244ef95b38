"""One restore per node for multi-process trainers (skygreen.integrations.node_restore): local
rank 0 downloads, the other local ranks wait and name the same folder, through a barrier (a
process group) or a marker named by the torchrun launch; on a real local bucket, with the ranks
as threads that really wait on each other."""

from __future__ import annotations

import threading

import pytest

from skygreen.checkpoint.folders import commit_and_retain
from skygreen.checkpoint.store import join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import RuntimeSetupError
from skygreen.integrations.node_restore import MARKER_PREFIX, launch_token, restore_per_node

RUN_ID = "ranks-20260101-000000-abcd"


@pytest.fixture
def store(tmp_path):
    store = open_store(join_url(str(tmp_path / "bucket"), RUN_ID))
    for step in (4, 8):
        folder = tmp_path / "saved" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "weights.bin").write_bytes(bytes([step]) * 1000)
        commit_and_retain(store, folder, step=step, keep=3)
    return store


class CountingStore:
    """The real store, counting the blob downloads each rank makes."""

    def __init__(self, inner):
        self.inner = inner
        self.downloads = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_to(self, key, out):
        self.downloads += 1
        return self.inner.get_to(key, out)


def run_ranks(target, count: int = 2) -> list:
    results: list = [None] * count
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = target(rank)
        except BaseException as e:  # re-raised by the test thread below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(rank,)) for rank in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank never returned"
    if errors:
        raise errors[0]
    return results


def test_with_a_barrier_only_local_rank_0_downloads_and_every_rank_gets_its_folder(tmp_path, store):
    counting = [CountingStore(store), CountingStore(store)]
    meet = threading.Barrier(2, timeout=60)
    out = tmp_path / "out"
    (out / f"{MARKER_PREFIX}group").parent.mkdir()
    (out / f"{MARKER_PREFIX}group").write_text('{"step": 4}')  # left by an earlier life: not trusted
    restored = run_ranks(
        lambda rank: restore_per_node(counting[rank], out, local_rank=rank, token=None, barrier=meet.wait)
    )
    assert [r.step for r in restored] == [8, 8]
    assert restored[0].path == restored[1].path == out / "checkpoint-8"
    assert (out / "checkpoint-8" / "weights.bin").read_bytes() == bytes([8]) * 1000
    assert counting[0].downloads == 1 and counting[1].downloads == 0


def test_before_a_process_group_the_launch_marker_makes_the_others_wait(tmp_path, store):
    counting = [CountingStore(store), CountingStore(store)]
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{MARKER_PREFIX}1-0").write_text('{"step": 4}')  # an earlier launch's marker
    gate = threading.Event()

    def rank(local_rank: int):
        if local_rank == 0:
            gate.wait(60)  # rank 1 is already waiting when rank 0 starts its restore
        else:
            gate.set()
        return restore_per_node(counting[local_rank], out, local_rank=local_rank, token="2-0", barrier=None)

    restored = run_ranks(rank)
    assert [r.step for r in restored] == [8, 8] and restored[1].path == out / "checkpoint-8"
    assert counting[1].downloads == 0
    assert not (out / f"{MARKER_PREFIX}1-0").exists()


def test_a_fresh_start_is_none_on_every_rank(tmp_path):
    empty = open_store(join_url(str(tmp_path / "bucket"), RUN_ID))
    meet = threading.Barrier(2, timeout=60)
    restored = run_ranks(
        lambda rank: restore_per_node(empty, tmp_path / "out", local_rank=rank, token=None, barrier=meet.wait)
    )
    assert restored == [None, None]


def test_a_rank_whose_local_rank_0_never_restores_fails_with_the_reason(tmp_path, store):
    with pytest.raises(RuntimeSetupError) as caught:
        restore_per_node(store, tmp_path / "out", local_rank=1, token="7-0", barrier=None, wait_s=0.3, poll_s=0.05)
    assert "local rank 0 did not restore" in str(caught.value) and "fix:" in str(caught.value)


def test_the_launch_token_comes_from_torchrun_only():
    assert launch_token({}) is None
    assert launch_token({"LOCAL_RANK": "1"}) is None  # Lightning's own launcher: not recognised
    token = launch_token({"TORCHELASTIC_RUN_ID": "abc", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert token is not None and token.endswith("-2")


def test_services_restore_on_a_torchrun_rank_waits_for_local_rank_0(tmp_path, store):
    from skygreen.integrations.services import TrainerServices
    from skygreen.task.settings import RuntimeSettings

    settings = RuntimeSettings(run_id=RUN_ID, bucket=str(tmp_path / "bucket"), trainer="transformers")
    base = {**settings.to_env(), "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "t", "TORCHELASTIC_RESTART_COUNT": "0"}
    services = [
        TrainerServices.from_env(trainer="transformers", environ={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(2)
    ]
    restored = run_ranks(lambda rank: services[rank].restore(tmp_path / "out"))
    assert [r.step for r in restored] == [8, 8]
    assert services[1].is_writer is False and services[0].is_writer is True
