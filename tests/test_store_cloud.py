"""S3, GCS and Azure stores against real test servers (moto_server, gcp-storage-emulator,
Azurite), with faults injected by a loopback proxy: 500s, throttling, dropped connections."""

from __future__ import annotations

import io
import os

import pytest

from faultproxy import FaultProxy
from servers import AZURITE_ACCOUNT, moto_process, point_azure_at, point_gcs_at, point_s3_at
from skygreen.checkpoint.store import RetryPolicy
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import KeyNotFoundError, NoCredentialsError, StoreError, TransientStoreError

FAST_RETRY = RetryPolicy(max_attempts=6, base_delay_s=0.01, max_delay_s=0.05)
MIB = 1024 * 1024


BUCKETS = {"s3": "s3_bucket", "gs": "gcs_bucket", "az": "azure_bucket"}
SERVERS = {"s3": "moto_server", "gs": "gcs_server", "az": "azurite_server"}
POINT_AT = {"s3": point_s3_at, "gs": point_gcs_at, "az": point_azure_at}
FLAVOURS = {"s3": "s3", "gs": "gcs", "az": "azure"}
COLD = {"s3": "GLACIER", "gs": "ARCHIVE", "az": "ARCHIVE"}


@pytest.fixture(params=["s3", "gs", "az"])
def cloud(request) -> str:
    """Which cloud a parametrised test runs against."""
    return request.param


@pytest.fixture
def bucket_url(cloud, request) -> str:
    bucket = request.getfixturevalue(BUCKETS[cloud])
    return f"{cloud}://{bucket}/runs/r1"


@pytest.fixture
def proxy(cloud, bucket_url, monkeypatch, request):
    """A fault proxy in front of the cloud's test server; the client env points at it."""
    server = request.getfixturevalue(SERVERS[cloud])
    fault_proxy = FaultProxy(server.url, flavour=FLAVOURS[cloud]).start()
    POINT_AT[cloud](monkeypatch, fault_proxy.url)
    yield fault_proxy
    fault_proxy.stop()


def test_contract_on_real_servers(bucket_url):
    store = open_store(bucket_url)
    store.put("ckpt/000000000001/a.pt", b"abc")
    store.put("ckpt/000000000001/b.pt", io.BytesIO(b"defg"))
    store.put("other/x", b"")
    assert store.list() == ["ckpt/000000000001/a.pt", "ckpt/000000000001/b.pt", "other/x"]
    assert store.list("ckpt/") == ["ckpt/000000000001/a.pt", "ckpt/000000000001/b.pt"]
    assert store.get("ckpt/000000000001/b.pt") == b"defg"
    assert store.size("ckpt/000000000001/a.pt") == 3
    assert store.exists("other/x") and not store.exists("other/y")
    store.delete("other/x")
    store.delete("other/x")
    assert not store.exists("other/x")
    with pytest.raises(KeyNotFoundError):
        store.get("other/x")
    sibling = open_store(bucket_url.rsplit("/", 1)[0] + "/r2")
    assert sibling.list() == [], "a run's prefix isolates it from its neighbours"


def upload(store, key: str, source, via: str) -> None:
    """`put` of an open stream, or `put_file` of the path (what the checkpointer calls)."""
    if via == "path":
        store.put_file(key, source)
        return
    with open(source, "rb") as f:
        store.put(key, f)


@pytest.mark.parametrize("via", ["stream", "path"])
def test_large_objects_stream_in_parts_and_come_back_identical(bucket_url, tmp_path, via):
    payload = os.urandom(70 * MIB)  # above S3's 16 MiB part size and GCS's 64 MiB chunk
    source = tmp_path / "blob"
    source.write_bytes(payload)
    store = open_store(bucket_url)
    upload(store, "big.pt", source, via)
    assert store.size("big.pt") == len(payload)
    out = tmp_path / "back"
    with open(out, "wb") as f:
        store.get_to("big.pt", f)
    assert out.read_bytes() == payload


@pytest.mark.parametrize("via", ["bytes", "path"])
def test_no_such_bucket_fails_fast_naming_the_bucket_and_the_fix(cloud, bucket_url, tmp_path, via):
    name = f"{AZURITE_ACCOUNT}/sg-missing-bucket-7d1" if cloud == "az" else "sg-missing-bucket-7d1"
    source = tmp_path / "blob"
    source.write_bytes(b"1")
    with pytest.raises(StoreError) as info:
        store = open_store(f"{cloud}://{name}/runs")
        store.put("x", b"1") if via == "bytes" else store.put_file("x", source)
    assert not isinstance(info.value, TransientStoreError)
    assert f"{name!r} does not exist" in str(info.value)
    assert "fix:" in str(info.value)


def test_access_denied_from_a_server_that_checks_keys(tmp_path, monkeypatch):
    """moto with authentication on: a wrong key is refused, and we say what to fix."""
    server = moto_process()
    server.env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    server.start(log_dir=tmp_path)
    try:
        point_s3_at(monkeypatch, server.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        with pytest.raises(StoreError) as info:
            open_store("s3://sg-locked/runs", retry=FAST_RETRY).put("x", b"1")
    finally:
        server.stop()
    message = str(info.value)
    assert not isinstance(info.value, TransientStoreError)
    assert "access to bucket 'sg-locked' denied" in message and "fix:" in message


def test_azure_access_denied_for_a_wrong_account_key(azure_bucket, azurite_server, monkeypatch):
    """Azurite checks the shared-key signature: a wrong key is refused at once, and we say
    which variables hold the key."""
    point_azure_at(monkeypatch, azurite_server.url, key="d3Jvbmcga2V5IGZvciB0ZXN0cw==")
    with pytest.raises(StoreError) as info:
        open_store(f"az://{azure_bucket}/runs", retry=FAST_RETRY).put("x", b"1")
    message = str(info.value)
    assert not isinstance(info.value, TransientStoreError)
    assert f"access to bucket {azure_bucket!r} denied" in message and "AZURE_STORAGE_CONNECTION_STRING" in message


def test_azure_https_url_and_az_url_open_the_same_container(azure_bucket, tmp_path):
    account, container = azure_bucket.split("/")
    open_store(f"az://{azure_bucket}/runs/r1").put("a.pt", b"abc")
    same = open_store(f"https://{account}.blob.core.windows.net/{container}/runs/r1/")
    assert same.get("a.pt") == b"abc"


def test_azure_without_credentials_says_what_to_set(monkeypatch):
    from skygreen.checkpoint import azure_store

    for name in azure_store.CREDENTIAL_ENVS:
        monkeypatch.delenv(name, raising=False)
    try:
        import azure.identity  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(NoCredentialsError, match=r"no Azure credentials[\s\S]*AZURE_STORAGE_CONNECTION_STRING"):
            open_store("az://acct/ckpts/runs")
    else:
        pytest.skip("azure-identity is installed: DefaultAzureCredential is the fallback")


def test_azure_connection_string_for_another_account_is_refused(azure_bucket):
    with pytest.raises(StoreError, match=r"is for the storage account 'devstoreaccount1', not 'otheracct'"):
        open_store("az://otheracct/ckpts/runs")


@pytest.mark.parametrize("via", ["bytes", "path"])
def test_access_denied_is_not_retried(cloud, proxy, bucket_url, tmp_path, via):
    """`upload_file` wraps S3's AccessDenied in S3UploadFailedError: still denied, not retried."""
    source = tmp_path / "blob"
    source.write_bytes(b"1")
    proxy.inject("403", times=10)
    with pytest.raises(StoreError, match=r"denied[\s\S]*fix:") as info:
        store = open_store(bucket_url, retry=FAST_RETRY)
        store.put("x", b"1") if via == "bytes" else store.put_file("x", source)
    assert not isinstance(info.value, TransientStoreError)
    uploads = [entry for entry in proxy.log if entry[0] in ("PUT", "POST") and entry[2] == "403"]
    assert len(uploads) == 1, f"a permanent error fails on the first answer: {proxy.log}"


@pytest.mark.parametrize("fault", ["500", "503", "drop", "drop_reply"])
def test_transient_faults_are_retried_and_the_object_arrives_whole(proxy, bucket_url, fault):
    store = open_store(bucket_url, retry=FAST_RETRY)
    proxy.inject(fault, times=2)
    store.put("ckpt/000000000005/shared.pt", b"weights" * 1000)
    proxy.inject(fault, times=2, method="GET")
    assert store.get("ckpt/000000000005/shared.pt") == b"weights" * 1000
    assert proxy.outcomes(fault) == 4 and proxy.pending() == 0


@pytest.mark.parametrize("via", ["stream", "path"])
def test_faults_during_a_multipart_upload_are_survived(proxy, bucket_url, tmp_path, via):
    payload = os.urandom(40 * MIB)
    source = tmp_path / "blob"
    source.write_bytes(payload)
    store = open_store(bucket_url, retry=FAST_RETRY)
    proxy.inject("drop", times=1, method="PUT")
    proxy.inject("503", times=2, method="PUT")
    proxy.inject("500", times=1, method="POST")
    upload(store, "big.pt", source, via)
    out = tmp_path / "back"
    with open(out, "wb") as f:
        proxy.inject("drop", times=1, method="GET")
        store.get_to("big.pt", f)
    assert out.read_bytes() == payload


def test_a_server_that_keeps_failing_gives_a_clear_transient_error(proxy, bucket_url):
    proxy.inject("503", times=1000)
    with pytest.raises(TransientStoreError, match=r"still failing after 6 attempt\(s\)") as info:
        open_store(bucket_url, retry=FAST_RETRY).put("x", b"1")
    assert bucket_url.split("/runs")[0] in str(info.value)


def test_storage_class_moves(cloud, bucket_url, proxy):
    store = open_store(bucket_url, retry=FAST_RETRY)
    store.put("ckpt/000000000001/shared.pt", b"old weights")
    assert store.storage_class("ckpt/000000000001/shared.pt") == ("HOT" if cloud == "az" else "STANDARD")
    store.set_storage_class("ckpt/000000000001/shared.pt", COLD[cloud])
    if cloud in ("s3", "az"):
        assert store.storage_class("ckpt/000000000001/shared.pt") == COLD[cloud]
    else:
        # The emulator rewrites the object but keeps its class; check what the client asked for.
        assert any(b'"storageClass": "ARCHIVE"' in body for _, path, body in proxy.bodies if "rewriteTo" in path)
