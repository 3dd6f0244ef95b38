"""S3 (and any S3-compatible endpoint) as a checkpoint store, through boto3.

Endpoints come from boto3's own settings: `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` reach
MinIO, R2, Ceph or a local test server with no skygreen setting. Credentials come from
boto3's usual chain (instance role, `AWS_PROFILE`, SkyPilot secrets); skygreen never sees or
writes them.

Large objects go up as multipart uploads streamed from a file: at most `max_concurrency`
parts of `multipart_chunksize` bytes are in memory at once. botocore retries single requests
(one part, one GET) a couple of times; whatever still fails is mapped by `_ERROR_TABLE` and
retried as a whole operation by skygreen's `RetryPolicy`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import BinaryIO, TypeVar

import boto3
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, StoreUrl, call_with_retries, rewind
from skygreen.errors import ArchivedObjectError, KeyNotFoundError, NoCredentialsError, StoreError, TransientStoreError

T = TypeVar("T")

MIB = 1024 * 1024
_TRANSFER = TransferConfig(
    multipart_threshold=16 * MIB,
    multipart_chunksize=16 * MIB,
    max_concurrency=8,
    use_threads=True,
)

# What an S3 error code means for a checkpoint: (kind, fix). Kinds: "transient" retries,
# "missing" is a normal answer, the rest fail fast naming the bucket.
_ERROR_TABLE: dict[str, tuple[str, str]] = {
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


class S3Store:
    """Keys are object names under `s3://bucket/prefix/`."""

    def __init__(self, url: StoreUrl, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.bucket = url.bucket
        self.root = url
        self.url = url.text
        self.retry = retry
        config = botocore.config.Config(
            retries={"mode": "standard", "total_max_attempts": 3},
            connect_timeout=10,
            read_timeout=120,
            max_pool_connections=_TRANSFER.max_request_concurrency + 2,
        )
        self.client = boto3.session.Session().client("s3", config=config)

    def _run(self, what: str, operation: Callable[[], T], *, on_retry: Callable[[], None] | None = None) -> T:
        label = f"{what} {self.url}"
        return call_with_retries(
            lambda: _mapped(self.bucket, label, operation), what=label, policy=self.retry, on_retry=on_retry
        )

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """Bytes go up in one PutObject; a stream goes up from where it stands through boto3's
        managed transfer (multipart above 16 MiB) and is rewound there if the upload is retried.
        A stream that cannot be rewound makes a retry a `StoreError` instead."""
        name = self.root.key(key)
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._run(f"put {key} to", lambda: self.client.put_object(Bucket=self.bucket, Key=name, Body=bytes(data)))
            return
        stream = _KeepOpen(data)
        self._run(
            f"upload {key} to",
            lambda: self.client.upload_fileobj(stream, self.bucket, name, Config=_TRANSFER),
            on_retry=rewind(data),
        )

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """Upload from the path through boto3's managed transfer: multipart above 16 MiB, up to 8
        parts at once."""
        name = self.root.key(key)
        self._run(
            f"upload {key} to", lambda: self.client.upload_file(os.fspath(path), self.bucket, name, Config=_TRANSFER)
        )

    def get(self, key: str) -> bytes:
        """The whole object, in memory; `KeyNotFoundError` where there is none, and
        `ArchivedObjectError` where it sits in a cold class that needs a restore first."""
        name = self.root.key(key)
        return self._run(f"get {key} from", lambda: self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read())

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """Download into `fileobj` through the managed transfer; before a retry `fileobj` is cut
        back to where it stood, so no part is written twice. `KeyNotFoundError` where there is
        no object."""
        name = self.root.key(key)
        start = fileobj.tell()

        def restart() -> None:
            fileobj.seek(start)
            fileobj.truncate()

        self._run(
            f"download {key} from",
            lambda: self.client.download_fileobj(self.bucket, name, fileobj, Config=_TRANSFER),
            on_retry=restart,
        )

    def list(self, prefix: str = "") -> list[str]:
        """Keys that start with `prefix`, relative to the store's root, sorted, read across every
        page of the listing."""
        full = self.root.key(prefix) if self.root.prefix else prefix
        strip = len(self.root.prefix) + 1 if self.root.prefix else 0

        def listing() -> list[str]:
            keys: list[str] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
            return sorted(keys)

        return self._run(f"list {prefix or '/'} in", listing)

    def delete(self, key: str) -> None:
        """DeleteObject; S3 answers a missing key with success, so that is no error."""
        name = self.root.key(key)
        self._run(f"delete {key} from", lambda: self.client.delete_object(Bucket=self.bucket, Key=name))

    def _head(self, key: str) -> dict:
        name = self.root.key(key)
        return self._run(f"stat {key} in", lambda: self.client.head_object(Bucket=self.bucket, Key=name))

    def exists(self, key: str) -> bool:
        """Whether HeadObject finds the object. Any 404 is False, a missing bucket's included (a
        HEAD answer has no body to tell them apart); access denied still raises."""
        try:
            self._head(key)
        except KeyNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        """ContentLength from HeadObject, in bytes; `KeyNotFoundError` where there is no object."""
        return int(self._head(key)["ContentLength"])

    def storage_class(self, key: str) -> str | None:
        """The class HeadObject reports; S3 leaves it out for STANDARD objects, so this says
        "STANDARD" then and is never None."""
        return self._head(key).get("StorageClass", "STANDARD")

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """Copy the object onto itself with a new class (multipart copy for large objects)."""
        name = self.root.key(key)
        source = {"Bucket": self.bucket, "Key": name}
        self._run(
            f"move {key} to {storage_class} in",
            lambda: self.client.copy(
                source, self.bucket, name, ExtraArgs={"StorageClass": storage_class}, Config=_TRANSFER
            ),
        )


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


def _mapped(bucket: str, what: str, operation: Callable[[], T]) -> T:
    """Run a boto3 call, turning its exceptions into skygreen's by `_ERROR_TABLE`."""
    try:
        return operation()
    except botocore.exceptions.ClientError as e:
        raise _from_client_error(bucket, what, e) from e
    except _CREDENTIAL_EXCEPTIONS as e:
        raise NoCredentialsError(
            f"{what}: no usable AWS credentials for bucket {bucket!r}\n"
            "  fix: run with an instance role, AWS_PROFILE, or SkyPilot secrets for AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        ) from e
    except _TRANSIENT_EXCEPTIONS as e:
        raise TransientStoreError(f"{what}: {type(e).__name__}: {e}") from e
    except boto3.exceptions.RetriesExceededError as e:
        raise TransientStoreError(f"{what}: {e}") from e
    except boto3.exceptions.S3UploadFailedError as e:
        # `upload_file` wraps the S3 error it met (access denied, no such bucket) in this one;
        # the original is its context, and decides whether retrying can help.
        original = e.__cause__ or e.__context__
        if isinstance(original, botocore.exceptions.ClientError):
            raise _from_client_error(bucket, what, original) from e
        raise TransientStoreError(f"{what}: {e}") from e


def _from_client_error(bucket: str, what: str, e: botocore.exceptions.ClientError) -> StoreError:
    error = e.response.get("Error", {})
    code = str(error.get("Code") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return _from_code(bucket, what, code, error.get("Message") or str(e))


def _from_code(bucket: str, what: str, code: str, message: str) -> StoreError:
    kind, fix = _ERROR_TABLE.get(code, ("other", ""))
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
    if code.isdigit() and int(code) >= 500:
        return TransientStoreError(f"{what}: HTTP {code}: {message}")
    return StoreError(f"{what}: bucket {bucket!r} refused: {code}: {message}")
