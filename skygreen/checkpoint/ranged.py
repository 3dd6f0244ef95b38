"""Verified blob downloads: big blobs as ranged parallel GETs, hashed in order as they land.

One GET stream rarely fills a VM's link (S3 and GCS serve each connection at a fraction of it),
so a blob of at least `RangedDownload.threshold_bytes` is fetched as `part_bytes` ranges by
parallel streams into a preallocated file. How many streams pays depends on the link and the
host: on a cloud VM each added stream adds its share of the link, while on a small host (or a
loopback server) the streams compete for the cores and more of them only add overhead. So the
number is measured, not fixed: `StreamTuner` starts with `start_streams`, doubles them while a
doubling raises the throughput, up to `concurrency`, and keeps the best level it measured. Each
part goes through the store's `get_range`, which the store retries alone by its `RetryPolicy`
(the one retry layer), so a part that fails transiently costs one part, not the blob.

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
import time
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
    requests would cost more than they win; 16 MiB parts by up to 8 streams fill a 10-25 Gbit/s
    link on S3 and GCS (each stream gives roughly 80-200 MB/s), and the tuner stops short of 8
    where fewer go faster (a 2-core host reading a loopback server).
    """

    threshold_bytes: int = 64 * MIB
    part_bytes: int = 16 * MIB
    concurrency: int = 8
    """The most streams at once (threads); the tuner finds how many of them pay."""
    start_streams: int = 4
    """Streams the tuner starts with; equal to `concurrency`, the number is fixed. Four, not
    one or two: on a cloud link every level below the best costs its parts at a fraction of the
    link's rate, and one doubling from four finds whether eight pay."""
    window_parts: int = 12
    """Parts fetched or waiting to be hashed at once: the memory bound (`window_parts * part_bytes`)."""
    mismatch_attempts: int = 2
    """Whole downloads of a blob before a sha256 mismatch is final."""

    def __post_init__(self) -> None:
        for field in (
            "threshold_bytes",
            "part_bytes",
            "concurrency",
            "start_streams",
            "window_parts",
            "mismatch_attempts",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RangedDownload.{field} must be an integer >= 1, got {value!r}")
        if self.window_parts < self.concurrency:
            raise ValueError(
                f"RangedDownload.window_parts ({self.window_parts}) must be >= concurrency ({self.concurrency})"
            )


DEFAULT_RANGED = RangedDownload()


class StreamTuner:
    """How many ranged GETs to keep in flight: as many as raise the throughput, measured.

    It starts at `start` streams and measures each level over `parts_per_stream` parts per stream
    started and fetched at that level. A level at least `gain` times as fast as the best before it
    doubles the streams (up to `most`); one that is not settles the download on the best level
    measured. Pure: the caller reports each part done, with the level it was started at, when it
    started and the clock, and reads `streams`.

    A level's rate is its streams times the bytes per second of its own parts, each timed from
    its start to its end (Little's law: `streams` parts are in flight all along). Bytes over the
    wall clock since the level began would count the first parts of a doubled level while the
    parts of the level before it still held their streams: on a link that gives each stream its
    share, twice the streams then measured about 1.3 times the rate, close enough to `gain` for
    a busy host to stop the tuner short.

    Args:
        start: the streams of the first level (at most `most`).
        most: the most streams ever kept in flight.
        gain: how much faster a doubled level must be to be kept.
        parts_per_stream: parts per stream a level is measured over.
    """

    def __init__(self, *, start: int, most: int, gain: float = 1.1, parts_per_stream: int = 2) -> None:
        self.most = most
        self.streams = min(start, most)
        self.gain = gain
        self.parts_per_stream = parts_per_stream
        self.settled = self.streams >= most
        self.levels: list[tuple[int, float]] = []
        """(streams, bytes per second) of each level measured, in order."""
        self._best: tuple[float, int] | None = None
        self._level_bytes = 0
        self._level_part_s = 0.0
        self._level_parts = 0

    def part_started(self) -> int:
        """The level a part starting now is fetched at (hand it back to `part_done`)."""
        return self.streams

    def part_done(self, level: int, nbytes: int, *, started_s: float, now_s: float) -> None:
        """Count a part fetched at `level` from `started_s` to `now_s`; a level fully measured
        moves the tuner on."""
        if self.settled or level != self.streams:
            return
        self._level_bytes += nbytes
        self._level_part_s += now_s - started_s
        self._level_parts += 1
        if self._level_parts < self.parts_per_stream * self.streams:
            return
        rate = self.streams * self._level_bytes / max(self._level_part_s, 1e-9)
        self.levels.append((self.streams, rate))
        if self._best is None or rate >= self._best[0] * self.gain:
            self._best = (rate, self.streams)
            if self.streams < self.most:
                self.streams = min(2 * self.streams, self.most)
                self._level_bytes, self._level_part_s, self._level_parts = 0, 0.0, 0
                return
        self.streams = self._best[1]
        self.settled = True


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


def download_ranged(
    store: RangedStore,
    key: str,
    path: Path,
    *,
    size_bytes: int,
    plan: RangedDownload,
    tuner: StreamTuner | None = None,
) -> BlobInfo:
    """Fetch `key` into `path` (created, preallocated to `size_bytes`) as ranged parts in
    parallel; the size and sha256 of what landed, hashed as it landed.

    As many parts are in flight as the tuner's streams (at most `plan.concurrency`), and no more
    than `plan.window_parts` fetched or waiting to be hashed.

    The first part that fails for good (after the store's retries) stops the rest and its
    error propagates; the file is then deleted.

    Args:
        store: Reads each part, retrying it alone.
        key: The object's key in the store.
        path: Where the bytes go; replaced if it exists.
        size_bytes: The object's length (the manifest's).
        plan: Part size, threads and memory window.
        tuner: Sets the streams as the parts land (default: one from `plan`).

    Returns:
        The size and sha256 of the bytes written.

    Raises:
        StoreError: A part failed after the store's retries.
    """
    parts = part_ranges(size_bytes, plan.part_bytes)
    window = threading.Semaphore(plan.window_parts)
    failed = threading.Event()
    digest = InOrderDigest(len(parts), on_hashed=window.release)
    tuner = tuner or StreamTuner(start=plan.start_streams, most=plan.concurrency)
    streams = threading.Condition()
    in_flight = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _preallocate(fd, size_bytes)

        def fetch(index: int, start: int, stop: int, level: int, started_s: float) -> None:
            nonlocal in_flight
            try:
                if failed.is_set():
                    return  # queued before another part failed for good: no request
                data = store.get_range(key, start, stop)
                if len(data) != stop - start:
                    raise StoreError(f"{store.url}: part {start}-{stop - 1} of {key} came back with {len(data)} bytes")
                _pwrite_all(fd, data, start)
                with streams:
                    tuner.part_done(level, len(data), started_s=started_s, now_s=time.monotonic())
                digest.add(index, data)
            except BaseException:
                failed.set()
                raise
            finally:
                with streams:
                    in_flight -= 1
                    streams.notify_all()

        futures: list[Future[None]] = []
        with ThreadPoolExecutor(max_workers=plan.concurrency, thread_name_prefix="skygreen-ranged") as pool:
            for index, (start, stop) in enumerate(parts):
                while not window.acquire(timeout=0.05):
                    if failed.is_set():
                        break
                if failed.is_set():
                    break
                with streams:
                    while in_flight >= tuner.streams and not failed.is_set():
                        streams.wait(timeout=0.05)
                    in_flight += 1
                    level = tuner.part_started()
                futures.append(pool.submit(fetch, index, start, stop, level, time.monotonic()))
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
