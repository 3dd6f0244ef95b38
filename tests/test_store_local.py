"""The local directory store: the Store contract, atomic writes, clear errors."""

from __future__ import annotations

import io
import os

import pytest

from skygreen.checkpoint.local_store import LocalStore
from skygreen.checkpoint.store import Store
from skygreen.checkpoint.stores import open_store
from skygreen.errors import KeyNotFoundError, StoreError


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
