"""A checkpoint bucket seen from the laptop: bounded checks that fail in one line.

A training run may wait minutes for a bucket that hiccups (`store.DEFAULT_RETRY`: up to
300 s), since giving up there loses work. A command on the laptop must not: `up`, `resume`,
`status` and `gc` reach the bucket through `within_deadline`, which retries by
`LAPTOP_RETRY` (bounded by time, not only by count) and gives up for good after
`DEADLINE_S` (45 s) whatever the client library is doing (a server that accepts a connection and
never answers would otherwise hold a request for the library's own timeouts, minutes).
A bucket that does not answer becomes one `BucketUnreachableError` line naming the bucket,
the error and the fix; `resume` checks the bucket this way before it starts any process.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from typing import TypeVar

from skygreen.checkpoint.store import OpenStore, RetryPolicy, parse_url, retry_policy
from skygreen.errors import BucketUnreachableError, InputError, StoreError, TransientStoreError

T = TypeVar("T")

DEADLINE_S = 45.0
"""The most any laptop command waits for a bucket before it says it is unreachable, so that
the whole command, start-up included, ends within a minute. `SKYGREEN_BUCKET_DEADLINE_S`
overrides it (a slow link to a far region may want more)."""
DEADLINE_ENV = "SKYGREEN_BUCKET_DEADLINE_S"

LAPTOP_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.5, max_delay_s=4.0, deadline_s=15.0)
"""Transient errors (refused connections, 5xx) on the laptop: a few retries within 15 s."""


def deadline() -> float:
    """`DEADLINE_S`, or the positive number of seconds in `SKYGREEN_BUCKET_DEADLINE_S`."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (0 < value < 86400):
        raise InputError(
            f"{DEADLINE_ENV}={raw!r}: expected a number of seconds > 0\n  fix: e.g. {DEADLINE_ENV}=120, or unset it"
        )
    return value


def within_deadline(bucket: str, operation: Callable[[], T], *, deadline_s: float | None = None) -> T:
    """Run `operation` (which opens stores and talks to `bucket`) with the laptop's retry
    policy (stores opened through `skygreen.checkpoint.store_factory.open_store` take it up), and
    give up after `deadline_s`. Transient failures that outlast the retries, and
    no answer in time, raise `BucketUnreachableError`; permanent ones (no such bucket, access
    denied) propagate as they are."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            with retry_policy(LAPTOP_RETRY):
                outcome["value"] = operation()
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e

    # A daemon thread: if the client library hangs past the deadline, the command still ends.
    worker = threading.Thread(target=work, name="skygreen-bucket", daemon=True)
    worker.start()
    limit_s = deadline() if deadline_s is None else deadline_s
    worker.join(limit_s)
    if worker.is_alive():
        raise BucketUnreachableError(unreachable_line(bucket, f"no answer within {limit_s:g} s"))
    error = outcome.get("error")
    if isinstance(error, TransientStoreError):
        raise BucketUnreachableError(unreachable_line(bucket, root_cause(error))) from error
    if error is not None:
        raise error  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def check_writable(open_store: OpenStore, bucket: str, run_id: str) -> None:
    """Write, read back and delete one small object under `<bucket>/<run_id>/`, so a missing
    bucket, a missing permission or a bucket that does not answer stops a command before any
    VM or training process starts."""
    url = f"{bucket.rstrip('/')}/{run_id}"
    probe = b"skygreen preflight\n"

    def write_read_delete() -> None:
        store = open_store(url)
        key = f"preflight-{secrets.token_hex(4)}"
        store.put(key, probe)
        if store.get(key) != probe:
            raise StoreError(f"{url}: a test object read back different bytes")
        store.delete(key)

    within_deadline(bucket, write_read_delete)


def check_readable(open_store: OpenStore, url: str) -> None:
    """List under `url` once: enough to tell a bucket that answers from one that does not."""
    within_deadline(url, lambda: open_store(url).list("ckpt/")[:0])


def unreachable_line(bucket: str, error: str) -> str:
    """One line: the bucket, what went wrong, and the fix."""
    scheme = parse_url(bucket).scheme
    endpoint = {
        "s3": " and the S3 endpoint (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, if set)",
        "gs": " and STORAGE_EMULATOR_HOST (if set)",
        "az": " and the BlobEndpoint of AZURE_STORAGE_CONNECTION_STRING (if set)",
    }.get(scheme, "")
    return f"checkpoint bucket {bucket} is unreachable: {error}; fix: check the network{endpoint}, then run the command again"


def root_cause(error: BaseException) -> str:
    """The first line of the innermost cause: the client library's own words."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
