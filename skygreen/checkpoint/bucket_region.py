"""Where a cloud bucket says it is: S3 `GetBucketLocation`, GCS bucket metadata.

A thin adapter for the plan (`skygreen.bill.bucket` decides what the answer means). It asks
only when the environment already holds credentials for the bucket's cloud (or points at an
emulator), so `skygreen plan` never waits on a credential chain that probes instance metadata,
and any failure (no permission, no network, no such bucket) is an unknown region, never an
error: the plan then uses the task's region or the cloud's default, and says so.

An Azure storage account's location is a property of the account resource, which only the
management plane reports; the data plane that `azure-storage-blob` speaks, with the connection
string or key a VM holds, answers `get_account_information` with the SKU and account kind
alone. So an `az://` bucket is located through Azure Resource Manager where the user has named a
subscription (`AZURE_SUBSCRIPTION_ID`) and `azure-identity` can sign the request
(`skygreen.checkpoint.azure_location`); else it is left to the task's `checkpoint.region` (else
the default-region note).

For a bucket set (`skygreen.checkpoint.bucket_set`), each member is read in turn: the answer is
a mapping of member URL to region (None where unread).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from skygreen.checkpoint.azure_location import SUBSCRIPTION_ENV, account_location
from skygreen.checkpoint.bucket_set import is_set_url, members

_TIMEOUT_S = 3

_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE")
_GCP_ENV = ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "CLOUDSDK_CONFIG")


def s3_bucket_region(bucket: str) -> str | None:
    """The S3 bucket's `LocationConstraint` ("" for us-east-1), or None when it cannot be read."""
    try:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=_TIMEOUT_S, read_timeout=_TIMEOUT_S, retries={"max_attempts": 1})
        answer = boto3.client("s3", config=config).get_bucket_location(Bucket=bucket)
    except Exception:  # an unknown region is the answer to every failure (module docstring)
        return None
    return answer.get("LocationConstraint") or ""


def gcs_bucket_region(bucket: str) -> str | None:
    """The GCS bucket's location (`US-CENTRAL1`, or a multi-region such as `US`), or None."""
    try:
        from google.cloud import storage

        found = storage.Client().get_bucket(bucket, timeout=_TIMEOUT_S)
    except Exception:  # as above
        return None
    return found.location


BucketRegion = str | Mapping[str, str | None] | None
"""What `read_bucket_region` answers: one region, or per member of a bucket set, or None."""


def read_bucket_regions(url: str | None, env: Mapping[str, str] | None = None) -> BucketRegion:
    """`read_bucket_region`, and for a bucket set, member URL -> region (None where unread)."""
    if is_set_url(url):
        assert url is not None
        env = os.environ if env is None else env
        return {m.url: read_bucket_region(m.url, env) for m in members(url)}
    return read_bucket_region(url, env)


def read_bucket_region(url: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The region a bucket URL's bucket reports, when the environment holds credentials for it."""
    env = os.environ if env is None else env
    if not url or "://" not in url:
        return None
    scheme, _, rest = url.partition("://")
    bucket = rest.split("/", 1)[0]
    if scheme == "s3" and any(env.get(k) for k in _AWS_ENV):
        return s3_bucket_region(bucket)
    if scheme == "gs" and any(env.get(k) for k in _GCP_ENV):
        return gcs_bucket_region(bucket)
    if scheme == "az" and env.get(SUBSCRIPTION_ENV):
        return account_location(bucket, env)
    return None
