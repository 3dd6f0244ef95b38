"""Real S3, GCS and Azure test servers: `moto_server`, `gcp-storage-emulator` and Azurite
(`azurite-blob`, installed by scripts/install.sh into .venv/azurite) as subprocesses.

Each runs on a free loopback port, is polled until it answers HTTP, and is stopped at the
end. Fixtures set the client-side environment (endpoint, fake AWS keys) for the test only,
through monkeypatch, so nothing leaks into other tests or files.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
AZURITE_BLOB = BIN.parent / "azurite" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's one built-in account and its key, published in Azure's own documentation."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerExited(RuntimeError):
    """The server process ended before it answered (a port taken under it, a crash)."""


class ServerProcess:
    """A test server subprocess on 127.0.0.1:`port` that can be killed and started again."""

    def __init__(self, name: str, argv_for_port, *, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.name = name
        self.argv_for_port = argv_for_port
        self.env = {**os.environ, **(env or {})}
        self.port = port or free_port()
        self._port_is_ours_to_change = port is None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, log_dir: Path, timeout_s: float = 180.0) -> ServerProcess:
        """Start the server and wait until it answers. The free port was only free when picked:
        another process may bind it before the server does, so a first start whose server exits
        at once tries again on a new port (a restart keeps its port: clients already use it)."""
        for attempt in range(3):
            self.log_path = log_dir / f"{self.name}-{self.port}.log"
            log = open(self.log_path, "ab")  # noqa: SIM115 - the server process writes to it after we return
            self.proc = subprocess.Popen(
                self.argv_for_port(self.port), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=log_dir
            )
            log.close()
            try:
                self._wait_until_answers(timeout_s)
            except ServerExited:
                if not self._port_is_ours_to_change or attempt == 2:
                    raise
                self.port = free_port()
                continue
            self._port_is_ours_to_change = False
            return self
        raise AssertionError("unreachable")

    def _wait_until_answers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerExited(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()[-2000:]}"
                )
            try:
                urllib.request.urlopen(self.url + "/", timeout=1).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer means it is serving
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"{self.name} did not answer on {self.url} within {timeout_s:g} s")

    def kill(self) -> None:
        """SIGKILL, as a crashing server would die: no chance to finish requests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def moto_process() -> ServerProcess:
    return ServerProcess("moto_server", lambda port: [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)])


def gcs_process(*, data_dir: Path | None = None) -> ServerProcess:
    """The GCS emulator; in memory, or persisting to `data_dir` so it survives a restart."""

    def argv(port: int) -> list[str]:
        cmd = [str(BIN / "gcp-storage-emulator"), "start", "--host", "127.0.0.1", "--port", str(port), "--quiet"]
        return cmd if data_dir is not None else [*cmd, "--in-memory"]

    env = {"STORAGE_BASE": str(data_dir)} if data_dir is not None else None
    return ServerProcess("gcp-storage-emulator", argv, env=env)


def azurite_process(*, data_dir: Path) -> ServerProcess:
    """Azurite's blob service, keeping its data in `data_dir` (so it survives a restart), with
    no telemetry and any API version the client library speaks."""

    def argv(port: int) -> list[str]:
        return [
            str(AZURITE_BLOB),
            *("--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data_dir)),
            *("--silent", "--disableTelemetry", "--skipApiVersionCheck", "--loose"),
        ]

    return ServerProcess("azurite", argv)


def azurite_connection_string(endpoint: str, *, key: str = AZURITE_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def unique_bucket() -> str:
    return f"sg-test-{uuid.uuid4().hex[:12]}"


def point_s3_at(monkeypatch, endpoint: str) -> None:
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)


def point_gcs_at(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)


def point_azure_at(monkeypatch, endpoint: str, *, key: str = AZURITE_KEY) -> None:
    for name in ("AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(endpoint, key=key))


def make_azure_container(name: str) -> None:
    from azure.storage.blob import BlobServiceClient

    BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]).create_container(name)


def make_s3_bucket(name: str) -> None:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)


def make_gcs_bucket(name: str) -> None:
    from google.cloud import storage

    storage.Client().create_bucket(name)


SERVER_FIXTURES = {"s3": "moto_server", "gs": "gcs_server", "az": "azurite_server"}
PROXY_FLAVOURS = {"s3": "s3", "gs": "gcs", "az": "azure"}


def proxied_bucket(request, monkeypatch, cloud: str):
    """A fresh bucket on the cloud's session server behind a started `FaultProxy`, the client
    env pointing at the proxy; returns (the bucket's URL, the proxy). The caller stops the proxy."""
    from faultproxy import FaultProxy

    server = request.getfixturevalue(SERVER_FIXTURES[cloud])
    proxy = FaultProxy(server.url, flavour=PROXY_FLAVOURS[cloud]).start()
    bucket = unique_bucket()
    if cloud == "s3":
        point_s3_at(monkeypatch, proxy.url)
        make_s3_bucket(bucket)
    elif cloud == "gs":
        point_gcs_at(monkeypatch, proxy.url)
        make_gcs_bucket(bucket)
    else:
        point_azure_at(monkeypatch, proxy.url)
        make_azure_container(bucket)
        bucket = f"{AZURITE_ACCOUNT}/{bucket}"
    return f"{cloud}://{bucket}", proxy


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory) -> Iterator[ServerProcess]:
    server = moto_process().start(log_dir=tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory) -> Iterator[ServerProcess]:
    server = gcs_process().start(log_dir=tmp_path_factory.mktemp("gcs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """Azurite on a free loopback port with a data folder of its own, or a skip saying how
    to install it (scripts/install.sh does, where npm is present)."""
    if not AZURITE_BLOB.exists():
        pytest.skip(f"Azurite is not installed at {AZURITE_BLOB}: run scripts/install.sh (it needs npm)")
    try:
        import azure.storage.blob  # noqa: F401
    except ModuleNotFoundError:
        pytest.skip("azure-storage-blob is not installed: pip install -e '.[runtime]'")
    server = azurite_process(data_dir=tmp_path_factory.mktemp("azurite-data")).start(
        log_dir=tmp_path_factory.mktemp("azurite")
    )
    yield server
    server.stop()


@pytest.fixture
def azure_bucket(azurite_server, monkeypatch) -> str:
    """A fresh container on the session's Azurite, as `ACCOUNT/CONTAINER`; the test's
    AZURE_STORAGE_CONNECTION_STRING points at it."""
    point_azure_at(monkeypatch, azurite_server.url)
    name = unique_bucket()
    make_azure_container(name)
    return f"{AZURITE_ACCOUNT}/{name}"


@pytest.fixture
def s3_bucket(moto_server, monkeypatch) -> str:
    """A fresh bucket on the session's moto_server; the test's env points boto3 at it."""
    point_s3_at(monkeypatch, moto_server.url)
    name = unique_bucket()
    make_s3_bucket(name)
    return name


@pytest.fixture
def gcs_bucket(gcs_server, monkeypatch) -> str:
    """A fresh bucket on the session's GCS emulator; STORAGE_EMULATOR_HOST points at it."""
    point_gcs_at(monkeypatch, gcs_server.url)
    name = unique_bucket()
    make_gcs_bucket(name)
    return name
