"""Big blobs come down as ranged parallel GETs, hashed in order as they land, through the real
S3 and GCS test servers behind the fault proxy: the bytes are equal, a part that fails
transiently is retried alone, a corrupted part fails verification, is downloaded again and,
when it stays corrupt, is refused with nothing left at the path."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch

from faultproxy import FaultProxy
from servers import make_s3_bucket, point_s3_at, proxied_bucket, unique_bucket
from skygreen.checkpoint.manifest import SHARED_BLOB, BlobInfo, blob_key
from skygreen.checkpoint.ranged import (
    DEFAULT_RANGED,
    InOrderDigest,
    RangedDownload,
    RangedStore,
    StreamTuner,
    download_ranged,
    fetch_verified,
    part_ranges,
    uses_ranges,
)
from skygreen.checkpoint.store import RetryPolicy
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import CheckpointError, TransientStoreError
from skygreen.runtime.checkpointer import Checkpointer
from tuner_links import LINKS, tune_over

KIB = 1024
MIB = 1024 * KIB
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.0, max_delay_s=0.0, deadline_s=None)
# Small parts keep the servers quick; the code path is the one a 1 GB blob takes.
SMALL = RangedDownload(threshold_bytes=1 * MIB, part_bytes=256 * KIB, concurrency=4, window_parts=6)
BLOB_BYTES = 3 * MIB + 12_345  # 13 parts, the last one short


def blob_bytes(seed: int = 0, size: int = BLOB_BYTES) -> bytes:
    return random.Random(seed).randbytes(size)


def info(data: bytes) -> BlobInfo:
    return BlobInfo(size=len(data), sha256=hashlib.sha256(data).hexdigest())


def expected_ranges(size: int, part: int) -> list[str]:
    return [f"bytes={start}-{stop - 1}" for start, stop in part_ranges(size, part)]


# -- the pure parts -------------------------------------------------------------------------


def test_part_ranges_cover_the_blob_once_in_order():
    assert part_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert part_ranges(8, 4) == [(0, 4), (4, 8)]
    assert part_ranges(0, 4) == []
    with pytest.raises(ValueError):
        part_ranges(10, 0)


def test_in_order_digest_of_parts_arriving_shuffled_is_the_sha256_of_the_whole():
    data = blob_bytes(1, 1000)
    parts = part_ranges(len(data), 64)
    order = list(range(len(parts)))
    random.Random(7).shuffle(order)
    digest = InOrderDigest(len(parts))
    for i in order[:-1]:
        digest.add(i, data[parts[i][0] : parts[i][1]])
    with pytest.raises(RuntimeError, match="parts hashed"):
        digest.result()
    last = order[-1]
    digest.add(last, data[parts[last][0] : parts[last][1]])
    assert digest.result() == info(data)
    with pytest.raises(ValueError, match="given twice"):
        digest.add(0, b"x")


def test_ranged_download_settings_are_validated():
    with pytest.raises(ValueError, match="part_bytes"):
        RangedDownload(part_bytes=0)
    with pytest.raises(ValueError, match="window_parts"):
        RangedDownload(concurrency=8, window_parts=4)
    with pytest.raises(ValueError, match="start_streams"):
        RangedDownload(start_streams=0)
    assert DEFAULT_RANGED.threshold_bytes == 64 * MIB


@pytest.mark.parametrize(
    ("name", "settles_at", "levels_measured"),
    [("cloud-link", 8, [2, 4, 8]), ("small-host", 2, [2, 4]), ("full-link", 4, [2, 4, 8])],
)
def test_the_stream_tuner_doubles_streams_while_that_pays_and_keeps_the_best(name, settles_at, levels_measured):
    link = LINKS[name]
    tuner = tune_over(StreamTuner(start=2, most=8), link)
    assert tuner.settled and tuner.streams == settles_at
    assert [streams for streams, _ in tuner.levels] == levels_measured
    assert all(rate == pytest.approx(link(streams)) for streams, rate in tuner.levels)


def test_the_stream_tuner_with_start_at_most_never_moves_and_counts_only_its_own_level():
    fixed = tune_over(StreamTuner(start=8, most=8), lambda n: 1e9)
    assert fixed.settled and fixed.streams == 8 and fixed.levels == []
    tuner = StreamTuner(start=2, most=8)
    level = tuner.part_started()
    for _ in range(3):
        tuner.part_done(level, MIB, started_s=0.0, now_s=1.0)
    tuner.part_done(level + 1, MIB, started_s=0.0, now_s=1.0)  # a part of another level does not count towards this one
    assert tuner.levels == [] and tuner.streams == 2
    tuner.part_done(level, MIB, started_s=0.5, now_s=2.5)
    assert [streams for streams, _ in tuner.levels] == [2] and tuner.streams == 4
    # 2 streams, each part's bytes over its own seconds: 4 MiB in 3 + 2 part-seconds
    assert tuner.levels[0][1] == pytest.approx(2 * 4 * MIB / 5.0)


# -- local store ----------------------------------------------------------------------------


def test_local_store_reads_ranges_in_parallel_and_verifies(tmp_path):
    store = open_store(str(tmp_path / "bucket"))
    data = blob_bytes(2)
    store.put("big.bin", data)
    assert isinstance(store, RangedStore) and uses_ranges(store, len(data), SMALL)
    out = tmp_path / "out.bin"
    fetch_verified(store, "big.bin", out, info(data), plan=SMALL)
    assert out.read_bytes() == data


def test_local_blob_rotten_at_rest_is_refused_after_a_second_try_and_deleted(tmp_path, caplog):
    store = open_store(str(tmp_path / "bucket"))
    data = blob_bytes(3)
    rotten = bytearray(data)
    rotten[len(rotten) // 3] ^= 0x01
    store.put("big.bin", bytes(rotten))
    out = tmp_path / "out.bin"
    with pytest.raises(CheckpointError, match=r"big.bin does not match the manifest .*corrupt or partial"):
        fetch_verified(store, "big.bin", out, info(data), plan=SMALL)
    assert not out.exists(), "unverified bytes never stay at the path"
    assert caplog.text.count("does not match the manifest (attempt") == SMALL.mismatch_attempts


# -- S3, GCS and Azure through the fault proxy----------------------------------------------------


@pytest.fixture(params=["s3", "gs", "az"])
def proxied(request, monkeypatch):
    """A store on a fresh bucket behind a fault proxy, holding one blob; yields (store, proxy, data)."""
    bucket_url, proxy = proxied_bucket(request, monkeypatch, request.param)
    store = open_store(f"{bucket_url}/runs/r1", retry=FAST_RETRY)
    data = blob_bytes(4)
    store.put("ckpt/big.bin", data)
    yield store, proxy, data
    proxy.stop()


def test_big_blob_comes_down_in_ranged_parts_with_equal_bytes(proxied, tmp_path):
    store, proxy, data = proxied
    out = tmp_path / "out.bin"
    fetch_verified(store, "ckpt/big.bin", out, info(data), plan=SMALL)
    assert out.read_bytes() == data
    assert sorted(proxy.ranged_requests()) == sorted(expected_ranges(len(data), SMALL.part_bytes))
    assert set(proxy.ranged_requests()) == set(proxy.ranged_requests("200")) | set(proxy.ranged_requests("206"))


@pytest.mark.parametrize("proxied", ["s3", "gs", "az"], indirect=True)
def test_streams_are_added_while_a_paced_link_gives_each_its_share(proxied, tmp_path):
    # Each reply paced at 2 MB/s, as a cloud front end serves one stream: every doubling of the
    # streams doubles the throughput, so the download grows from 2 streams to all 8. At 16 MB/s
    # for all 8 the link, not the CPU, sets the rate even with other tests on both cores (at
    # 4 MB/s a stream, 32 MB/s through the proxy and the server was more than two busy cores gave).
    store, proxy, _ = proxied
    data = blob_bytes(5, size=36 * MIB)  # 4 + 8 + 16 parts measured, and those in flight between levels
    store.put("ckpt/paced.bin", data)
    proxy.reply_mb_s = 2.0
    plan = RangedDownload(threshold_bytes=1 * MIB, part_bytes=1 * MIB, concurrency=8, start_streams=2, window_parts=12)
    tuner = StreamTuner(start=plan.start_streams, most=plan.concurrency)
    got = download_ranged(store, "ckpt/paced.bin", tmp_path / "out", size_bytes=len(data), plan=plan, tuner=tuner)
    assert got == info(data) and (tmp_path / "out").read_bytes() == data
    assert [streams for streams, _ in tuner.levels] == [2, 4, 8] and tuner.streams == 8
    rates = [rate for _, rate in tuner.levels]
    assert rates == sorted(rates), tuner.levels


def test_a_small_blob_takes_one_stream(proxied, tmp_path):
    store, proxy, _ = proxied
    small = blob_bytes(5, 100 * KIB)
    store.put("ckpt/small.bin", small)
    out = tmp_path / "small.bin"
    fetch_verified(store, "ckpt/small.bin", out, info(small), plan=SMALL)
    assert out.read_bytes() == small
    gets = [path for method, path, _ in proxy.log if method == "GET" and "small.bin" in path]
    assert len(gets) == 1, gets


def test_a_part_that_fails_transiently_is_retried_alone(proxied, tmp_path):
    store, proxy, data = proxied
    start = 5 * SMALL.part_bytes
    proxy.inject("503", times=2, range_from=start)
    proxy.inject("drop_reply", times=1, range_from=8 * SMALL.part_bytes)
    out = tmp_path / "out.bin"
    fetch_verified(store, "ckpt/big.bin", out, info(data), plan=SMALL)
    assert out.read_bytes() == data
    assert proxy.pending() == 0
    wanted = expected_ranges(len(data), SMALL.part_bytes)
    requested = proxy.ranged_requests()
    for header in wanted:
        retried = header.startswith((f"bytes={start}-", f"bytes={8 * SMALL.part_bytes}-"))
        assert requested.count(header) == (3 if header.startswith(f"bytes={start}-") else 2 if retried else 1), header
    assert len(requested) == len(wanted) + 3, "only the failing parts were asked for again"


def test_a_part_corrupted_in_transit_fails_verification_and_the_blob_is_fetched_again(proxied, tmp_path, caplog):
    store, proxy, data = proxied
    proxy.inject("corrupt", times=1, range_from=2 * SMALL.part_bytes)
    out = tmp_path / "out.bin"
    with caplog.at_level(logging.WARNING, logger="skygreen.store"):
        fetch_verified(store, "ckpt/big.bin", out, info(data), plan=SMALL)
    assert out.read_bytes() == data
    assert proxy.ranged_requests("corrupt") == [f"bytes={2 * SMALL.part_bytes}-{3 * SMALL.part_bytes - 1}"]
    assert "does not match the manifest (attempt 1 of 2" in caplog.text
    assert len(proxy.ranged_requests()) == 2 * len(part_ranges(len(data), SMALL.part_bytes))


def test_a_part_corrupted_every_time_fails_closed(proxied, tmp_path):
    store, proxy, data = proxied
    proxy.inject("corrupt", times=1_000, range_from=7 * SMALL.part_bytes)
    out = tmp_path / "out.bin"
    with pytest.raises(CheckpointError, match="does not match the manifest"):
        fetch_verified(store, "ckpt/big.bin", out, info(data), plan=SMALL)
    assert not out.exists()
    assert len(proxy.ranged_requests("corrupt")) == SMALL.mismatch_attempts


def test_a_part_failing_for_good_stops_the_download_and_leaves_no_file(proxied, tmp_path):
    store, proxy, data = proxied
    proxy.inject("503", times=1_000, range_from=3 * SMALL.part_bytes)
    out = tmp_path / "out.bin"
    with pytest.raises(TransientStoreError, match=r"still failing after 4 attempt\(s\)"):
        download_ranged(store, "ckpt/big.bin", out, size_bytes=len(data), plan=SMALL)
    assert not out.exists()
    assert len(proxy.ranged_requests("503")) == FAST_RETRY.max_attempts


def test_checkpointer_restores_a_big_checkpoint_by_ranges_and_skips_one_that_stays_corrupt(proxied):
    """The real load path with the default settings: a 72 MiB model goes ranged; a commit
    whose parts keep arriving corrupted is skipped and the one before it loads."""
    store, proxy, _ = proxied
    url = store.url.replace("/runs/r1", "/runs/ck")
    g = torch.Generator().manual_seed(0)
    big = {"w": torch.randn(72 * MIB // 4, generator=g)}
    with Checkpointer(url, retry=FAST_RETRY) as ck:
        ck.save(1, {"model": {"w": torch.ones(3)}})
        ck.wait()
        ck.save(2, {"model": big})
    loaded = Checkpointer(url, retry=FAST_RETRY).load_latest()
    assert loaded.step == 2 and torch.equal(loaded.state["model"]["w"], big["w"])
    size = open_store(url).size(blob_key(2, SHARED_BLOB))
    assert size > DEFAULT_RANGED.threshold_bytes
    fetched = proxy.ranged_requests(path_contains="shared.pt")
    assert sorted(fetched) == sorted(expected_ranges(size, DEFAULT_RANGED.part_bytes))
    proxy.inject("corrupt", times=1_000, ranged=True, path_contains="000000000002")
    again = Checkpointer(url, retry=FAST_RETRY).load_latest()
    assert again.step == 1 and torch.equal(again.state["model"]["w"], torch.ones(3))


def test_a_ranged_prefetch_writing_in_place_is_waited_for_not_taken_for_dead(tmp_path, monkeypatch):
    """A ranged download preallocates its `.part` and writes into it: the size never changes,
    so the runtime must see progress in the writes themselves, not in the size. The clock here
    jumps past `stall_s` between polls; only the writes keep the wait alive."""
    from skygreen.checkpoint import prefetch as prefetch_module
    from skygreen.checkpoint.prefetch import LOCK_NAME, wait_for_part
    from skygreen.locks import held_while_alive

    part, final = tmp_path / "shared.pt.part", tmp_path / "shared.pt"
    with open(part, "wb") as f:
        f.truncate(4096)
    clock_s = [0.0]
    polls: list[int] = []

    def one_poll_later(_seconds: float) -> None:
        clock_s[0] += 10.0
        polls.append(len(polls))
        if len(polls) < 5:
            fd = os.open(part, os.O_WRONLY)
            os.pwrite(fd, b"x" * 512, 512 * len(polls))
            os.close(fd)
            os.utime(part, ns=(len(polls) * 10**9, len(polls) * 10**9))
        else:
            part.rename(final)

    lock = tmp_path / LOCK_NAME
    monkeypatch.setattr(prefetch_module.time, "monotonic", lambda: clock_s[0])
    monkeypatch.setattr(prefetch_module.time, "sleep", one_poll_later)
    with held_while_alive(lock):  # the prefetch process, alive
        wait_for_part(part, final, lock=lock, stall_s=5.0)
    monkeypatch.undo()
    assert final.exists() and len(polls) == 5, polls


def test_setup_prefetch_command_fetches_a_big_blob_by_ranges_and_refuses_a_corrupt_one(
    moto_server, monkeypatch, tmp_path
):
    """`python -m skygreen.runtime.prefetch`, as setup runs it, on S3 behind the fault proxy."""
    from skygreen.checkpoint.manifest import file_info, iter_manifests
    from skygreen.checkpoint.prefetch import prefetch_dir, run_url

    proxy = FaultProxy(moto_server.url).start()
    try:
        point_s3_at(monkeypatch, proxy.url)
        bucket = unique_bucket()
        make_s3_bucket(bucket)
        url = run_url(f"s3://{bucket}", "r-big")
        big = torch.randn(70 * MIB // 4, generator=torch.Generator().manual_seed(1))
        with Checkpointer(url) as ck:
            ck.save(5, {"model": {"w": big}})
        manifest = next(iter_manifests(open_store(url)))
        env = {
            **os.environ,
            "HOME": str(tmp_path / "home"),
            "SKYGREEN_BUCKET": f"s3://{bucket}",
            "SKYGREEN_RUN_ID": "r-big",
        }
        command = [sys.executable, "-m", "skygreen.runtime.prefetch"]

        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "step 5 prefetched" in done.stdout
        folder = prefetch_dir(url, home=tmp_path / "home") / "5"
        assert file_info(folder / SHARED_BLOB) == manifest.blobs[SHARED_BLOB]
        size = manifest.blobs[SHARED_BLOB].size
        fetched = proxy.ranged_requests(path_contains=SHARED_BLOB)
        assert sorted(fetched) == sorted(expected_ranges(size, DEFAULT_RANGED.part_bytes))

        shutil.rmtree(folder)
        proxy.inject("corrupt", times=1_000, ranged=True, path_contains=SHARED_BLOB)
        refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert f"{SHARED_BLOB} does not match the manifest" in refused.stderr
        assert "the runtime downloads the checkpoint itself" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert not (folder / SHARED_BLOB).exists() and not (folder / f"{SHARED_BLOB}.part").exists()
        assert not (folder / f"{SHARED_BLOB}.verified").exists()  # no receipt for what did not verify
    finally:
        proxy.stop()
