"""The store factory: opens the adapter for a checkpoint URL by its scheme (s3://, gs://, az://, a local path).

`skygreen.checkpoint.store` is the seam (the `Store` protocol, bucket URLs, retries) and imports
no adapter; this module is the one place that does. A composition helper, not core: only the
composition roots (`skygreen.api` on the laptop, `skygreen.runtime` in the container) and
tests import it; the core takes a `Store` (or a
function that opens one) as an argument. A new cloud store is one module beside the others
(`<scheme>_store.py`, a `skygreen.checkpoint.cloud_store.CloudStore` with an error table) plus
one branch here.
"""

from __future__ import annotations

import os

from skygreen.checkpoint.bucket_set import SET_SCHEME, members, nearest, place_from_env
from skygreen.checkpoint.store import RetryPolicy, Store, current_retry_policy, parse_url
from skygreen.errors import StoreError


def open_store(url: str, *, retry: RetryPolicy | None = None) -> Store:
    """The store for `url`, chosen by scheme; the adapter's library is imported only now.

    A missing cloud library is a `StoreError` saying which extra to install.
    """
    parsed = parse_url(url)
    policy = retry or current_retry_policy()
    if parsed.scheme == SET_SCHEME:
        return _open_set(url, policy)
    if parsed.scheme == "file":
        from skygreen.checkpoint.local_store import LocalStore

        return LocalStore(parsed.bucket, retry=policy)
    try:
        if parsed.scheme == "s3":
            from skygreen.checkpoint.s3_store import S3Store

            return S3Store(parsed, retry=policy)
        if parsed.scheme == "az":
            from skygreen.checkpoint.azure_store import AzureStore

            return AzureStore(parsed, retry=policy)
        from skygreen.checkpoint.gcs_store import GcsStore

        return GcsStore(parsed, retry=policy)
    except ModuleNotFoundError as e:
        raise StoreError(
            f"{url}: the {parsed.scheme}:// store needs the package {e.name!r}, which is not installed\n"
            "  fix: pip install 'skygreen[runtime]'"
        ) from e


def _open_set(url: str, policy: RetryPolicy) -> Store:
    """A bucket set (`skygreen.checkpoint.set_store`): each member opened by its scheme, and the
    near one chosen by where this process runs (`SKYPILOT_CLUSTER_INFO`; the home bucket on a
    laptop)."""
    from skygreen.checkpoint.set_store import SetStore

    found = members(url)
    cloud, region = place_from_env(os.environ)
    return SetStore(
        url, [(m, open_store(m.url, retry=policy)) for m in found], near=nearest(found, cloud=cloud, region=region)
    )
