"""A model's `config.json` from the Hugging Face Hub: the one file, cached by `huggingface_hub`.

The only module that imports `huggingface_hub`, and only when a task names `model.hf`.
"""

from __future__ import annotations

import json
from typing import Any


class HubError(Exception):
    """The config could not be had: offline, unknown repo, gated model, or not a JSON object."""


def fetch_config(repo_id: str) -> dict[str, Any]:
    """The parsed `config.json` of `repo_id`, from the local cache when it is there.

    Raises:
        HubError: `huggingface_hub` missing, the Hub unreachable with nothing cached, the repo
            unknown or gated, or the file not a JSON object.
    """
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as e:
        raise HubError("the huggingface_hub package is not installed (pip install huggingface_hub)") from e
    try:
        path = hf_hub_download(repo_id=repo_id, filename="config.json")
    except Exception as e:
        raise HubError(f"cannot fetch config.json of {repo_id!r} from the Hugging Face Hub ({type(e).__name__})") from e
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise HubError(f"the cached config.json of {repo_id!r} is not readable JSON: {e}") from e
    if not isinstance(config, dict):
        raise HubError(f"the config.json of {repo_id!r} is not a JSON object")
    return config
