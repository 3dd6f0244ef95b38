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

import os
from collections.abc import Iterator
from typing import BinaryIO

import google.api_core.exceptions as api_exceptions
import google.auth.exceptions
import requests.exceptions
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

from skygreen.checkpoint.cloud_store import CloudStore, ErrorKind, ObjectInfo, store_error
from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, StoreUrl
from skygreen.errors import NoCredentialsError, StoreError

CHUNK_BYTES = 100 * 1024 * 1024
"""Resumable upload chunk (a multiple of 256 KiB; the library's default): the most an upload
holds in memory."""
_TIMEOUT_S = (10, 300)

_DENIED_FIX = "grant the VM's service account roles/storage.objectAdmin on the bucket (or storage.objects.create, get, list and delete)"
# HTTP status -> (kind, fix) for google.api_core errors.
_STATUS_TABLE: dict[int, tuple[ErrorKind, str]] = {
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


class GcsStore(CloudStore):
    """Keys are object names under `gs://bucket/prefix/`."""

    transient_exceptions = _TRANSIENT_EXCEPTIONS

    def __init__(self, url: StoreUrl, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        super().__init__(url, retry=retry)
        try:
            self.client = storage.Client()
        except google.auth.exceptions.DefaultCredentialsError as e:
            raise NoCredentialsError(
                f"{self.url}: no Google Cloud credentials for bucket {url.bucket!r}\n"
                "  fix: run on a VM with a service account, or `gcloud auth application-default login`"
            ) from e
        self.bucket = self.client.bucket(url.bucket)

    def _classify(self, what: str, error: Exception, *, writing: bool) -> StoreError | None:
        """Map by `_STATUS_TABLE`; a 404 on an upload or a listing can only mean the bucket is
        missing (`writing`)."""
        if isinstance(error, api_exceptions.GoogleAPICallError):
            return _from_status(self.bucket_name, what, int(error.code or 0), error.message or str(error), writing)
        if isinstance(error, InvalidResponse):
            status = getattr(getattr(error, "response", None), "status_code", 0) or 0
            return _from_status(self.bucket_name, what, int(status), str(error), writing)
        return None

    def _blob(self, name: str) -> storage.Blob:
        return self.bucket.blob(name, chunk_size=CHUNK_BYTES)

    def _put_bytes(self, name: str, payload: bytes) -> None:
        """Up to 8 MiB in one request, more as a resumable upload."""
        self._blob(name).upload_from_string(payload, retry=None, timeout=_TIMEOUT_S)

    def _put_stream(self, name: str, stream: BinaryIO) -> None:
        """A resumable upload in `CHUNK_BYTES` chunks (a small real file goes up in one request)."""
        size = _remaining_bytes(stream)
        self._blob(name).upload_from_file(stream, size=size, retry=None, timeout=_TIMEOUT_S)

    def _put_path(self, name: str, path: str) -> None:
        self._blob(name).upload_from_filename(path, retry=None, timeout=_TIMEOUT_S)

    def _get_bytes(self, name: str) -> bytes:
        return self._blob(name).download_as_bytes(retry=None, timeout=_TIMEOUT_S)

    def _download(self, name: str, fileobj: BinaryIO) -> None:
        self._blob(name).download_to_file(fileobj, retry=None, timeout=_TIMEOUT_S)

    def _get_range(self, name: str, start: int, stop: int) -> bytes:
        """One media GET with a `Range` header (the library checks no hash on a part; the caller
        hashes the whole blob as the parts land)."""
        blob = self.bucket.blob(name)
        return blob.download_as_bytes(start=start, end=stop - 1, checksum=None, retry=None, timeout=_TIMEOUT_S)

    def _list_names(self, prefix: str) -> Iterator[str]:
        for blob in self.client.list_blobs(self.bucket_name, prefix=prefix, retry=None, timeout=_TIMEOUT_S):
            yield blob.name

    def _delete(self, name: str) -> None:
        self._blob(name).delete(retry=None, timeout=_TIMEOUT_S)

    def _stat(self, name: str) -> ObjectInfo:
        blob = self._blob(name)
        blob.reload(retry=None, timeout=_TIMEOUT_S)
        return ObjectInfo(size_bytes=int(blob.size or 0), storage_class=str(blob.storage_class or "STANDARD"))

    def _move_to_class(self, name: str, storage_class: str) -> None:
        """A server-side rewrite, no download."""
        self._blob(name).update_storage_class(storage_class, retry=None, timeout=_TIMEOUT_S)


def _remaining_bytes(data: BinaryIO) -> int | None:
    """Bytes left in a real file (small ones then go up in one request), else None."""
    try:
        return os.fstat(data.fileno()).st_size - data.tell()
    except (AttributeError, OSError, ValueError):
        return None


def _from_status(bucket: str, what: str, status: int, message: str, writing: bool) -> StoreError:
    kind, fix = _STATUS_TABLE.get(status, ("other", ""))
    if kind == "missing" and (writing or "bucket does not exist" in message.lower()):
        kind = "no_bucket"
    elif kind == "other" and status >= 500:
        kind = "transient"
    return store_error(kind, bucket=bucket, what=what, code=f"HTTP {status}", message=message, fix=fix)
