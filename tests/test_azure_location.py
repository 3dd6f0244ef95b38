"""An Azure account's location, read from Azure Resource Manager's account list.

The management plane cannot run here, so a loopback HTTP server stands in for it, answering as
ARM does: the account list in pages (`value`, `nextLink`), and 403 with ARM's error body to a
token without a role. The credential (Azure AD, the other outer edge) is a stand-in that hands
out a fixed token, as `DefaultAzureCredential.get_token` does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from skygreen.checkpoint.azure_location import API_VERSION, MANAGEMENT_URL, account_location
from skygreen.checkpoint.bucket_region import read_bucket_region

SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
TOKEN = "arm-token"


class Credential:
    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str) -> SimpleNamespace:
        self.scopes.append(scopes)
        return SimpleNamespace(token=TOKEN, expires_on=0)


@pytest.fixture
def arm() -> Iterator[tuple[str, list[str]]]:
    """ARM's account list for one subscription in two pages; every request's path is kept."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            base = f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Storage/storageAccounts"
            if self.headers.get("Authorization") != f"Bearer {TOKEN}" or not self.path.startswith(base):
                body = {"error": {"code": "AuthorizationFailed", "message": "no role on the subscription"}}
                return self._answer(403, body)
            if "page=2" in self.path:
                return self._answer(
                    200, {"value": [{"name": "myckpts", "location": "westeurope", "kind": "StorageV2"}]}
                )
            host = f"http://{self.headers['Host']}"
            first = {"value": [{"name": "other", "location": "eastus"}], "nextLink": f"{host}{base}?page=2"}
            return self._answer(200, first)

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://{}:{}".format(*server.server_address[:2]), seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_an_accounts_location_is_found_across_pages_of_the_subscriptions_accounts(arm):
    url, seen = arm
    env = {"AZURE_SUBSCRIPTION_ID": SUBSCRIPTION, "SKYGREEN_AZURE_MANAGEMENT_URL": url}
    credential = Credential()
    assert account_location("MyCkpts", env, credential=credential) == "westeurope"
    assert credential.scopes == [(f"{MANAGEMENT_URL}/.default",)]
    assert f"api-version={API_VERSION}" in seen[0] and "page=2" in seen[1]
    assert account_location("absent", env, credential=Credential()) is None  # not in this subscription


def test_no_subscription_no_role_or_no_identity_library_is_an_unknown_location(arm):
    url, seen = arm
    assert account_location("myckpts", {"SKYGREEN_AZURE_MANAGEMENT_URL": url}, credential=Credential()) is None
    assert seen == []  # no subscription named: nothing asked
    other = {"AZURE_SUBSCRIPTION_ID": "another", "SKYGREEN_AZURE_MANAGEMENT_URL": url}
    assert account_location("myckpts", other, credential=Credential()) is None  # ARM answers 403
    env = {"AZURE_SUBSCRIPTION_ID": SUBSCRIPTION, "SKYGREEN_AZURE_MANAGEMENT_URL": url}
    try:
        import azure.identity  # noqa: F401
    except ImportError:  # the default credential needs azure-identity: without it, unknown
        assert read_bucket_region("az://myckpts/ckpt/llama", env) is None
    assert read_bucket_region("az://myckpts/ckpt/llama", {}) is None
