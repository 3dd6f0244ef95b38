"""Azure Blob Storage as a checkpoint store, through azure-storage-blob.

A bucket is `az://ACCOUNT/CONTAINER/PREFIX` (Azure's own `https://ACCOUNT.blob.core.windows.net/...`
reads as the same). Credentials come from the environment, in this order, and skygreen never
writes them anywhere:

- `AZURE_STORAGE_CONNECTION_STRING`: the account's connection string. Its `BlobEndpoint`, when
  it has one, is where requests go: that is how a local Azurite server is reached;
- `AZURE_STORAGE_KEY` (an account key) or `AZURE_STORAGE_SAS_TOKEN`;
- `DefaultAzureCredential` (a VM's managed identity, `az login`, `AZURE_CLIENT_*`) when the
  package `azure-identity` is installed.

Objects above `SINGLE_PUT_BYTES` go up as blocks, `MAX_CONCURRENCY` at once, each read from the
file in its `BLOCK_BYTES` piece by the worker that sends it; downloads above `SINGLE_GET_BYTES` come in parallel ranged
GETs. The library's own retries are off (`retry_total=0`): errors are mapped by `_ERROR_TABLE`
and retried once, by skygreen's `RetryPolicy`, around the whole operation.

Where the account is (its region) the data plane does not say: it is the storage account's
location, which only the management plane (`az storage account show`) tells.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import azure.core.exceptions as azure_errors
from azure.storage.blob import BlobBlock, BlobServiceClient, StandardBlobTier

from skygreen.checkpoint.cloud_store import CloudStore, ErrorKind, ObjectInfo, store_error
from skygreen.checkpoint.store import DEFAULT_RETRY, RetryPolicy, StoreUrl
from skygreen.errors import NoCredentialsError, StoreError, TransientStoreError

MIB = 1024 * 1024
SINGLE_PUT_BYTES = 16 * MIB
"""Up to this size an object goes up in one request; above it, in blocks."""
BLOCK_BYTES = 8 * MIB
"""One block of a block upload: with `MAX_CONCURRENCY` workers, the most an upload holds in memory
is their product."""
SINGLE_GET_BYTES = 16 * MIB
"""The first GET of a download asks for this much; the rest comes in `CHUNK_GET_BYTES` ranges."""
CHUNK_GET_BYTES = 8 * MIB
MAX_CONCURRENCY = 8
"""Blocks or ranges in flight at once, for one upload or download."""

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_KEY_ENV = "AZURE_STORAGE_KEY"
SAS_TOKEN_ENV = "AZURE_STORAGE_SAS_TOKEN"
CREDENTIAL_ENVS: tuple[str, ...] = (CONNECTION_STRING_ENV, ACCOUNT_KEY_ENV, SAS_TOKEN_ENV)
"""The variables that carry Azure storage credentials, for the launch side to pass as secrets."""

_CREDENTIALS_FIX = (
    f"set {CONNECTION_STRING_ENV}, or {ACCOUNT_KEY_ENV} (the account key) or {SAS_TOKEN_ENV}, "
    "or install azure-identity and give the VM a managed identity with the role Storage Blob Data Contributor"
)
_DENIED_FIX = "give the identity the role Storage Blob Data Contributor on the storage account or container"
_CONTAINER_FIX = (
    "create it (`az storage container create --account-name ACCOUNT --name CONTAINER`) "
    "or fix checkpoint.bucket in the task file (az://ACCOUNT/CONTAINER/PREFIX)"
)
_KEY_FIX = f"the account key, SAS token or connection string was rejected; check {', '.join(CREDENTIAL_ENVS)}"

# x-ms-error-code -> (kind, fix).
_ERROR_TABLE: dict[str, tuple[ErrorKind, str]] = {
    "BlobNotFound": ("missing", ""),
    "ResourceNotFound": ("missing", ""),
    "ContainerNotFound": ("no_bucket", _CONTAINER_FIX),
    "ContainerBeingDeleted": ("no_bucket", _CONTAINER_FIX),
    "AccountIsDisabled": ("denied", "the storage account is disabled; enable it or use another"),
    "AuthenticationFailed": ("denied", _KEY_FIX),
    "InvalidAuthenticationInfo": ("denied", _KEY_FIX),
    "NoAuthenticationInformation": ("denied", _CREDENTIALS_FIX),
    "AuthorizationFailure": ("denied", _DENIED_FIX),
    "AuthorizationPermissionMismatch": ("denied", _DENIED_FIX),
    "AuthorizationSourceIPMismatch": ("denied", "the account's firewall refuses this address; allow the VM's network"),
    "InsufficientAccountPermissions": ("denied", _DENIED_FIX),
    "BlobArchived": ("archived", "rehydrate it first (`az storage blob set-tier --tier Hot`)"),
    "BlobBeingRehydrated": ("archived", "wait for its rehydration to finish"),
    "InternalError": ("transient", ""),
    "ServerBusy": ("transient", ""),
    "OperationTimedOut": ("transient", ""),
}
# HTTP status -> kind, for answers without a code the table knows.
_STATUS_KINDS: dict[int, tuple[ErrorKind, str]] = {
    401: ("denied", _KEY_FIX),
    403: ("denied", _DENIED_FIX),
    404: ("missing", ""),
    408: ("transient", ""),
    429: ("transient", ""),
}
_TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    azure_errors.ServiceRequestError,  # the request never reached the service
    azure_errors.ServiceResponseError,  # the connection broke before or during the answer
    azure_errors.IncompleteReadError,
    ConnectionError,
    TimeoutError,
)
_TIERS = {tier.value.upper(): tier for tier in StandardBlobTier}
"""Azure's access tiers ("Hot", "Cool", "Cold", "Archive") by the upper-case names skygreen uses."""


class AzureStore(CloudStore):
    """Keys are blob names under `az://account/container/prefix/`."""

    transient_exceptions = _TRANSIENT_EXCEPTIONS

    def __init__(
        self, url: StoreUrl, *, retry: RetryPolicy = DEFAULT_RETRY, environ: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(url, retry=retry)
        self.account, _, self.container_name = url.bucket.partition("/")
        self.service = open_service(self.account, os.environ if environ is None else environ)
        self.container = self.service.get_container_client(self.container_name)

    def _classify(self, what: str, error: Exception, *, writing: bool) -> StoreError | None:
        """Map by the answer's error code (`_ERROR_TABLE`), then by its status; a token that could
        not be had at all (no identity on the machine) is a `NoCredentialsError`."""
        if isinstance(error, azure_errors.IncompleteReadError):
            return TransientStoreError(f"{what}: {type(error).__name__}: {error}")
        if not isinstance(error, azure_errors.HttpResponseError):
            return None
        status = int(error.status_code or 0)
        if isinstance(error, azure_errors.ClientAuthenticationError) and not status:
            return NoCredentialsError(
                f"{what}: no usable Azure credentials for account {self.account!r}: {_first_line(error)}\n"
                f"  fix: {_CREDENTIALS_FIX}"
            )
        code = str(getattr(error, "error_code", None) or "")  # set by azure-storage-blob, not azure-core
        kind, fix = _ERROR_TABLE.get(code) or _STATUS_KINDS.get(status, ("other", ""))
        if kind == "missing" and writing:
            kind, fix = "no_bucket", _CONTAINER_FIX
        elif kind == "denied" and "failed to authenticate" in str(error).lower():
            fix = _KEY_FIX  # a bad signature (Azurite answers it as AuthorizationFailure)
        elif kind == "other" and status >= 500:
            kind = "transient"
        shown = f"{code} (HTTP {status})" if code else f"HTTP {status}"
        return store_error(kind, bucket=self.bucket_name, what=what, code=shown, message=_first_line(error), fix=fix)

    def _blob(self, name: str) -> Any:
        return self.container.get_blob_client(name)

    def _put_bytes(self, name: str, payload: bytes) -> None:
        self._blob(name).upload_blob(payload, overwrite=True, max_concurrency=MAX_CONCURRENCY)

    def _put_stream(self, name: str, stream: BinaryIO) -> None:
        """A real file goes up from where it stands as `_put_path` does; any other stream through
        the library, which reads it to its end."""
        remaining = _remaining_bytes(stream)
        if remaining is None:
            self._blob(name).upload_blob(stream, overwrite=True, max_concurrency=MAX_CONCURRENCY)
            return
        self._put_file_range(name, stream.fileno(), stream.tell(), remaining)
        stream.seek(remaining, os.SEEK_CUR)  # read to its end, as the other stores leave it

    def _put_path(self, name: str, path: str) -> None:
        with open(path, "rb") as f:
            self._put_file_range(name, f.fileno(), 0, os.fstat(f.fileno()).st_size)

    def _put_file_range(self, name: str, fd: int, start: int, size: int) -> None:
        """Up to `SINGLE_PUT_BYTES` in one Put Blob; above, Put Block for each `BLOCK_BYTES`
        piece, each worker reading its own piece from disk (`os.pread`), then Put Block List.

        The first block goes up alone and the rest `MAX_CONCURRENCY` at a time: an account that
        refuses (throttled, denied, no container) answers one request per attempt, not a burst,
        and a failed block cancels the ones not yet sent."""
        blob = self._blob(name)
        if size <= SINGLE_PUT_BYTES:
            blob.upload_blob(os.pread(fd, size, start), overwrite=True)
            return
        token = secrets.token_hex(6)
        offsets = range(0, size, BLOCK_BYTES)
        ids = [base64.b64encode(f"{token}-{i:08d}".encode()).decode() for i in range(len(offsets))]

        def stage(index: int) -> None:
            offset = offsets[index]
            blob.stage_block(ids[index], os.pread(fd, min(BLOCK_BYTES, size - offset), start + offset))

        stage(0)
        with ThreadPoolExecutor(MAX_CONCURRENCY, thread_name_prefix="skygreen-azure-put") as pool:
            futures = [pool.submit(stage, i) for i in range(1, len(ids))]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
        blob.commit_block_list([BlobBlock(block_id=i) for i in ids])

    def _get_bytes(self, name: str) -> bytes:
        return self._blob(name).download_blob(max_concurrency=MAX_CONCURRENCY).readall()

    def _download(self, name: str, fileobj: BinaryIO) -> None:
        """Ranged GETs in parallel, written in place (a stream that cannot seek gets them in order)."""
        workers = MAX_CONCURRENCY if _seekable(fileobj) else 1
        self._blob(name).download_blob(max_concurrency=workers).readinto(fileobj)

    def _get_range(self, name: str, start: int, stop: int) -> bytes:
        """One GET with a `Range` header (the caller hashes the whole blob as the parts land)."""
        return self._blob(name).download_blob(offset=start, length=stop - start, max_concurrency=1).readall()

    def _list_names(self, prefix: str) -> Iterator[str]:
        yield from self.container.list_blob_names(name_starts_with=prefix or None)

    def _delete(self, name: str) -> None:
        """Delete Blob; a missing one answers BlobNotFound, which `delete` treats as done."""
        self._blob(name).delete_blob()

    def _stat(self, name: str) -> ObjectInfo:
        """Get Blob Properties: the size and the access tier, upper case ("HOT", "COOL",
        "COLD", "ARCHIVE"); an account without tiers says HOT."""
        props = self._blob(name).get_blob_properties()
        tier = str(props.blob_tier or "Hot").upper()
        return ObjectInfo(size_bytes=int(props.size), storage_class=tier)

    def _move_to_class(self, name: str, storage_class: str) -> None:
        """Set Blob Tier: server-side, the blob keeps its name and bytes."""
        tier = _TIERS.get(storage_class.upper())
        if tier is None:
            raise StoreError(
                f"{self.url}: {storage_class!r} is not an Azure access tier\n  allowed: {', '.join(_TIERS)}"
            )
        self._blob(name).set_standard_blob_tier(tier)


def open_service(account: str, environ: Mapping[str, str]) -> BlobServiceClient:
    """The account's client, from the first credential the environment gives (see the module
    docstring), with the library's retries off and skygreen's block sizes.

    Raises:
        NoCredentialsError: No credential variable is set and azure-identity is not installed.
        StoreError: The connection string names another account than the URL.
    """
    options: dict[str, Any] = {
        "retry_total": 0,
        "connection_timeout": 10,
        "read_timeout": 120,
        "max_single_put_size": SINGLE_PUT_BYTES,
        "max_block_size": BLOCK_BYTES,
        "max_single_get_size": SINGLE_GET_BYTES,
        "max_chunk_get_size": CHUNK_GET_BYTES,
    }
    connection_string = environ.get(CONNECTION_STRING_ENV, "").strip()
    if connection_string:
        named = connection_string_account(connection_string)
        if named is not None and named.lower() != account:
            raise StoreError(
                f"az://{account}/...: {CONNECTION_STRING_ENV} is for the storage account {named!r}, "
                f"not {account!r}\n  fix: set it to the connection string of {account!r}, "
                "or name that account in checkpoint.bucket"
            )
        return BlobServiceClient.from_connection_string(connection_string, **options)
    account_url = f"https://{account}.blob.core.windows.net"
    if environ.get(ACCOUNT_KEY_ENV, "").strip():
        key = environ[ACCOUNT_KEY_ENV].strip()
        return BlobServiceClient(account_url, credential={"account_name": account, "account_key": key}, **options)
    if environ.get(SAS_TOKEN_ENV, "").strip():
        return BlobServiceClient(account_url, credential=environ[SAS_TOKEN_ENV].strip(), **options)
    try:
        from azure.identity import DefaultAzureCredential
    except ModuleNotFoundError as e:
        raise NoCredentialsError(
            f"az://{account}/...: no Azure credentials for storage account {account!r}\n  fix: {_CREDENTIALS_FIX}"
        ) from e
    return BlobServiceClient(account_url, credential=DefaultAzureCredential(), **options)


def connection_string_account(connection_string: str) -> str | None:
    """The `AccountName` a connection string names, or None."""
    for part in connection_string.split(";"):
        name, sep, value = part.partition("=")
        if sep and name.strip().lower() == "accountname":
            return value.strip()
    return None


def _first_line(error: BaseException) -> str:
    """The library's message without the multi-line request dump it appends."""
    message = getattr(error, "message", None) or str(error)
    return str(message).strip().splitlines()[0] if str(message).strip() else type(error).__name__


def _remaining_bytes(data: BinaryIO) -> int | None:
    """Bytes left in a real file, else None (the library then reads until the end)."""
    try:
        return os.fstat(data.fileno()).st_size - data.tell()
    except (AttributeError, OSError, ValueError):
        return None


def _seekable(fileobj: BinaryIO) -> bool:
    try:
        return bool(fileobj.seekable())
    except (AttributeError, OSError, ValueError):
        return False
