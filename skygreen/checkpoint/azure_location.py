"""Where an Azure storage account is: its `location`, as the management plane reports it.

The data plane that `azure-storage-blob` speaks never names an account's region (see
`skygreen.checkpoint.bucket_region`); Azure Resource Manager does, in the account resource:

    GET {management}/subscriptions/{subscription}/providers/Microsoft.Storage/storageAccounts
        ?api-version=2023-05-01
    -> {"value": [{"name": "myckpts", "location": "eastus", ...}, ...], "nextLink": ...}

skygreen asks only when the user has named a subscription (`AZURE_SUBSCRIPTION_ID`) and
`azure-identity` is installed, and signs the request with the token `DefaultAzureCredential`
gives for the management scope, through the standard library's HTTP client (no management SDK
for one figure). The account list is read page by page until the account is found. Any failure
(no role on the subscription, no network, an account in another subscription) is an unknown
location, never an error: the plan then takes the task's `checkpoint.region` or assumes Azure's
default region, and says so.

`SKYGREEN_AZURE_MANAGEMENT_URL` replaces the public endpoint (`https://management.azure.com`),
for a sovereign cloud or a local stand-in.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any, Protocol

MANAGEMENT_URL = "https://management.azure.com"
MANAGEMENT_URL_ENV = "SKYGREEN_AZURE_MANAGEMENT_URL"
SUBSCRIPTION_ENV = "AZURE_SUBSCRIPTION_ID"
API_VERSION = "2023-05-01"
MAX_PAGES = 20
"""A subscription lists its accounts in pages; past this many the account is called unknown."""
_TIMEOUT_S = 3


class TokenCredential(Protocol):
    """What `azure.identity` credentials offer: a bearer token for a scope."""

    def get_token(self, *scopes: str) -> Any:
        """An object whose `token` is the bearer token."""
        ...


def account_location(account: str, env: Mapping[str, str], *, credential: TokenCredential | None = None) -> str | None:
    """The storage account's location (`eastus`), or None when it cannot be read.

    Args:
        account: the storage account's name.
        env: the environment: `AZURE_SUBSCRIPTION_ID` (required) and the endpoint override.
        credential: signs the request (default: `azure.identity.DefaultAzureCredential`).
    """
    subscription = env.get(SUBSCRIPTION_ENV)
    if not subscription or not account:
        return None
    management = (env.get(MANAGEMENT_URL_ENV) or MANAGEMENT_URL).rstrip("/")
    try:
        if credential is None:
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        token = credential.get_token(f"{MANAGEMENT_URL}/.default").token
        quoted = urllib.parse.quote(subscription, safe="")
        url: str | None = (
            f"{management}/subscriptions/{quoted}/providers/Microsoft.Storage/storageAccounts?api-version={API_VERSION}"
        )
        for _ in range(MAX_PAGES):
            if url is None:
                return None
            page = _get_json(url, token)
            for found in page.get("value") or []:
                if str(found.get("name", "")).lower() == account.lower():
                    return str(found.get("location") or "").lower() or None
            url = page.get("nextLink")
    except Exception:  # an unknown location is the answer to every failure (module docstring)
        return None
    return None


def _get_json(url: str, token: str) -> dict[str, Any]:
    import urllib.request  # about 20 ms, and only an Azure bucket without a region asks: off the plan path

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as answer:
        data = json.loads(answer.read())
    if not isinstance(data, dict):
        raise ValueError("the account list is not a JSON object")
    return data
