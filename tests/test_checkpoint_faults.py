"""Checkpoints through real S3/GCS test servers while things break: injected 500s,
throttling and dropped connections, a server killed mid-upload, access revoked.
In every case training goes on or stops with a clear error, no partial checkpoint is
loaded, and nothing committed is lost."""

from __future__ import annotations

import io

import pytest
import torch

from faultproxy import FaultProxy
from servers import (
    gcs_process,
    make_gcs_bucket,
    make_s3_bucket,
    moto_process,
    point_gcs_at,
    point_s3_at,
    proxied_bucket,
    unique_bucket,
)
from skygreen.checkpoint.manifest import committed_steps
from skygreen.checkpoint.ranged import RangedDownload, RangedStore, download_ranged
from skygreen.checkpoint.store import RetryPolicy
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import StoreError, TransientStoreError
from skygreen.runtime.checkpointer import Checkpointer

FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


def state(step: int, *, mib: int = 1) -> dict:
    g = torch.Generator().manual_seed(step)
    n = mib * 1024 * 1024 // 4
    return {"model": {"w": torch.randn(n, generator=g), "b": torch.randn(7, generator=g)}, "step": step}


def assert_state_equal(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name])


@pytest.fixture(params=["s3", "gs", "az"])
def proxied_url(request, monkeypatch):
    """A fresh bucket behind a fault proxy; yields (run URL, proxy)."""
    bucket_url, proxy = proxied_bucket(request, monkeypatch, request.param)
    yield f"{bucket_url}/runs/r1", proxy
    proxy.stop()


def test_saves_survive_500s_throttling_and_dropped_connections(proxied_url):
    url, proxy = proxied_url
    with Checkpointer(url, retry=FAST_RETRY) as ck:
        for step, fault in [(1, "500"), (2, "503"), (3, "drop"), (4, "drop_reply")]:
            proxy.inject(fault, times=2)
            ck.save(step, state(step), rank_state={"r": step})
            ck.wait()
    assert proxy.pending() == 0
    proxy.inject("503", times=3, method="GET")
    loaded = Checkpointer(url, retry=FAST_RETRY).load_latest()
    assert loaded.step == 4
    assert_state_equal(loaded.state, state(4))


def test_a_bucket_that_keeps_failing_does_not_stop_training_and_loses_nothing(proxied_url, caplog):
    url, proxy = proxied_url
    ck = Checkpointer(url, retry=FAST_RETRY)
    ck.save(1, state(1))
    ck.wait()
    proxy.inject("503", times=10_000)
    ck.save(2, state(2))
    with pytest.raises(TransientStoreError, match="still failing"):
        ck.wait()
    ck.save(3, state(3))  # training went on; this save also fails in the background
    ck.save(4, state(4))  # its failure is a warning here, not a crash
    assert "checkpoint was not committed" in caplog.text
    with pytest.raises(TransientStoreError):
        ck.wait()
    proxy._faults.clear()
    ck.save(5, state(5))
    ck.close()
    assert committed_steps(open_store(url)) == [1, 5]
    loaded = Checkpointer(url).load_latest()
    assert loaded.step == 5
    assert_state_equal(loaded.state, state(5))


def test_access_revoked_stops_training_with_the_bucket_and_the_fix(proxied_url):
    url, proxy = proxied_url
    ck = Checkpointer(url, retry=FAST_RETRY)
    ck.save(1, state(1))
    ck.wait()
    proxy.inject("403", times=10_000)
    ck.save(2, state(2))
    with pytest.raises(StoreError, match=r"denied[\s\S]*fix:") as info:
        ck.save(3, state(3))
    assert not isinstance(info.value, TransientStoreError)
    proxy._faults.clear()
    assert Checkpointer(url).load_latest().step == 1


def test_gcs_server_killed_mid_upload_then_back(tmp_path, monkeypatch):
    """The emulator persists to disk, dies (SIGKILL) in the middle of a 24 MiB upload and
    comes back on the same port: the torn save is never loaded, the old commit is intact,
    and the next save commits."""
    server = gcs_process(data_dir=tmp_path / "data").start(log_dir=tmp_path)
    proxy = FaultProxy(server.url, flavour="gcs").start()
    try:
        point_gcs_at(monkeypatch, proxy.url)
        bucket = unique_bucket()
        make_gcs_bucket(bucket)
        url = f"gs://{bucket}/runs/r1"
        ck = Checkpointer(url, retry=FAST_RETRY)
        ck.save(1, state(1))
        ck.wait()
        start = proxy.bytes_forwarded
        proxy.on_bytes = lambda sent: server.kill() if sent - start > 8 * 1024 * 1024 else None
        ck.save(2, state(2, mib=24))
        with pytest.raises(TransientStoreError):
            ck.wait()
        proxy.on_bytes = None
        assert server.proc.poll() is not None, "the server really died"
        server.start(log_dir=tmp_path)
        loaded = Checkpointer(url).load_latest()
        assert loaded.step == 1
        assert_state_equal(loaded.state, state(1))
        ck.save(3, state(3))
        ck.close()
        assert Checkpointer(url).load_latest().step == 3
    finally:
        proxy.stop()
        server.stop()


def test_s3_server_killed_mid_upload_is_a_clear_error_and_training_goes_on(tmp_path, monkeypatch, caplog):
    server = moto_process().start(log_dir=tmp_path)
    proxy = FaultProxy(server.url).start()
    try:
        point_s3_at(monkeypatch, proxy.url)
        bucket = unique_bucket()
        make_s3_bucket(bucket)
        ck = Checkpointer(f"s3://{bucket}/runs/r1", retry=FAST_RETRY)
        start = proxy.bytes_forwarded
        proxy.on_bytes = lambda sent: server.kill() if sent - start > 8 * 1024 * 1024 else None
        ck.save(1, state(1, mib=40))
        ck.save(2, state(2))  # returns: the failed save is a warning, not a crash
        with pytest.raises(TransientStoreError, match=f"s3://{bucket}/runs/r1"):
            ck.wait()
        assert "checkpoint was not committed" in caplog.text
    finally:
        proxy.stop()
        server.stop()


ONE_LAYER = RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0, deadline_s=None)
ONE_PART_AT_A_TIME = RangedDownload(threshold_bytes=1, part_bytes=1, concurrency=1, window_parts=2)


def test_a_bucket_answering_503_to_everything_gets_exactly_the_policys_requests(proxied_url, tmp_path):
    """One retry layer: the libraries' own retries are off, so each operation makes exactly
    `max_attempts` requests, counted at the wire, whatever path it takes (one request, a
    multipart or resumable upload, a managed download, a ranged part, a listing). A ranged
    download retries each part alone, and the first part that fails for good stops the rest."""
    url, proxy = proxied_url
    store = open_store(url, retry=ONE_LAYER)
    assert isinstance(store, RangedStore)
    store.put("present", b"here")  # before the faults: the reads below have something to find
    small, large = tmp_path / "small.bin", tmp_path / "large.bin"
    small.write_bytes(b"s" * 1000)
    large.write_bytes(b"l" * (17 * 1024 * 1024))  # S3 multipart (> 16 MiB), GCS resumable (> 8 MiB)
    cold = {"s3": "STANDARD_IA", "gs": "NEARLINE", "az": "COOL"}[url.split(":")[0]]
    operations = {
        "put bytes": lambda: store.put("k", b"data"),
        "put stream": lambda: store.put("k", io.BytesIO(b"data")),
        "put_file": lambda: store.put_file("k", small),
        "put_file large": lambda: store.put_file("k", large),
        "get": lambda: store.get("present"),
        "get_to": lambda: store.get_to("present", io.BytesIO()),
        "get_range": lambda: store.get_range("present", 0, 2),
        "ranged download, one part at a time": lambda: download_ranged(
            store, "present", tmp_path / "ranged.bin", size_bytes=4, plan=ONE_PART_AT_A_TIME
        ),
        "list": lambda: store.list(""),
        "delete": lambda: store.delete("present"),
        "exists": lambda: store.exists("present"),
        "size": lambda: store.size("present"),
        "storage_class": lambda: store.storage_class("present"),
        "set_storage_class": lambda: store.set_storage_class("present", cold),
    }
    proxy.inject("503", times=1_000_000)
    for name, operation in operations.items():
        before = len(proxy.log)
        with pytest.raises(TransientStoreError, match=r"still failing after 3 attempt\(s\)"):
            operation()
        requests = proxy.log[before:]
        assert [outcome for _, _, outcome in requests] == ["503"] * ONE_LAYER.max_attempts, (name, requests)
