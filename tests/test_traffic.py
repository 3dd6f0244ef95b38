"""Bytes counted at the store seam (`skygreen.checkpoint.traffic`), for every store kind (a local
directory, S3 on moto_server, GCS on the emulator), and recorded in the ledger segment."""

from __future__ import annotations

import io
import json
import threading

import pytest

from skygreen.checkpoint.manifest import file_info
from skygreen.checkpoint.ranged import RangedDownload, RangedStore, fetch_verified
from skygreen.checkpoint.store_factory import open_store
from skygreen.checkpoint.traffic import Traffic, bucket_of, counted, note_checkpoint, traffic_of
from skygreen.ledger.io import LedgerWriter, read_ledger
from skygreen.ledger.records import Place, Segment


class OneWay(io.RawIOBase):
    """A stream that can neither seek nor tell, as a pipe: reads from `data`, or collects writes."""

    def __init__(self, data: bytes = b"") -> None:
        self.source = io.BytesIO(data)
        self.written = bytearray()

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        chunk = self.source.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def write(self, data) -> int:
        self.written += bytes(data)
        return len(data)


@pytest.fixture(params=["local", "s3", "gs"])
def store_url(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "bucket" / "run1")
    bucket = request.getfixturevalue("s3_bucket" if request.param == "s3" else "gcs_bucket")
    return f"{request.param}://{bucket}/runs/run1"


def test_every_call_counts_its_payload_bytes_per_bucket(store_url, tmp_path):
    store = counted(open_store(store_url))
    bucket = bucket_of(store_url)
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"b" * 3000)

    store.put("a", b"x" * 100)  # bytes
    store.put("b", io.BytesIO(b"skip" + b"y" * 200))  # a stream that seeks
    store.put("d", OneWay(b"z" * 50))  # type: ignore[arg-type]  # a stream that cannot seek
    store.put_file("e", blob)
    assert store.traffic.figures().bytes_uploaded == {bucket: 100 + 204 + 50 + 3000}
    assert store.traffic.figures().bytes_downloaded == {}

    assert store.get("a") == b"x" * 100
    out = io.BytesIO()
    store.get_to("e", out)
    assert out.getvalue() == b"b" * 3000
    pipe = OneWay()
    store.get_to("b", pipe)  # type: ignore[arg-type]
    assert bytes(pipe.written) == b"skip" + b"y" * 200
    assert store.get_range("e", 10, 20) == b"b" * 10  # type: ignore[attr-defined]
    store.list("")
    store.exists("a")
    store.size("a")
    store.delete("a")
    assert store.traffic.figures().bytes_downloaded == {bucket: 100 + 3000 + 204 + 10}
    assert store.traffic.figures().bytes_uploaded == {bucket: 3354}  # listing and deleting move no payload


def test_the_wrapper_keeps_ranged_parallel_downloads_and_counts_them(tmp_path):
    """A counted store is still a `RangedStore`, so big blobs keep their parallel ranged reads."""
    store = counted(open_store(str(tmp_path / "bucket")))
    assert isinstance(store, RangedStore)
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    store.put_file("big", source)
    plan = RangedDownload(threshold_bytes=1, part_bytes=64 * 1024, concurrency=4, start_streams=2)
    fetch_verified(store, "big", tmp_path / "got.bin", file_info(source), plan=plan)
    assert (tmp_path / "got.bin").read_bytes() == source.read_bytes()
    assert store.traffic.figures().bytes_downloaded == {str(tmp_path / "bucket"): 1024 * 1024}


def test_counters_add_up_across_threads_and_keep_the_newest_checkpoint():
    traffic = Traffic()

    def add() -> None:
        for _ in range(1000):
            traffic.uploaded("s3://b", 3)
            traffic.downloaded("gs://c", 1)

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    traffic.checkpoint(20, 500)
    traffic.checkpoint(10, 900)  # an older commit noted late changes nothing
    figures = traffic.figures()
    assert figures.bytes_uploaded == {"s3://b": 12000} and figures.bytes_downloaded == {"gs://c": 4000}
    assert (figures.checkpoint_step, figures.checkpoint_bytes) == (20, 500)


def test_bucket_keys_and_wrapping_once(tmp_path):
    assert bucket_of("s3://team/runs/r1") == "s3://team"
    assert bucket_of("gs://team/runs/r1") == "gs://team"
    assert bucket_of(str(tmp_path)) == str(tmp_path)
    bare = open_store(str(tmp_path))
    assert traffic_of(bare) is None
    note_checkpoint(bare, 1, 10)  # a bare store counts nothing, and that is no error
    store = counted(bare)
    assert counted(store) is store


def test_the_ledger_segment_records_the_bytes_and_reads_old_ledgers(tmp_path):
    store = counted(open_store(str(tmp_path / "run")))
    writer = LedgerWriter(store, run_id="r", place=Place(cloud="local"), started_at=1000.0, clock=lambda: 1010.0)
    writer.begin(step=0, samples=0, samples_per_epoch=None, energy_j_total=None)
    store.put("ckpt/blob", b"q" * 4000)
    note_checkpoint(store, 5, 4000)
    writer.update(step=5, samples=40, train_s=2.0, energy_j_total=None)
    (segment,) = read_ledger(store)
    bucket = str(tmp_path / "run")
    assert segment.bytes_uploaded[bucket] > 4000  # the blob plus the ledger's own first write
    assert segment.bytes_downloaded == {} and segment.checkpoint_bytes == 4000  # nothing read before its writes
    assert segment.bytes_moved == sum(segment.bytes_uploaded.values()) + sum(segment.bytes_downloaded.values())

    old = segment.to_json()
    for name in ("bytes_uploaded", "bytes_downloaded", "checkpoint_bytes"):
        old.pop(name)
    before = Segment.from_json(json.loads(json.dumps(old)))
    assert before.bytes_uploaded == {} and before.bytes_downloaded == {} and before.checkpoint_bytes is None
    assert before.bytes_moved == 0
