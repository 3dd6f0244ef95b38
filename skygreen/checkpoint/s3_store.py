"""S3 (and any S3-compatible endpoint) as a checkpoint store, through boto3.

Endpoints come from boto3's own settings: `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` reach
MinIO, R2, Ceph or a local test server with no skygreen setting. Credentials come from
boto3's usual chain (instance role, `AWS_PROFILE`, SkyPilot secrets); skygreen never sees or
writes them.

Large objects go up as multipart uploads streamed from a file: at most `max_concurrency`
parts of `multipart_chunksize` bytes are in memory at once. botocore's and s3transfer's own
retries are off (one attempt per request, one per download): errors are mapped by
`_ERROR_TABLE` and retried once, by skygreen's `RetryPolicy`, around the whole operation, so a
failing bucket gets exactly the policy's number of requests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import boto3
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from skygreen.checkpoint.cloud_store import CloudStore, ErrorKind, ObjectInfo, store_error
from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, StoreUrl
from skygreen.errors import NoCredentialsError, StoreError, TransientStoreError

MIB = 1024 * 1024
_TRANSFER = TransferConfig(
    multipart_threshold=16 * MIB,
    multipart_chunksize=16 * MIB,
    max_concurrency=8,
    use_threads=True,
    num_download_attempts=1,  # a broken download is retried by the RetryPolicy, not inside it
)

# What an S3 error code means for a checkpoint: (kind, fix). Kinds: "transient" retries,
# "missing" is a normal answer, the rest fail fast naming the bucket.
_ERROR_TABLE: dict[str, tuple[ErrorKind, str]] = {
    "NoSuchKey": ("missing", ""),
    "404": ("missing", ""),
    "NotFound": ("missing", ""),
    "NoSuchBucket": ("no_bucket", "create it (`aws s3 mb s3://{bucket}`) or fix checkpoint.bucket in the task file"),
    "AccessDenied": (
        "denied",
        "grant the instance role or credentials s3:ListBucket on the bucket and s3:GetObject, s3:PutObject, s3:DeleteObject on its objects",
    ),
    "403": (
        "denied",
        "grant the instance role or credentials s3:ListBucket on the bucket and s3:GetObject, s3:PutObject, s3:DeleteObject on its objects",
    ),
    "AllAccessDisabled": ("denied", "the bucket's owner has disabled all access to it; use another bucket"),
    "InvalidAccessKeyId": ("denied", "the AWS access key is not valid; check the credentials the job runs with"),
    "SignatureDoesNotMatch": ("denied", "the AWS secret key does not match the access key; check the credentials"),
    "ExpiredToken": ("denied", "the AWS session token expired; refresh the credentials"),
    "InvalidToken": ("denied", "the AWS session token is not valid; refresh the credentials"),
    "PermanentRedirect": ("denied", "the bucket is in another region; set AWS_DEFAULT_REGION to the bucket's region"),
    "AuthorizationHeaderMalformed": (
        "denied",
        "the bucket is in another region; set AWS_DEFAULT_REGION to the bucket's region",
    ),
    "InvalidObjectState": ("archived", "restore it from cold storage first (`aws s3api restore-object`)"),
    "InternalError": ("transient", ""),
    "ServiceUnavailable": ("transient", ""),
    "SlowDown": ("transient", ""),
    "Throttling": ("transient", ""),
    "ThrottlingException": ("transient", ""),
    "RequestTimeout": ("transient", ""),
    "RequestTimeTooSkewed": ("transient", ""),
    "NoSuchUpload": ("transient", ""),
    "500": ("transient", ""),
    "502": ("transient", ""),
    "503": ("transient", ""),
    "504": ("transient", ""),
}

_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,  # endpoint unreachable, connection closed, timeouts
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    ConnectionError,
    TimeoutError,
)
_CREDENTIAL_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
)


class S3Store(CloudStore):
    """Keys are object names under `s3://bucket/prefix/`."""

    transient_exceptions = _TRANSIENT_EXCEPTIONS

    def __init__(self, url: StoreUrl, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        super().__init__(url, retry=retry)
        self.bucket = url.bucket
        config = botocore.config.Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=10,
            read_timeout=120,
            max_pool_connections=_TRANSFER.max_request_concurrency + 2,
        )
        self.client = boto3.session.Session().client("s3", config=config)

    def _classify(self, what: str, error: Exception, *, writing: bool) -> StoreError | None:
        """Map by `_ERROR_TABLE`. A 404 is a missing object whatever the call (a HEAD answer
        has no body to tell a missing bucket apart), so `writing` changes nothing here."""
        if isinstance(error, botocore.exceptions.ClientError):
            return _from_client_error(self.bucket, what, error)
        if isinstance(error, _CREDENTIAL_EXCEPTIONS):
            return NoCredentialsError(
                f"{what}: no usable AWS credentials for bucket {self.bucket!r}\n"
                "  fix: run with an instance role, AWS_PROFILE, or SkyPilot secrets for AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
            )
        if isinstance(error, boto3.exceptions.RetriesExceededError):
            return TransientStoreError(f"{what}: {error}")
        if isinstance(error, boto3.exceptions.S3UploadFailedError):
            # `upload_file` wraps the S3 error it met (access denied, no such bucket) in this one;
            # the original is its context, and decides whether retrying can help.
            original = error.__cause__ or error.__context__
            if isinstance(original, botocore.exceptions.ClientError):
                return _from_client_error(self.bucket, what, original)
            return TransientStoreError(f"{what}: {error}")
        return None

    def _put_bytes(self, name: str, payload: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=name, Body=payload)

    def _put_stream(self, name: str, stream: BinaryIO) -> None:
        """Through boto3's managed transfer (multipart above 16 MiB)."""
        self.client.upload_fileobj(_KeepOpen(stream), self.bucket, name, Config=_TRANSFER)

    def _put_path(self, name: str, path: str) -> None:
        """Multipart above 16 MiB, up to 8 parts at once, read from disk by the worker threads."""
        self.client.upload_file(path, self.bucket, name, Config=_TRANSFER)

    def _get_bytes(self, name: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read()

    def _download(self, name: str, fileobj: BinaryIO) -> None:
        self.client.download_fileobj(self.bucket, name, fileobj, Config=_TRANSFER)

    def _get_range(self, name: str, start: int, stop: int) -> bytes:
        """One GetObject with a `Range` header."""
        reply = self.client.get_object(Bucket=self.bucket, Key=name, Range=f"bytes={start}-{stop - 1}")
        return reply["Body"].read()

    def _list_names(self, prefix: str) -> Iterator[str]:
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            yield from (obj["Key"] for obj in page.get("Contents", []))

    def _delete(self, name: str) -> None:
        """DeleteObject; S3 answers a missing key with success."""
        self.client.delete_object(Bucket=self.bucket, Key=name)

    def _stat(self, name: str) -> ObjectInfo:
        """HeadObject; S3 leaves the class out for STANDARD objects, so that is what it says then."""
        head = self.client.head_object(Bucket=self.bucket, Key=name)
        return ObjectInfo(size_bytes=int(head["ContentLength"]), storage_class=head.get("StorageClass", "STANDARD"))

    def _move_to_class(self, name: str, storage_class: str) -> None:
        """Copy the object onto itself with a new class (multipart copy for large objects)."""
        source = {"Bucket": self.bucket, "Key": name}
        self.client.copy(source, self.bucket, name, ExtraArgs={"StorageClass": storage_class}, Config=_TRANSFER)


class _KeepOpen:
    """The caller's stream, minus `close`: s3transfer closes what it reads when an upload
    fails, which would make the retry (and the caller's own `with`) fail on a closed file."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        return self._raw.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return self._raw.seekable()

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _from_client_error(bucket: str, what: str, e: botocore.exceptions.ClientError) -> StoreError:
    error = e.response.get("Error", {})
    code = str(error.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    kind, fix = _ERROR_TABLE.get(code, ("other", ""))
    if kind == "other" and code.isdecimal() and int(code) >= 500:
        kind, code = "transient", f"HTTP {code}"
    return store_error(kind, bucket=bucket, what=what, code=code, message=error.get("Message") or str(e), fix=fix)
