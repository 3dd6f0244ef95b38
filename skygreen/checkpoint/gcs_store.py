"""Google Cloud Storage as a checkpoint store, through google-cloud-storage.

`STORAGE_EMULATOR_HOST` (honoured by the client library itself) points it at an emulator,
with anonymous credentials. Otherwise credentials come from Application Default Credentials
(the VM's service account); skygreen never sees or writes them.

Objects above 8 MiB go up as resumable uploads in `CHUNK_BYTES` chunks streamed from a file,
so memory stays bounded by one chunk. The library's own retries are switched off
(`retry=None`): errors are mapped by `_STATUS_TABLE` and retried once, by skygreen's
`RetryPolicy`, around the whole operation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import BinaryIO, TypeVar

import google.api_core.exceptions as api_exceptions
import google.auth.exceptions
import requests.exceptions
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, StoreUrl, call_with_retries, rewind
from skygreen.errors import KeyNotFoundError, NoCredentialsError, StoreError, TransientStoreError

T = TypeVar("T")

CHUNK_BYTES = 100 * 1024 * 1024
"""Resumable upload chunk (a multiple of 256 KiB; the library's default): the most an upload
holds in memory."""
_TIMEOUT_S = (10, 300)

_DENIED_FIX = "grant the VM's service account roles/storage.objectAdmin on the bucket (or storage.objects.create, get, list and delete)"
# HTTP status -> (kind, fix) for google.api_core errors.
_STATUS_TABLE: dict[int, tuple[str, str]] = {
    401: ("denied", "the credentials were rejected; check Application Default Credentials on the VM"),
    403: ("denied", _DENIED_FIX),
    404: (
        "missing",
        "create it (`gcloud storage buckets create gs://{bucket}`) or fix checkpoint.bucket in the task file",
    ),
    408: ("transient", ""),
    429: ("transient", ""),
    500: ("transient", ""),
    502: ("transient", ""),
    503: ("transient", ""),
    504: ("transient", ""),
}
_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    google.auth.exceptions.TransportError,
    DataCorruption,
    ConnectionError,
    TimeoutError,
)


class GcsStore:
    """Keys are object names under `gs://bucket/prefix/`."""

    def __init__(self, url: StoreUrl, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.bucket_name = url.bucket
        self.root = url
        self.url = url.text
        self.retry = retry
        try:
            self.client = storage.Client()
        except google.auth.exceptions.DefaultCredentialsError as e:
            raise NoCredentialsError(
                f"{self.url}: no Google Cloud credentials for bucket {url.bucket!r}\n"
                "  fix: run on a VM with a service account, or `gcloud auth application-default login`"
            ) from e
        self.bucket = self.client.bucket(url.bucket)

    def _run(
        self,
        what: str,
        operation: Callable[[], T],
        *,
        on_retry: Callable[[], None] | None = None,
        writing: bool = False,
    ) -> T:
        label = f"{what} {self.url}"
        return call_with_retries(
            lambda: _mapped(self.bucket_name, label, operation, writing=writing),
            what=label,
            policy=self.retry,
            on_retry=on_retry,
        )

    def _blob(self, key: str) -> storage.Blob:
        return self.bucket.blob(self.root.key(key), chunk_size=CHUNK_BYTES)

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Up to 8 MiB goes up in one request, more (or a stream of unknown size) as a resumable
        upload in `CHUNK_BYTES` chunks. A stream is read from where it stands and rewound there if
        the upload is retried. A 404 means the bucket is missing: `StoreError`."""
        blob = self._blob(key)
        if isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
            self._run(
                f"put {key} to", lambda: blob.upload_from_string(payload, retry=None, timeout=_TIMEOUT_S), writing=True
            )
            return
        size = _remaining_bytes(data)
        self._run(
            f"upload {key} to",
            lambda: blob.upload_from_file(data, size=size, retry=None, timeout=_TIMEOUT_S),
            on_retry=rewind(data),
            writing=True,
        )

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload from the path (resumable, in `CHUNK_BYTES` chunks, above 8 MiB); a 404 means the
        bucket is missing: `StoreError`."""
        blob = self._blob(key)
        self._run(
            f"upload {key} to",
            lambda: blob.upload_from_filename(os.fspath(path), retry=None, timeout=_TIMEOUT_S),
            writing=True,
        )

    def get(self, key: str) -> bytes:
        """The whole object, in memory; `KeyNotFoundError` where there is none."""
        blob = self._blob(key)
        return self._run(f"get {key} from", lambda: blob.download_as_bytes(retry=None, timeout=_TIMEOUT_S))

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """Download into `fileobj`; before a retry `fileobj` is cut back to where it stood, so no
        part is written twice. `KeyNotFoundError` where there is no object."""
        blob = self._blob(key)
        start = fileobj.tell()

        def restart() -> None:
            fileobj.seek(start)
            fileobj.truncate()

        self._run(
            f"download {key} from",
            lambda: blob.download_to_file(fileobj, retry=None, timeout=_TIMEOUT_S),
            on_retry=restart,
        )

    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with `prefix`, relative to the store's root, sorted; a 404 means the
        bucket is missing: `StoreError`."""
        full = self.root.key(prefix) if self.root.prefix else prefix
        strip = len(self.root.prefix) + 1 if self.root.prefix else 0

        def listing() -> list[str]:
            blobs = self.client.list_blobs(self.bucket_name, prefix=full, retry=None, timeout=_TIMEOUT_S)
            return sorted(b.name[strip:] for b in blobs)

        return self._run(f"list {prefix or '/'} in", listing, writing=True)

    def delete(self, key: str) -> None:
        """Delete the object; one that is already gone is not an error."""
        blob = self._blob(key)
        with contextlib.suppress(KeyNotFoundError):
            self._run(f"delete {key} from", lambda: blob.delete(retry=None, timeout=_TIMEOUT_S))

    def _reloaded(self, key: str) -> storage.Blob:
        blob = self._blob(key)
        self._run(f"stat {key} in", lambda: blob.reload(retry=None, timeout=_TIMEOUT_S))
        return blob

    def exists(self, key: str) -> bool:
        """Whether the object's metadata loads (a missing object is False); other failures, such
        as access denied or a missing bucket, still raise."""
        try:
            self._reloaded(key)
        except KeyNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        """The object's length in bytes, from its metadata; `KeyNotFoundError` where there is none."""
        return int(self._reloaded(key).size)

    def storage_class(self, key: str) -> str | None:
        """The class in the object's metadata, as GCS spells it ("STANDARD", "NEARLINE",
        "COLDLINE", "ARCHIVE")."""
        return self._reloaded(key).storage_class

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Rewrite the object in place with a new storage class (server-side, no download)."""
        blob = self._blob(key)
        self._run(
            f"move {key} to {storage_class} in",
            lambda: blob.update_storage_class(storage_class, retry=None, timeout=_TIMEOUT_S),
        )


def _remaining_bytes(data: BinaryIO) -> int | None:
    """Bytes left in a real file (small ones then go up in one request), else None."""
    try:
        return os.fstat(data.fileno()).st_size - data.tell()
    except (AttributeError, OSError, ValueError):
        return None


def _mapped(bucket: str, what: str, operation: Callable[[], T], *, writing: bool = False) -> T:
    """Run a google-cloud-storage call, turning its exceptions into skygreen's.

    A 404 on an upload or a listing can only mean the bucket is missing (`writing`).
    """
    try:
        return operation()
    except api_exceptions.GoogleAPICallError as e:
        raise _from_status(bucket, what, int(e.code or 0), e.message or str(e), writing=writing) from e
    except InvalidResponse as e:
        status = getattr(getattr(e, "response", None), "status_code", 0) or 0
        raise _from_status(bucket, what, int(status), str(e), writing=writing) from e
    except _TRANSIENT_EXCEPTIONS as e:
        raise TransientStoreError(f"{what}: {type(e).__name__}: {e}") from e


def _from_status(bucket: str, what: str, status: int, message: str, *, writing: bool = False) -> StoreError:
    kind, fix = _STATUS_TABLE.get(status, ("other", ""))
    fix = fix.format(bucket=bucket)
    if kind == "missing":
        if writing or "bucket does not exist" in message.lower():
            return StoreError(f"{what}: the bucket {bucket!r} does not exist ({status})\n  fix: {fix}")
        return KeyNotFoundError(f"{what}: no such object ({status})")
    if kind == "transient":
        return TransientStoreError(f"{what}: HTTP {status}: {message}")
    if kind == "denied":
        return StoreError(f"{what}: access to bucket {bucket!r} denied (HTTP {status}: {message})\n  fix: {fix}")
    if status >= 500:
        return TransientStoreError(f"{what}: HTTP {status}: {message}")
    return StoreError(f"{what}: bucket {bucket!r} refused: HTTP {status}: {message}")
