"""Bytes a process moves to and from its buckets, counted at the store seam.

The bill of a run (transfer and request dollars) is estimated by the plan; this module measures
it. `counted(store)` wraps any `Store` (S3, GCS, local, or one a test hands in) in a thin
`CountingStore` that adds up the bytes each call sent or received, per bucket, into a `Traffic`
shared by everyone who holds that store: the checkpointer's uploads and restores, its notes,
manifests, leases and retention copies, and the run ledger's own writes. The ledger writer reads
the totals at each write (`skygreen.ledger.io.LedgerWriter`), so each segment records what its
VM moved.

What is counted is the payload: bytes handed to `put`/`put_file`, bytes returned by
`get`/`get_range` and written by `get_to` (a download's failed attempt included: its bytes
crossed too). Request headers, listings and the bytes of retried uploads are not. The newest
checkpoint this process committed is noted here too (`note_checkpoint`), so the ledger can
say the real checkpoint size the plan otherwise estimates.

Core: no outside library; thread-safe, because uploads run on a background thread and ranged
downloads on a pool.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import BinaryIO

from skygreen.checkpoint.bucket_url import parse_url
from skygreen.checkpoint.ranged import RangedStore
from skygreen.checkpoint.store import Store

__all__ = [
    "CountingStore",
    "Traffic",
    "TrafficFigures",
    "bucket_of",
    "committed_bytes",
    "counted",
    "note_checkpoint",
    "traffic_of",
]


def bucket_of(url: str) -> str:
    """The bucket a store URL lies in, as traffic is keyed: `s3://BUCKET` or `gs://BUCKET`
    (its prefix dropped); a local directory is its own bucket, written as given."""
    parsed = parse_url(url, field="store url")
    return url if parsed.scheme == "file" else f"{parsed.scheme}://{parsed.bucket}"


@dataclass(frozen=True, kw_only=True, slots=True)
class TrafficFigures:
    """A snapshot of a `Traffic`: what the ledger segment records."""

    bytes_uploaded: Mapping[str, int] = field(default_factory=dict)
    """Bucket URL -> bytes sent to it."""
    bytes_downloaded: Mapping[str, int] = field(default_factory=dict)
    """Bucket URL -> bytes received from it."""
    checkpoint_bytes: int | None = None
    """Size of the newest checkpoint committed (every blob of it, all ranks'); None before one."""
    checkpoint_step: int | None = None
    """Its step."""


class Traffic:
    """Counters of bytes moved per bucket, safe to add to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._up: dict[str, int] = {}
        self._down: dict[str, int] = {}
        self._checkpoint: tuple[int, int] | None = None

    def uploaded(self, bucket: str, nbytes: int) -> None:
        """Count `nbytes` sent to `bucket`."""
        if nbytes > 0:
            with self._lock:
                self._up[bucket] = self._up.get(bucket, 0) + nbytes

    def downloaded(self, bucket: str, nbytes: int) -> None:
        """Count `nbytes` received from `bucket`."""
        if nbytes > 0:
            with self._lock:
                self._down[bucket] = self._down.get(bucket, 0) + nbytes

    def checkpoint(self, step: int, nbytes: int) -> None:
        """Note a committed checkpoint's step and size; the newest step wins."""
        with self._lock:
            if self._checkpoint is None or step >= self._checkpoint[0]:
                self._checkpoint = (step, nbytes)

    def figures(self) -> TrafficFigures:
        """The totals so far, copied."""
        with self._lock:
            step, size = self._checkpoint if self._checkpoint is not None else (None, None)
            return TrafficFigures(
                bytes_uploaded=dict(self._up),
                bytes_downloaded=dict(self._down),
                checkpoint_bytes=size,
                checkpoint_step=step,
            )


def _remaining_bytes(stream: BinaryIO) -> int | None:
    """Bytes from a stream's position to its end, or None where it cannot seek."""
    try:
        if not stream.seekable():
            return None
        here = stream.tell()
        end = stream.seek(0, os.SEEK_END)
        stream.seek(here)
        return max(0, end - here)
    except (AttributeError, OSError, ValueError):
        return None


class _CountingReader:
    """A non-seekable upload stream, read through so what was sent is counted."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.count += len(data)
        return data

    def tell(self) -> int:
        """Bytes read so far: a one-way stream's position from where the upload began."""
        return self.count

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return True


class _CountingWriter:
    """A download destination, written through so every byte received is counted (a retried
    part too: it crossed the network twice); seeking and the rest go to the destination, so the
    cloud library writes its parts where it would have."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.count = 0

    def write(self, data: bytes) -> int:
        written = self.inner.write(data)
        size = len(data) if written is None else written
        self.count += size
        return size

    def seekable(self) -> bool:
        try:
            return bool(self.inner.seekable())
        except (AttributeError, OSError, ValueError):
            return False

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()

    def truncate(self, size: int | None = None) -> int:
        return self.inner.truncate(size)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self.inner.flush()


class CountingStore:
    """A `Store` that counts the payload bytes of each call into `traffic`, then answers as
    the store it wraps does (errors included)."""

    def __init__(self, inner: Store, traffic: Traffic) -> None:
        self.inner = inner
        self.traffic = traffic
        self.url = inner.url
        self.bucket = bucket_of(inner.url)

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """`Store.put`, counting the bytes sent."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.inner.put(key, data)
            self.traffic.uploaded(self.bucket, len(data))
            return
        size = _remaining_bytes(data)
        if size is None:
            reader = _CountingReader(data)
            self.inner.put(key, reader)  # type: ignore[arg-type]
            self.traffic.uploaded(self.bucket, reader.count)
            return
        self.inner.put(key, data)
        self.traffic.uploaded(self.bucket, size)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """`Store.put_file`, counting the file's size."""
        self.inner.put_file(key, path)
        self.traffic.uploaded(self.bucket, os.path.getsize(path))

    def get(self, key: str) -> bytes:
        """`Store.get`, counting the bytes received."""
        data = self.inner.get(key)
        self.traffic.downloaded(self.bucket, len(data))
        return data

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """`Store.get_to`, counting the bytes written into `fileobj` (what a failed attempt
        wrote before its retry included)."""
        writer = _CountingWriter(fileobj)
        try:
            self.inner.get_to(key, writer)  # type: ignore[arg-type]
        finally:
            self.traffic.downloaded(self.bucket, writer.count)

    def list(self, prefix: str = "") -> list[str]:
        """`Store.list` (no payload)."""
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        """`Store.delete` (no payload)."""
        self.inner.delete(key)

    def exists(self, key: str) -> bool:
        """`Store.exists` (no payload)."""
        return self.inner.exists(key)

    def size(self, key: str) -> int:
        """`Store.size` (no payload)."""
        return self.inner.size(key)

    def storage_class(self, key: str) -> str | None:
        """`Store.storage_class` (no payload)."""
        return self.inner.storage_class(key)

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """`Store.set_storage_class`: a copy inside the bucket, so no payload crosses to us."""
        self.inner.set_storage_class(key, storage_class)

    def __repr__(self) -> str:
        return f"CountingStore({self.inner!r})"


class CountingRangedStore(CountingStore):
    """A `CountingStore` over a store that reads byte ranges (`RangedStore`): it reads them too,
    so ranged parallel downloads stay available through the wrapper."""

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """`RangedStore.get_range`, counting the bytes received."""
        assert isinstance(self.inner, RangedStore)
        data = self.inner.get_range(key, start, stop)
        self.traffic.downloaded(self.bucket, len(data))
        return data


class CountingSetStore(CountingRangedStore):
    """A bucket set (`skygreen.checkpoint.set_store`) whose buckets each count their own bytes:
    the set itself passes every call through, so no byte is counted twice."""

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """`Store.put`, counted by the bucket written."""
        self.inner.put(key, data)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """`Store.put_file`, counted by the bucket written."""
        self.inner.put_file(key, path)

    def get(self, key: str) -> bytes:
        """`Store.get`, counted by the bucket read."""
        return self.inner.get(key)

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """`Store.get_to`, counted by the bucket read."""
        self.inner.get_to(key, fileobj)

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """`RangedStore.get_range`, counted by the bucket read."""
        data: bytes = self.inner.get_range(key, start, stop)  # type: ignore[attr-defined]
        return data


def counted(store: Store, traffic: Traffic | None = None) -> CountingStore:
    """`store` with its traffic counted into `traffic` (a new `Traffic` when None); a store that
    is counted already is returned as it is."""
    if isinstance(store, CountingStore):
        return store
    traffic = traffic if traffic is not None else Traffic()
    members = getattr(store, "with_stores", None)
    if members is not None:  # a bucket set: each bucket counts its own bytes under its own name
        return CountingSetStore(members(lambda s: counted(s, traffic)), traffic)
    kind = CountingRangedStore if isinstance(store, RangedStore) else CountingStore
    return kind(store, traffic if traffic is not None else Traffic())


def traffic_of(store: Store) -> Traffic | None:
    """The counters of a counted store; None for a bare one."""
    return store.traffic if isinstance(store, CountingStore) else None


def note_checkpoint(store: Store, step: int, nbytes: int) -> None:
    """After a commit through `store`: note the checkpoint's step and size where it is counted."""
    traffic = traffic_of(store)
    if traffic is not None:
        traffic.checkpoint(step, nbytes)


def committed_bytes(store: Store) -> int | None:
    """The size of the newest checkpoint committed through `store` (every file of it), for the
    auto interval to price; None for a bare store, before the first commit and on ranks that
    commit nothing."""
    traffic = traffic_of(store)
    return traffic.figures().checkpoint_bytes if traffic is not None else None
