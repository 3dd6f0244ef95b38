"""The retry policy (pure) and URL parsing: exponential backoff with full jitter, fail fast."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skygreen.checkpoint.store import RetryPolicy, StoreUrl, backoff_delay_s, call_with_retries, parse_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import InputError, SpecError, StoreError, TransientStoreError


class FakeClock:
    """Sleep advances time instead of waiting, so retries run instantly and are observable."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds

    def monotonic(self) -> float:
        return self.now_s


def flaky(failures: int, error: Exception, result: str = "ok"):
    calls = {"n": 0}

    def operation() -> str:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise error
        return result

    return operation, calls


def test_backoff_cap_doubles_up_to_max_and_jitter_scales_it():
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=5.0)
    assert [backoff_delay_s(policy, i, 1.0) for i in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff_delay_s(policy, 3, 0.25) == 1.0
    assert backoff_delay_s(policy, 3, 0.0) == 0.0


@given(st.integers(min_value=0, max_value=10_000), st.floats(min_value=0.0, max_value=1.0))
def test_backoff_is_always_within_zero_and_the_cap(retry_index, draw):
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=30.0)
    delay = backoff_delay_s(policy, retry_index, draw)
    assert 0.0 <= delay <= 30.0
    assert delay <= 0.1 * 2.0 ** min(retry_index, 60) + 1e-12


def test_transient_errors_are_retried_until_success_with_growing_waits():
    clock = FakeClock()
    operation, calls = flaky(3, TransientStoreError("503 SlowDown"))
    result = call_with_retries(
        operation,
        what="put x",
        policy=RetryPolicy(base_delay_s=1.0, max_delay_s=100.0),
        sleep=clock.sleep,
        monotonic=clock.monotonic,
        uniform01=lambda: 1.0,
    )
    assert result == "ok" and calls["n"] == 4
    assert clock.sleeps == [1.0, 2.0, 4.0]


def test_permanent_errors_fail_fast_without_retry():
    clock = FakeClock()
    operation, calls = flaky(5, StoreError("the bucket 'b' does not exist"))
    with pytest.raises(StoreError, match="does not exist"):
        call_with_retries(operation, what="put x", sleep=clock.sleep, monotonic=clock.monotonic)
    assert calls["n"] == 1 and clock.sleeps == []


def test_gives_up_after_max_attempts_naming_the_operation_and_count():
    clock = FakeClock()
    operation, calls = flaky(100, TransientStoreError("connection reset"))
    with pytest.raises(
        TransientStoreError, match=r"put ckpt/x: still failing after 4 attempt\(s\).*connection reset"
    ) as info:
        call_with_retries(
            operation,
            what="put ckpt/x",
            policy=RetryPolicy(max_attempts=4, base_delay_s=0.1),
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    assert calls["n"] == 4 and len(clock.sleeps) == 3
    assert isinstance(info.value.__cause__, TransientStoreError)


def test_gives_up_when_the_deadline_would_pass():
    clock = FakeClock()
    operation, calls = flaky(100, TransientStoreError("timeout"))
    with pytest.raises(TransientStoreError, match="still failing"):
        call_with_retries(
            operation,
            what="get x",
            policy=RetryPolicy(max_attempts=1000, base_delay_s=1.0, max_delay_s=8.0, deadline_s=20.0),
            sleep=clock.sleep,
            monotonic=clock.monotonic,
            uniform01=lambda: 1.0,
        )
    assert clock.now_s <= 20.0
    assert calls["n"] == 5  # waits 1 + 2 + 4 + 8 = 15 s; one more 8 s wait would pass 20 s


def test_on_retry_runs_before_each_new_attempt():
    clock = FakeClock()
    rewinds = []
    operation, _ = flaky(2, TransientStoreError("reset"))
    call_with_retries(
        operation, what="x", sleep=clock.sleep, monotonic=clock.monotonic, on_retry=lambda: rewinds.append(1)
    )
    assert rewinds == [1, 1]


@pytest.mark.parametrize(
    "bad", [{"max_attempts": 0}, {"base_delay_s": -1.0}, {"base_delay_s": 2.0, "max_delay_s": 1.0}, {"deadline_s": 0.0}]
)
def test_policy_rejects_nonsense(bad):
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**bad)


def test_parse_url_schemes_and_prefixes(tmp_path):
    assert parse_url("s3://bucket/runs/r1/") == parse_url("s3://bucket/runs/r1")
    assert parse_url("s3://bucket/runs/r1").key("ckpt/m.json") == "runs/r1/ckpt/m.json"
    assert parse_url("gs://bucket").key("a") == "a"
    assert parse_url("file:///tmp/x").bucket == "/tmp/x"
    assert parse_url(str(tmp_path)).scheme == "file"
    assert parse_url("relative/dir") == StoreUrl(scheme="file", bucket="relative/dir", prefix="")
    assert parse_url("./s3/team").bucket == "./s3/team"


@pytest.mark.parametrize(
    "look_alike, meant",
    [
        ("s3//team/ckpt", "s3://team/ckpt"),
        ("S3:/team/ckpt", "s3://team/ckpt"),
        ("gs:team", "gs://team"),
        ("gs/team", "gs://team"),
        ("file:/data/ckpt", "file:///data/ckpt"),
        ("bucket:/x", "s3://BUCKET/PREFIX"),
    ],
)
def test_a_url_that_lost_part_of_its_scheme_is_refused_not_read_as_a_folder(look_alike, meant):
    """Every store is opened through this parser, so the runtime refuses what the task file would."""
    with pytest.raises(SpecError) as info:
        open_store(look_alike)
    message = str(info.value)
    assert message.startswith("checkpoint.bucket: not a bucket URL") and repr(look_alike) in message
    assert f"fix: write {meant}, or ./{look_alike} for a local folder" in message


def test_unknown_scheme_names_the_supported_ones():
    with pytest.raises(InputError) as info:
        open_store("wasb://container/runs")
    message = str(info.value)
    assert "'wasb://'" in message
    for scheme in ("s3://", "gs://", "az://", "file://", "local path"):
        assert scheme in message


def test_bucket_url_without_bucket_is_an_input_error():
    with pytest.raises(InputError, match="names no bucket"):
        open_store("s3:///runs")


RETRY_THREE_TIMES = """
import sys
from skygreen.checkpoint.store import RetryPolicy, call_with_retries, show_retries
from skygreen.errors import TransientStoreError
if sys.argv[1] == "show":
    show_retries()
    show_retries()  # a second call adds no second handler
calls = []
def operation():
    calls.append(1)
    if len(calls) <= 3:
        raise TransientStoreError("503 SlowDown")
    return "ok"
print(call_with_retries(operation, what="put x", policy=RetryPolicy(base_delay_s=0.0, max_delay_s=0.0), sleep=lambda s: None))
"""


@pytest.mark.parametrize("mode", ["quiet", "show"])
def test_retry_lines_print_only_when_asked_for(mode):
    """Where no logging is set up (the command line), a retried bucket call prints nothing until
    the final error; `show_retries()` (what `SKYGREEN_DEBUG=1` calls) prints each retry once."""
    out = subprocess.run([sys.executable, "-c", RETRY_THREE_TIMES, mode], capture_output=True, text=True, check=True)
    assert out.stdout == "ok\n"
    lines = out.stderr.splitlines()
    if mode == "quiet":
        assert lines == []
    else:
        assert [line.split(";")[0] for line in lines] == ["put x: 503 SlowDown"] * 3
        assert [line.split("; ")[1].split(" in ")[0] for line in lines] == ["retry 1", "retry 2", "retry 3"]


def test_azure_urls_name_the_account_and_the_container():
    from skygreen.checkpoint.bucket_url import canonical_url

    parsed = parse_url("az://MyAcct/ckpts/runs/a/")
    assert (parsed.scheme, parsed.bucket, parsed.prefix, parsed.key("x")) == (
        "az",
        "myacct/ckpts",
        "runs/a",
        "runs/a/x",
    )
    assert canonical_url("https://myacct.blob.core.windows.net/ckpts/runs/a") == "az://myacct/ckpts/runs/a"
    for bad in ("az://myacct", "az://myacct/", "https://example.com/ckpts"):
        with pytest.raises(SpecError, match=r"checkpoint\.bucket"):
            parse_url(bad)
