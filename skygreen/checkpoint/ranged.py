"""Verified blob downloads: big blobs as ranged parallel GETs, hashed in order as they land.

One GET stream rarely fills a VM's link (S3 and GCS serve each connection at a fraction of it),
so a blob of at least `RangedDownload.threshold_bytes` is fetched as `part_bytes` ranges by
`concurrency` threads into a preallocated file. Each part goes through the store's `get_range`,
which the store retries alone by its `RetryPolicy` (the one retry layer), so a part that fails
transiently costs one part, not the blob.

The sha256 is computed as the parts land: a part is written to its place in the file and handed
to `InOrderDigest`, which feeds the hash the contiguous prefix of parts that have arrived. The
digest is done when the last part lands, with no second read of the file; the parts waiting
for an earlier one are the only ones held in memory, bounded by `window_parts`.

A blob whose bytes do not match the manifest is downloaded once more (corruption in transit
does not repeat; corruption at rest does), then refused with `CheckpointError`, and the file is
deleted: a caller never sees unverified bytes at the path. Smaller blobs, and stores without
ranged reads, take one stream (`Store.get_to`) and a hash of the file.

Core: no outside library; the stores do the I/O.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from skygreen.checkpoint.manifest import BlobInfo, file_info
from skygreen.checkpoint.store import Store
from skygreen.errors import CheckpointError, StoreError

log = logging.getLogger("skygreen.store")

MIB = 1024 * 1024


@runtime_checkable
class RangedStore(Protocol):
    """A store that reads a byte range of an object in one request, retried alone."""

    url: str

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes `start` up to (not including) `stop` of the object; exactly `stop - start` of
        them or an error (a short answer is a `TransientStoreError`)."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class RangedDownload:
    """When and how a blob is fetched in ranges.

    64 MiB keeps optimizer-free small models and rank states on one stream, where the extra
    requests would cost more than they win; 16 MiB parts by 8 threads fill a 10-25 Gbit/s link
    on S3 and GCS (each stream gives roughly 80-200 MB/s).
    """

    threshold_bytes: int = 64 * MIB
    part_bytes: int = 16 * MIB
    concurrency: int = 8
    window_parts: int = 12
    """Parts fetched or waiting to be hashed at once: the memory bound (`window_parts * part_bytes`)."""
    mismatch_attempts: int = 2
    """Whole downloads of a blob before a sha256 mismatch is final."""

    def __post_init__(self) -> None:
        for field in ("threshold_bytes", "part_bytes", "concurrency", "window_parts", "mismatch_attempts"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RangedDownload.{field} must be an integer >= 1, got {value!r}")
        if self.window_parts < self.concurrency:
            raise ValueError(
                f"RangedDownload.window_parts ({self.window_parts}) must be >= concurrency ({self.concurrency})"
            )


DEFAULT_RANGED = RangedDownload()


def part_ranges(size_bytes: int, part_bytes: int) -> list[tuple[int, int]]:
    """(start, stop) of each part of a `size_bytes` object, in order; the last may be shorter."""
    if size_bytes < 0 or part_bytes < 1:
        raise ValueError(f"bad sizes: size_bytes={size_bytes}, part_bytes={part_bytes}")
    return [(start, min(start + part_bytes, size_bytes)) for start in range(0, size_bytes, part_bytes)]


class InOrderDigest:
    """A sha256 fed by parts that arrive in any order: each part is hashed as soon as every part
    before it has been, by whichever thread completed the run, outside the lock (hashlib
    releases the GIL, so other parts keep downloading meanwhile)."""

    def __init__(self, part_count: int, *, on_hashed: Callable[[], None] | None = None) -> None:
        self.part_count = part_count
        self.hashed_parts = 0
        self.size_bytes = 0
        self._digest = hashlib.sha256()
        self._waiting: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._hashing = False
        self._on_hashed = on_hashed

    def add(self, index: int, data: bytes) -> None:
        """Hand over part `index`; it is hashed now or when the parts before it have been."""
        with self._lock:
            if index < self.hashed_parts or index in self._waiting or not 0 <= index < self.part_count:
                raise ValueError(f"part {index} given twice or out of range (0..{self.part_count - 1})")
            self._waiting[index] = data
            if self._hashing:
                return
            self._hashing = True
        while True:
            with self._lock:
                chunk = self._waiting.pop(self.hashed_parts, None)
                if chunk is None:
                    self._hashing = False
                    return
            self._digest.update(chunk)
            with self._lock:
                self.hashed_parts += 1
                self.size_bytes += len(chunk)
            if self._on_hashed is not None:
                self._on_hashed()

    def result(self) -> BlobInfo:
        """The blob's size and sha256 once every part has been hashed."""
        if self.hashed_parts != self.part_count:
            raise RuntimeError(f"only {self.hashed_parts} of {self.part_count} parts hashed")
        return BlobInfo(size=self.size_bytes, sha256=self._digest.hexdigest())


def download_ranged(store: RangedStore, key: str, path: Path, *, size_bytes: int, plan: RangedDownload) -> BlobInfo:
    """Fetch `key` into `path` (created, preallocated to `size_bytes`) as ranged parts in
    parallel; the size and sha256 of what landed, hashed as it landed.

    The first part that fails for good (after the store's retries) stops the rest and its
    error propagates; the file is then deleted.

    Args:
        store: Reads each part, retrying it alone.
        key: The object's key in the store.
        path: Where the bytes go; replaced if it exists.
        size_bytes: The object's length (the manifest's).
        plan: Part size, threads and memory window.

    Returns:
        The size and sha256 of the bytes written.

    Raises:
        StoreError: A part failed after the store's retries.
    """
    parts = part_ranges(size_bytes, plan.part_bytes)
    window = threading.Semaphore(plan.window_parts)
    failed = threading.Event()
    digest = InOrderDigest(len(parts), on_hashed=window.release)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _preallocate(fd, size_bytes)

        def fetch(index: int, start: int, stop: int) -> None:
            if failed.is_set():
                return  # queued before another part failed for good: no request
            try:
                data = store.get_range(key, start, stop)
                if len(data) != stop - start:
                    raise StoreError(f"{store.url}: part {start}-{stop - 1} of {key} came back with {len(data)} bytes")
                _pwrite_all(fd, data, start)
                digest.add(index, data)
            except BaseException:
                failed.set()
                raise

        futures: list[Future[None]] = []
        with ThreadPoolExecutor(max_workers=plan.concurrency, thread_name_prefix="skygreen-ranged") as pool:
            for index, (start, stop) in enumerate(parts):
                while not window.acquire(timeout=0.05):
                    if failed.is_set():
                        break
                if failed.is_set():
                    break
                futures.append(pool.submit(fetch, index, start, stop))
        for future in futures:
            future.result()  # the first failure, in part order
        return digest.result()
    except BaseException:
        os.close(fd)
        fd = -1
        path.unlink(missing_ok=True)
        raise
    finally:
        if fd >= 0:
            os.close(fd)


def fetch_verified(
    store: Store, key: str, path: Path, want: BlobInfo, *, plan: RangedDownload = DEFAULT_RANGED
) -> None:
    """Download `key` to `path` and prove it is `want`: ranged and hashed as it lands when the
    blob is big and the store reads ranges, else one stream and a hash of the file.

    A mismatch is downloaded once more (`plan.mismatch_attempts` in all), then refused.

    Raises:
        CheckpointError: The bytes do not match `want` (the file is deleted).
        KeyNotFoundError: No object at `key`.
        StoreError: The store failed after its retries.
    """
    got = want
    for attempt in range(1, plan.mismatch_attempts + 1):
        got = _download_once(store, key, path, want.size, plan)
        if got == want:
            return
        path.unlink(missing_ok=True)
        log.warning(
            "%s from %s does not match the manifest (attempt %d of %d, sha256 %s... vs %s...)",
            key, store.url, attempt, plan.mismatch_attempts, got.sha256[:12], want.sha256[:12],
        )  # fmt: skip
    name = key.rsplit("/", 1)[-1]
    raise CheckpointError(
        f"{name} does not match the manifest (size {got.size} vs {want.size}, "
        f"sha256 {got.sha256[:12]}... vs {want.sha256[:12]}...): corrupt or partial"
    )


def uses_ranges(store: Store, size_bytes: int, plan: RangedDownload = DEFAULT_RANGED) -> bool:
    """Whether a blob of `size_bytes` in `store` is fetched in ranged parts."""
    return size_bytes >= plan.threshold_bytes and isinstance(store, RangedStore)


def _download_once(store: Store, key: str, path: Path, size_bytes: int, plan: RangedDownload) -> BlobInfo:
    if uses_ranges(store, size_bytes, plan):
        assert isinstance(store, RangedStore)
        return download_ranged(store, key, path, size_bytes=size_bytes, plan=plan)
    with open(path, "wb") as out:
        store.get_to(key, out)
    return file_info(path)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of `data` at `offset` (a write may take fewer bytes than it was given)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _preallocate(fd: int, size_bytes: int) -> None:
    """Reserve the blob's space up front (a full disk fails now, not at the last part)."""
    if size_bytes == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except (AttributeError, OSError) as e:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise StoreError(f"no space for a {size_bytes}-byte blob: {e}\n  fix: free disk space") from e
        os.ftruncate(fd, size_bytes)
