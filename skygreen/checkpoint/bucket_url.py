"""Bucket URLs: the one parser, for the task file and for every store opened.

`s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX`, `az://ACCOUNT/CONTAINER/PREFIX` (or Azure's own
`https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX`, read as the same), `file:///DIR`, or a
plain path (a local directory, as the documentation says). A plain path that only reads as a URL that lost part of its `://`
(`s3//team/ckpt`, `s3:/team`, `gs:team`) is refused, so a typo never trains into a folder
named `s3`.

Kept apart from `skygreen.checkpoint.store` (the store seam, with its retry machinery and
logging) because `skygreen plan` reads every task's bucket: this module imports nothing but
the errors, so the plan path stays light.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.checkpoint.bucket_set import SET_SCHEME, split_set_url
from skygreen.errors import SpecError

BUCKET_SCHEMES: tuple[str, ...] = ("s3", "gs", "az", "file")
"""The schemes a bucket URL may have; a plain local path (no scheme) is a directory too."""
URL_FORMS = (
    "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://ACCOUNT/CONTAINER/PREFIX, file:///DIR or a local path (a directory)"
)
AZURE_BLOB_HOST_SUFFIX = ".blob.core.windows.net"
"""Azure's own blob URL, `https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX`, is an `az://` URL."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreUrl:
    """A parsed store URL: scheme ("s3", "gs", "az", "file"), bucket (or directory) and key prefix.

    An Azure bucket is `ACCOUNT/CONTAINER`: a container's name is only unique within its
    storage account, so the two together name it, as a bucket's name does on S3 or GCS."""

    scheme: str
    bucket: str
    prefix: str
    """Without leading or trailing slash; "" for the bucket's root."""

    def key(self, key: str) -> str:
        """The full object name of a store-relative key."""
        return f"{self.prefix}/{key}" if self.prefix else key

    @property
    def text(self) -> str:
        """The URL written out again, without a trailing slash: `s3://bucket/prefix`."""
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")


def parse_url(url: str, *, field: str = "checkpoint.bucket") -> StoreUrl:
    """Split a bucket URL: the one parser, for the task file and for every store opened.

    A plain path (no scheme) is a local directory, as the documentation says. A path that only
    looks like one because a URL lost part of its `://` (`s3//team/ckpt`, `s3:/team`,
    `gs:team`) is refused rather than read as a folder named `s3`: `./s3/team` says that
    folder is meant.

    Args:
        url: The bucket as written.
        field: The field path the error names.

    Returns:
        The scheme ("s3", "gs", "az", "file"), the bucket (or directory, or Azure's
        `ACCOUNT/CONTAINER`) and the key prefix.

    Raises:
        SpecError: An empty value, an unknown scheme, a URL without a bucket, or a look-alike;
            the message names `field`, the value, the forms allowed and the fix.
    """
    if not isinstance(url, str) or not url.strip():
        raise SpecError(
            field, "the bucket is empty", value=url, allowed=URL_FORMS, hint="name a bucket, e.g. s3://team/ckpt"
        )
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        _refuse_look_alike(url, field)
        return StoreUrl(scheme="file", bucket=url, prefix="")
    scheme = scheme.lower()
    if scheme == SET_SCHEME:  # a bucket set (`skygreen.checkpoint.bucket_set`): its path joins every member
        body, path = split_set_url(url, field=field)
        return StoreUrl(scheme=SET_SCHEME, bucket=f"{{{body}}}", prefix=path)
    if scheme == "https" and rest.partition("/")[0].lower().endswith(AZURE_BLOB_HOST_SUFFIX):
        host, _, path = rest.partition("/")
        scheme, rest = "az", f"{host[: -len(AZURE_BLOB_HOST_SUFFIX)]}/{path}"
    if scheme not in BUCKET_SCHEMES:
        raise SpecError(field, f"unsupported bucket scheme {scheme + '://'!r}", value=url, allowed=URL_FORMS,
                        hint="use an s3://, gs:// or az:// bucket, or a local folder")  # fmt: skip
    if not rest.strip("/"):
        what, form = ("directory", "file:///DIR") if scheme == "file" else ("bucket", f"{scheme}://BUCKET/PREFIX")
        raise SpecError(field, f"the bucket URL names no {what}", value=url, hint=f"write {form}")
    if scheme == "file":
        return StoreUrl(scheme="file", bucket=rest, prefix="")
    if scheme == "az":
        return _azure_url(url, rest, field)
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise SpecError(field, "the bucket URL names no bucket", value=url, hint=f"write {scheme}://BUCKET/PREFIX")
    return StoreUrl(scheme=scheme, bucket=bucket, prefix=prefix.strip("/"))


def _azure_url(url: str, rest: str, field: str) -> StoreUrl:
    """`ACCOUNT/CONTAINER/PREFIX` -> bucket `account/container`; both parts are required, and
    the account is lower case as Azure's host names are."""
    account, _, after = rest.strip("/").partition("/")
    container, _, prefix = after.partition("/")
    if not account or not container:
        raise SpecError(
            field,
            "an Azure bucket URL names the storage account and the container",
            value=url,
            hint="write az://ACCOUNT/CONTAINER/PREFIX",
        )
    return StoreUrl(scheme="az", bucket=f"{account.lower()}/{container}", prefix=prefix.strip("/"))


def _refuse_look_alike(path: str, field: str) -> None:
    """Refuse a plain path whose first part is a scheme's name (`s3//x`, `gs/x`) or holds a
    colon (`s3:/x`, `s3:x`): a URL that lost part of its `://`, not a folder anyone meant."""
    first = path.split("/", 1)[0]
    name = first.partition(":")[0].lower()
    if name not in BUCKET_SCHEMES and ":" not in first:
        return
    rest = path[len(name) :].lstrip(":/")
    if name == "file":
        meant = f"file:///{rest}"
    elif name in BUCKET_SCHEMES:
        meant = f"{name}://{rest}"
    else:
        meant = "s3://BUCKET/PREFIX"
    raise SpecError(
        field,
        "not a bucket URL: the scheme needs '://' (a plain path is a local directory)",
        value=path,
        allowed=URL_FORMS,
        hint=f"write {meant}, or ./{path} for a local folder of that name",
    )


def canonical_url(url: str, *, field: str = "checkpoint.bucket") -> str:
    """The bucket as a task record keeps it: a URL with its scheme in lower case and no trailing
    slash, a plain local path as written. Raises `SpecError` as `parse_url` does."""
    parsed = parse_url(url, field=field)
    return url.strip() if "://" not in url else parsed.text


def join_url(url: str, *parts: str) -> str:
    """`url` with path parts appended, one slash between each."""
    out = url.rstrip("/")
    for part in parts:
        out += "/" + part.strip("/")
    return out
