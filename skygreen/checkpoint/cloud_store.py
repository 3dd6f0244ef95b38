"""What the S3 and GCS stores share: keys under a prefix, one retry layer, one error vocabulary.

A cloud store is a `CloudStore` subclass that makes the library's calls (`_put_bytes`,
`_list_names`, `_stat`, ...) and says what the library's exceptions mean (`_classify`). This
base does the rest once for every cloud: it turns store keys into object names, wraps each
operation in `call_with_retries` under the store's `RetryPolicy` (the only retry layer: the
adapters switch their library's own retries off, so a failing bucket gets exactly
`max_attempts` requests per operation), rewinds a stream or cuts a download back before a
retry, and builds the error a user reads from a kind and a fix (`store_error`).

Core, like `skygreen.checkpoint.store`: it imports no outside library.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import BinaryIO, Literal, TypeVar

from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, StoreUrl, call_with_retries, cut_back, rewind
from skygreen.errors import ArchivedObjectError, KeyNotFoundError, StoreError, TransientStoreError

T = TypeVar("T")

ErrorKind = Literal["missing", "no_bucket", "denied", "archived", "transient", "other"]
"""What a cloud's error means for a checkpoint: "missing" is a normal answer (no such
object), "transient" is retried, the rest fail fast naming the bucket and the fix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectInfo:
    """An object's metadata, as a HEAD (S3) or a metadata reload (GCS) gives it."""

    size_bytes: int
    storage_class: str


def store_error(kind: ErrorKind, *, bucket: str, what: str, code: str, message: str, fix: str = "") -> StoreError:
    """The error a user reads for one cloud answer, the same words for every cloud.

    Args:
        kind: What the answer means (see `ErrorKind`).
        bucket: The bucket's name, for the message and for `{bucket}` in `fix`.
        what: The operation and the store's URL ("put ckpt/m.json to s3://b/p").
        code: The cloud's code ("AccessDenied", "HTTP 403").
        message: The cloud's message.
        fix: What to do; `{bucket}` is filled in.

    Returns:
        `KeyNotFoundError` (missing), `TransientStoreError` (transient), `ArchivedObjectError`
        (archived) or a plain `StoreError` that names the bucket and, where known, the fix.
    """
    fix = fix.format(bucket=bucket)
    if kind == "missing":
        return KeyNotFoundError(f"{what}: no such object ({code})")
    if kind == "transient":
        return TransientStoreError(f"{what}: {code}: {message}")
    if kind == "no_bucket":
        return StoreError(f"{what}: the bucket {bucket!r} does not exist ({code})\n  fix: {fix}")
    if kind == "denied":
        return StoreError(f"{what}: access to bucket {bucket!r} denied ({code}: {message})\n  fix: {fix}")
    if kind == "archived":
        return ArchivedObjectError(f"{what}: the object is in cold storage ({code})\n  fix: {fix}")
    return StoreError(f"{what}: bucket {bucket!r} refused: {code}: {message}")


class CloudStore:
    """Keys are object names under `<scheme>://bucket/prefix/`; every operation is retried by
    `retry` and its library's errors are mapped by the subclass's `_classify`."""

    transient_exceptions: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    """Exceptions that mean the network failed, not the request: retried."""

    def __init__(self, url: StoreUrl, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.root = url
        self.url = url.text
        self.bucket_name = url.bucket
        self.retry = retry

    # -- what a subclass implements: one library call each, no retries, no mapping -------

    def _classify(self, what: str, error: Exception, *, writing: bool) -> StoreError | None:
        """The skygreen error for one of the library's exceptions, or None when it is not the
        library's (it then propagates as it is). `writing` says the call wrote or listed, where
        a "not found" can only mean the bucket is missing."""
        raise NotImplementedError

    def _put_bytes(self, name: str, payload: bytes) -> None:
        raise NotImplementedError

    def _put_stream(self, name: str, stream: BinaryIO) -> None:
        raise NotImplementedError

    def _put_path(self, name: str, path: str) -> None:
        raise NotImplementedError

    def _get_bytes(self, name: str) -> bytes:
        raise NotImplementedError

    def _download(self, name: str, fileobj: BinaryIO) -> None:
        raise NotImplementedError

    def _get_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes `start` to `stop - 1` of the object, in one ranged request."""
        raise NotImplementedError

    def _list_names(self, prefix: str) -> Iterable[str]:
        """Full object names that start with `prefix`, across every page of the listing."""
        raise NotImplementedError

    def _delete(self, name: str) -> None:
        """Delete one object; a missing one may raise (mapped to `KeyNotFoundError`) or not."""
        raise NotImplementedError

    def _stat(self, name: str) -> ObjectInfo:
        raise NotImplementedError

    def _move_to_class(self, name: str, storage_class: str) -> None:
        raise NotImplementedError

    # -- the plumbing -----------------------------------------------------------------------

    def _run(
        self,
        what: str,
        operation: Callable[[], T],
        *,
        on_retry: Callable[[], None] | None = None,
        writing: bool = False,
    ) -> T:
        """Run one operation under the retry policy, its library's errors mapped each attempt."""
        label = f"{what} {self.url}"

        def attempt() -> T:
            try:
                return operation()
            except StoreError:
                raise
            except Exception as e:
                mapped = self._classify(label, e, writing=writing)
                if mapped is None and isinstance(e, self.transient_exceptions):
                    mapped = TransientStoreError(f"{label}: {type(e).__name__}: {e}")
                if mapped is None:
                    raise
                raise mapped from e

        return call_with_retries(attempt, what=label, policy=self.retry, on_retry=on_retry)

    # -- the Store protocol ---------------------------------------------------------------

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Bytes go up in one request; a stream is read from where it stands (large ones in
        parts or chunks) and rewound there before a retry. A stream that cannot be rewound makes
        a retry a `StoreError`; a missing bucket is a `StoreError`."""
        name = self.root.key(key)
        if isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
            self._run(f"put {key} to", lambda: self._put_bytes(name, payload), writing=True)
            return
        self._run(f"upload {key} to", lambda: self._put_stream(name, data), on_retry=rewind(data), writing=True)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload from the path (the library reads the parts from disk itself); a missing bucket
        is a `StoreError`."""
        name = self.root.key(key)
        self._run(f"upload {key} to", lambda: self._put_path(name, os.fspath(path)), writing=True)

    def get(self, key: str) -> bytes:
        """The whole object, in memory; `KeyNotFoundError` where there is none, and
        `ArchivedObjectError` where it sits in a cold class that needs a restore first."""
        name = self.root.key(key)
        return self._run(f"get {key} from", lambda: self._get_bytes(name))

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """Download into `fileobj`; before a retry `fileobj` is cut back to where it stood, so no
        part is written twice (one that cannot seek makes a retry a `StoreError` instead).
        `KeyNotFoundError` where there is no object."""
        name = self.root.key(key)
        self._run(f"download {key} from", lambda: self._download(name, fileobj), on_retry=cut_back(fileobj))

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """Bytes `start` up to (not including) `stop` of the object in one ranged request,
        retried alone by the store's policy; a short answer (a connection cut mid-body that the
        library did not notice) is a `TransientStoreError` and retried too."""
        name = self.root.key(key)
        want = stop - start

        def read() -> bytes:
            data = self._get_range(name, start, stop)
            if len(data) != want:
                raise TransientStoreError(f"got {len(data)} of {want} bytes")
            return data

        return self._run(f"get bytes {start}-{stop - 1} of {key} from", read)

    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with `prefix`, relative to the store's root, sorted; a missing bucket
        is a `StoreError`."""
        full = self.root.key(prefix) if self.root.prefix else prefix
        strip = len(self.root.prefix) + 1 if self.root.prefix else 0
        return self._run(
            f"list {prefix or '/'} in", lambda: sorted(n[strip:] for n in self._list_names(full)), writing=True
        )

    def delete(self, key: str) -> None:
        """Delete the object; one that is already gone is not an error."""
        name = self.root.key(key)
        with contextlib.suppress(KeyNotFoundError):
            self._run(f"delete {key} from", lambda: self._delete(name))

    def _info(self, key: str) -> ObjectInfo:
        name = self.root.key(key)
        return self._run(f"stat {key} in", lambda: self._stat(name))

    def exists(self, key: str) -> bool:
        """Whether the object's metadata loads; a missing object is False, while access denied
        still raises."""
        try:
            self._info(key)
        except KeyNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        """The object's length in bytes; `KeyNotFoundError` where there is none."""
        return self._info(key).size_bytes

    def storage_class(self, key: str) -> str | None:
        """The object's storage class in the cloud's own spelling ("STANDARD", "GLACIER",
        "NEARLINE", "ARCHIVE")."""
        return self._info(key).storage_class

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Rewrite the object in place with a new storage class, server-side."""
        name = self.root.key(key)
        self._run(f"move {key} to {storage_class} in", lambda: self._move_to_class(name, storage_class))
