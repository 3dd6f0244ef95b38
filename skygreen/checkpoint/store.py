"""Checkpoint stores: one small interface over S3, GCS and local directories.

A store is rooted at a URL (`s3://bucket/prefix`, `gs://bucket/prefix`, `file:///dir` or a
plain path) and speaks in string keys relative to that root, so the checkpoint protocol in
`skygreen.checkpoint` never sees which cloud it runs on.

This module is core: it imports no outside library and no adapter. Bucket URLs are parsed in
`skygreen.checkpoint.bucket_url` (re-exported here), which the task file reader uses too.
`skygreen.checkpoint.store_factory.open_store` picks the adapter by URL scheme.

Retries live here, once, as a pure policy (`RetryPolicy`, `backoff_delay_s`) and one loop
(`call_with_retries`) that every adapter wraps around its network calls. Adapters turn their
library's errors into `TransientStoreError` (worth retrying: 5xx, throttling, connection
resets, timeouts) or `StoreError` (permanent: no such bucket, access denied; fail fast with
the bucket and the fix) through a table, so the loop only has to look at the class.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol, TypeVar, runtime_checkable

from skygreen.checkpoint.bucket_url import StoreUrl, join_url, parse_url
from skygreen.errors import StoreError, TransientStoreError

log = logging.getLogger("skygreen.store")
log.addHandler(logging.NullHandler())  # a retry line shows only where the caller set up logging


def show_retries() -> None:
    """Print each retry of a bucket call on stderr (`SKYGREEN_DEBUG=1` on the command line), as
    Python prints a warning where no logging is set up; the runtime's own handler is unaffected."""
    if not any(type(h) is logging.StreamHandler for h in log.handlers):  # once per process
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        log.addHandler(handler)


__all__ = [
    "DEFAULT_RETRY",
    "OpenStore",
    "RetryPolicy",
    "Store",
    "StoreUrl",
    "backoff_delay_s",
    "call_with_retries",
    "current_retry_policy",
    "cut_back",
    "join_url",
    "parse_url",
    "retry_policy",
    "rewind",
    "show_retries",
]

T = TypeVar("T")


@runtime_checkable
class Store(Protocol):
    """String keys relative to the store's root URL; values are bytes.

    `put` accepts a readable binary file object so large blobs stream from disk with bounded
    memory; a seekable one can be re-sent when a transient error interrupts the upload.
    `get` and `get_to` raise `KeyNotFoundError` for a missing key.
    """

    url: str

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Write `data` under `key`, replacing any object there; a stream is read from where it
        stands to its end. A reader must see the old object or the whole new one, never part."""
        ...

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload a local file. The cloud libraries upload from a path faster than from a
        stream (parts are read from disk by the worker threads, in parallel, with no copy
        through the caller's buffer), so the checkpointer, which writes each blob to a
        temporary file anyway, hands over the path."""
        ...

    def get(self, key: str) -> bytes:
        """The whole object, in memory; `KeyNotFoundError` where there is none."""
        ...

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """Write the object into `fileobj` from where it stands, without holding it all in memory;
        `KeyNotFoundError` where there is none."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with `prefix` (a plain string prefix, not a folder), sorted;
        an empty list where there are none."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; a key that is already gone is not an error."""
        ...

    def exists(self, key: str) -> bool:
        """Whether an object is stored under exactly this key."""
        ...

    def size(self, key: str) -> int:
        """The object's length in bytes; `KeyNotFoundError` where there is none."""
        ...

    def storage_class(self, key: str) -> str | None:
        """The cloud's storage class of the object, in the cloud's own spelling ("STANDARD",
        "GLACIER", "ARCHIVE"); None where the store has no storage classes."""
        ...

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Move the object to another storage class in place, keeping its key and bytes; a store
        without storage classes raises `StoreError`."""
        ...


OpenStore = Callable[[str], Store]
"""Opens the store for a URL: `skygreen.checkpoint.store_factory.open_store`, handed in by a composition root."""


# ---------------------------------------------------------------------------------------
# Retries


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter for transient store errors.

    Full jitter (a uniform draw in [0, cap]) spreads the retries of many ranks hitting the
    same throttled bucket, which a fixed exponential schedule would synchronise.
    """

    max_attempts: int = 8
    base_delay_s: float = 0.25
    max_delay_s: float = 20.0
    deadline_s: float | None = 300.0
    """Give up when the next wait would pass this many seconds since the first attempt."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        if not (self.base_delay_s >= 0 and math.isfinite(self.base_delay_s)):
            raise ValueError(f"RetryPolicy.base_delay_s must be >= 0, got {self.base_delay_s!r}")
        if not self.max_delay_s >= self.base_delay_s:
            raise ValueError(f"RetryPolicy.max_delay_s must be >= base_delay_s, got {self.max_delay_s!r}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"RetryPolicy.deadline_s must be > 0 or None, got {self.deadline_s!r}")


DEFAULT_RETRY = RetryPolicy()

_retry_for_this_context: contextvars.ContextVar[RetryPolicy] = contextvars.ContextVar(
    "skygreen_store_retry", default=DEFAULT_RETRY
)


@contextlib.contextmanager
def retry_policy(policy: RetryPolicy) -> Iterator[None]:
    """Stores opened inside this block (in this thread) retry by `policy` unless told
    otherwise: the laptop's commands give up sooner than a training run would."""
    token = _retry_for_this_context.set(policy)
    try:
        yield
    finally:
        _retry_for_this_context.reset(token)


def current_retry_policy() -> RetryPolicy:
    """The policy `retry_policy` set for this context, else `DEFAULT_RETRY`."""
    return _retry_for_this_context.get()


def backoff_delay_s(policy: RetryPolicy, retry_index: int, uniform01: float) -> float:
    """The wait before retry number `retry_index` (0 for the first retry).

    `uniform01` is a draw from [0, 1): passing it in keeps this function pure and testable.
    The cap doubles each retry from `base_delay_s` up to `max_delay_s`.
    """
    cap_s = min(policy.max_delay_s, policy.base_delay_s * (2.0 ** min(retry_index, 60)))
    return cap_s * min(max(uniform01, 0.0), 1.0)


def call_with_retries(
    operation: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy = DEFAULT_RETRY,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    uniform01: Callable[[], float] = random.random,
    on_retry: Callable[[], None] | None = None,
) -> T:
    """Run `operation`, retrying `TransientStoreError` by `policy`; anything else propagates.

    `on_retry` runs before each new attempt (adapters rewind a half-sent stream there). The
    final error says how many attempts were made, keeping the last cause attached.
    """
    started = monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return operation()
        except TransientStoreError as e:
            delay_s = backoff_delay_s(policy, attempt - 1, uniform01())
            elapsed_s = monotonic() - started
            out_of_time = policy.deadline_s is not None and elapsed_s + delay_s > policy.deadline_s
            if attempt >= policy.max_attempts or out_of_time:
                raise TransientStoreError(
                    f"{what}: still failing after {attempt} attempt(s) over {elapsed_s:.1f} s: {e}"
                ) from e
            log.warning("%s: %s; retry %d in %.2f s", what, e, attempt, delay_s)
            sleep(delay_s)
            if on_retry is not None:
                on_retry()


def rewind(data: bytes | BinaryIO) -> Callable[[], None]:
    """A callback that puts a stream back where it started, for re-sending after an error.

    A non-seekable stream cannot be re-sent: the callback then raises a permanent
    `StoreError`, so a broken upload is never retried with half its bytes.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        return lambda: None
    try:
        start = data.tell() if data.seekable() else None
    except (AttributeError, OSError, ValueError):
        start = None

    def _rewind() -> None:
        if start is None:
            raise StoreError("upload interrupted and its stream cannot be rewound; pass a seekable file")
        data.seek(start)

    return _rewind


def cut_back(fileobj: BinaryIO) -> Callable[[], None]:
    """A callback that cuts a download's destination back to where it stood (seek, truncate), so
    a retried download writes no part twice.

    A destination that cannot seek makes the callback raise a permanent `StoreError` instead.
    """
    try:
        start = fileobj.tell() if fileobj.seekable() else None
    except (AttributeError, OSError, ValueError):
        start = None

    def _cut_back() -> None:
        if start is None:
            raise StoreError("download interrupted and its destination cannot be rewound; pass a seekable file")
        fileobj.seek(start)
        fileobj.truncate()

    return _cut_back
