"""The local directory store: the Store contract, atomic writes, clear errors."""

from __future__ import annotations

import errno
import io
import os

import pytest

from skygreen.checkpoint.local_store import LocalStore
from skygreen.checkpoint.store import RetryPolicy, Store
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import KeyNotFoundError, StoreError
from skygreen.files import COPY_CHUNK_BYTES


def test_plain_paths_and_file_urls_open_the_same_directory(tmp_path):
    a = open_store(str(tmp_path / "b"))
    b = open_store(f"file://{tmp_path / 'b'}")
    assert isinstance(a, LocalStore) and isinstance(a, Store)
    a.put("ckpt/000000000001/x.pt", b"data")
    assert b.get("ckpt/000000000001/x.pt") == b"data"


def test_contract_put_get_list_delete_exists_size(tmp_path):
    store = open_store(str(tmp_path))
    store.put("a/b/c.bin", b"123")
    store.put("a/d.bin", io.BytesIO(b"4567"))
    store.put("z.bin", b"")
    assert store.list() == ["a/b/c.bin", "a/d.bin", "z.bin"]
    assert store.list("a/") == ["a/b/c.bin", "a/d.bin"]
    assert store.exists("a/d.bin") and not store.exists("a/nope")
    assert store.size("a/d.bin") == 4
    out = io.BytesIO()
    store.get_to("a/b/c.bin", out)
    assert out.getvalue() == b"123"
    store.delete("a/b/c.bin")
    store.delete("a/b/c.bin")  # deleting twice is fine
    assert store.list() == ["a/d.bin", "z.bin"]
    assert not (tmp_path / "a" / "b").exists(), "empty folders are pruned"
    with pytest.raises(KeyNotFoundError, match="a/nope"):
        store.get("a/nope")
    with pytest.raises(KeyNotFoundError):
        store.size("a/nope")


class Exploding(io.RawIOBase):
    """A stream that dies after some bytes, like a process killed mid-write."""

    def __init__(self, good: bytes) -> None:
        self.good = good
        self.sent = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.sent:
            raise OSError(5, "I/O error: device went away")
        self.sent = True
        buffer[: len(self.good)] = self.good
        return len(self.good)


def test_a_write_that_dies_midway_leaves_the_old_object_whole(tmp_path):
    store = LocalStore(tmp_path)
    store.put("m.json", b"old and complete")
    with pytest.raises(StoreError):
        store.put("m.json", io.BufferedReader(Exploding(b"new but ")))
    assert store.get("m.json") == b"old and complete"
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"], "no temporary file is left behind"


FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)
PAYLOAD = bytes(range(256)) * (COPY_CHUNK_BYTES // 256) * 2 + b"tail"  # two full chunks and a bit


class HiccupOnce(io.BytesIO):
    """A seekable stream whose read fails once with EIO after `after` bytes, as an NFS mount
    does when its server hiccups; the next read works."""

    def __init__(self, data: bytes, after: int) -> None:
        super().__init__(data)
        self.after = after
        self.failed = False

    def read(self, size: int | None = -1, /) -> bytes:
        if not self.failed and self.tell() >= self.after:
            self.failed = True
            raise OSError(errno.EIO, "Input/output error")
        return super().read(size)


class WriteHiccupOnce(io.FileIO):
    """A real file whose write fails once with EIO after `after` bytes have gone in."""

    def __init__(self, path, after: int) -> None:
        super().__init__(path, "w+b")
        self.after = after
        self.failed = False

    def write(self, data, /) -> int:
        if not self.failed and self.tell() >= self.after:
            self.failed = True
            raise OSError(errno.EIO, "Input/output error")
        n = super().write(data)
        assert n is not None
        return n


def test_a_stream_put_retried_after_a_hiccup_rewinds_and_writes_the_whole_stream(tmp_path):
    store = LocalStore(tmp_path / "bucket", retry=FAST_RETRY)
    stream = HiccupOnce(b"header" + PAYLOAD, after=COPY_CHUNK_BYTES)
    stream.seek(6)  # written from where it stands, and rewound to there
    store.put("ckpt/000000000001/shared.pt", stream)
    assert stream.failed
    assert store.get("ckpt/000000000001/shared.pt") == PAYLOAD


def test_a_stream_that_cannot_rewind_is_not_retried_into_a_short_object(tmp_path):
    store = LocalStore(tmp_path / "bucket", retry=FAST_RETRY)
    store.put("x", b"old and complete")

    class Unseekable(HiccupOnce):
        def seekable(self) -> bool:
            return False

    with pytest.raises(StoreError, match="cannot be rewound"):
        store.put("x", Unseekable(PAYLOAD, after=COPY_CHUNK_BYTES))
    assert store.get("x") == b"old and complete"


def test_a_download_retried_after_a_hiccup_writes_the_object_once(tmp_path):
    store = LocalStore(tmp_path / "bucket", retry=FAST_RETRY)
    store.put("ckpt/000000000001/shared.pt", PAYLOAD)
    with WriteHiccupOnce(tmp_path / "out", after=COPY_CHUNK_BYTES + 3) as out:
        out.write(b"abc")  # the download goes after what the file already holds
        store.get_to("ckpt/000000000001/shared.pt", out)
        assert out.failed
    assert (tmp_path / "out").read_bytes() == b"abc" + PAYLOAD


@pytest.mark.parametrize("key", ["../escape", "/abs", "a//b", "a/./b", ""])
def test_bad_keys_are_refused(tmp_path, key):
    with pytest.raises(StoreError, match="bad store key"):
        LocalStore(tmp_path).put(key, b"x")


def test_a_file_where_the_bucket_directory_should_be_is_a_clear_error(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        open_store(str(path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_permission_denied_names_the_directory_and_the_fix(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(StoreError, match=r"permission denied.*\n  fix:"):
            LocalStore(locked).put("x", b"1")
    finally:
        locked.chmod(0o700)


def test_local_store_has_no_storage_classes(tmp_path):
    store = LocalStore(tmp_path)
    store.put("x", b"1")
    assert store.storage_class("x") is None
    with pytest.raises(StoreError, match="cold storage does not apply"):
        store.set_storage_class("x", "GLACIER")


def test_put_file_copies_a_local_file_atomically(tmp_path):
    store = open_store(str(tmp_path / "bucket"))
    source = tmp_path / "blob"
    source.write_bytes(b"x" * 3_000_000)
    store.put_file("ckpt/000000000001/shared.pt", source)
    assert store.get("ckpt/000000000001/shared.pt") == source.read_bytes()
    assert source.exists()  # copied, not moved: the caller owns its temporary file
    with pytest.raises(StoreError):
        store.put_file("ckpt/x", tmp_path / "missing")
