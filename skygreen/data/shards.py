"""Shards: a preprocessed dataset as NumPy `.npy` files in the bucket, memory-mapped on read.

`prepare(spec, build)` returns the dataset for `spec`. The first start that asks for it runs
`build` (tokenize, resize, pack), writes the rows as shards to the local cache and uploads
them under `<data_url>/<name>-<key>/`, manifest last; every later start (a resume after a
preemption, another run of the same task, the other ranks) finds the manifest and streams
the shards down instead: each shard is fetched the first time one of its rows is read, and a
background thread fetches the rest in order. `key` is a hash of the source and the
preprocessing config, so changing either (another tokenizer, another block size,
deduplication on) prepares again under a new key instead of reusing stale shards.

A composition root of the container side, like `skygreen.runtime`: the task calls `prepare`
from its own script, so the bucket is opened here (`skygreen.checkpoint.store_factory`).

The format, the layout in the bucket and why: `skygreen.data.layout`. The writer and the
reader: `skygreen.data.writer`, `skygreen.data.reader`.

`data_url` defaults to `<SKYGREEN_BUCKET>/skygreen-data`, so every run of a bucket shares
its prepared data; `SKYGREEN_DATA_URL` names another prefix (a team's shared data bucket).
The local cache is `SKYGREEN_DATA_CACHE`, else `$XDG_CACHE_HOME/skygreen/data`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skygreen.checkpoint.store import Store, join_url
from skygreen.checkpoint.store_factory import open_store
from skygreen.data.layout import FORMAT_VERSION, MANIFEST, ShardSpec
from skygreen.data.reader import ShardedDataset
from skygreen.data.writer import ShardWriter
from skygreen.errors import KeyNotFoundError, RuntimeSetupError

__all__ = ["MANIFEST", "ShardSpec", "ShardWriter", "ShardedDataset", "open_prepared", "prepare"]

log = logging.getLogger("skygreen.data")

DATA_PREFIX = "skygreen-data"
DATA_URL_ENV = "SKYGREEN_DATA_URL"
CACHE_ENV = "SKYGREEN_DATA_CACHE"


def default_data_url(environ: Mapping[str, str] | None = None) -> str:
    """Return where prepared data lives: `SKYGREEN_DATA_URL`, else `<SKYGREEN_BUCKET>/skygreen-data`.

    Beside the runs by default, so every run of a bucket shares its prepared data.

    Args:
        environ: the process environment (default: `os.environ`).

    Returns:
        The base URL; each dataset is a folder `<name>-<key>` under it.

    Raises:
        RuntimeSetupError: neither variable is set (the script was not started by skygreen).
    """
    env = os.environ if environ is None else environ
    if env.get(DATA_URL_ENV):
        return env[DATA_URL_ENV]
    if env.get("SKYGREEN_BUCKET"):
        return join_url(env["SKYGREEN_BUCKET"], DATA_PREFIX)
    raise RuntimeSetupError(
        "no place to keep prepared data: neither SKYGREEN_DATA_URL nor SKYGREEN_BUCKET is set\n"
        "  fix: run through `skygreen up` (it sets the bucket), or set SKYGREEN_DATA_URL=s3://BUCKET/PREFIX"
    )


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Return this machine's shard cache: `SKYGREEN_DATA_CACHE`, else `$XDG_CACHE_HOME/skygreen/data`.

    Args:
        environ: the process environment (default: `os.environ`).

    Returns:
        The folder (`~/.cache/skygreen/data` without either variable); not created here.
    """
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "skygreen" / "data"


@dataclass(kw_only=True)
class _Where:
    store: Store
    url: str
    local_dir: Path
    waited_s: float = field(default=0.0)


def prepare(
    spec: ShardSpec,
    build: Callable[[ShardWriter], None],
    *,
    url: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    rank: int | None = None,
    wait_s: float = 6 * 3600.0,
    poll_s: float = 2.0,
    prefetch: bool = True,
    environ: Mapping[str, str] | None = None,
) -> ShardedDataset:
    """Return the prepared dataset for `spec`: streamed from the bucket if committed, else built once.

    A spot run starts many times; preprocessing once and streaming the shards on every later
    start saves the CPU hours the GPU would wait through. Under torchrun only rank 0 builds;
    the other ranks wait for its manifest. What happened (built, or streamed and how long the
    build once took) is said in one line.

    Args:
        spec: what to prepare; its source and config are the cache key.
        build: the preprocessing, `build(writer)`, calling `writer.add(...)` with batches of rows.
        url: the base URL of prepared data (default: `default_data_url()`).
        cache_dir: this machine's cache (default: `default_cache_dir()`).
        rank: this process's rank (default: `RANK`, else 0).
        wait_s: how long other ranks wait for rank 0's manifest, in seconds (6 hours).
        poll_s: how often they look, in seconds.
        prefetch: fetch every shard in a background thread; else each on first read.
        environ: the process environment (default: `os.environ`).

    Returns:
        The dataset; `built` says whether this process ran `build`, `prepare_s` how long
        this call took.

    Raises:
        RuntimeSetupError: no data URL is known; the committed manifest is of another format
            or key; rank 0 committed nothing within `wait_s`; the build added no rows.
        SpecError: `url` is not a bucket URL (`s3://`, `gs://`, `file://` or a path).
        StoreError: the bucket cannot be read or written, or its client library is missing.
        ValueError: a batch given to `writer.add` does not match the first one.
    """
    env = os.environ if environ is None else environ
    started = time.monotonic()
    folder_url = join_url(url or default_data_url(env), spec.folder)
    where = _Where(
        store=open_store(folder_url),
        url=folder_url,
        local_dir=Path(cache_dir).expanduser() / spec.folder if cache_dir else default_cache_dir(env) / spec.folder,
    )
    rank = int(env.get("RANK", "0")) if rank is None else rank
    manifest = _read_manifest(where.store)
    built = False
    if manifest is None and rank != 0:
        manifest = _wait_for_manifest(where, spec, wait_s=wait_s, poll_s=poll_s)
    if manifest is None:
        where.local_dir.mkdir(parents=True, exist_ok=True)
        writer = ShardWriter(spec, where.store, where.local_dir)
        build(writer)
        manifest = writer.finish(preprocess_s=time.monotonic() - started)
        built = True
        _narrate(
            f"data {spec.name}: prepared {manifest['rows']} rows in {manifest['preprocess_s']:.1f} s, stored at {folder_url}",
            rank,
        )
    else:
        _check_manifest(manifest, spec, folder_url)
        _narrate(
            f"data {spec.name}: streaming {manifest['rows']} prepared rows from {folder_url} "
            f"(preprocessing skipped: it took {manifest.get('preprocess_s', 0):.1f} s once)",
            rank,
        )
    dataset = ShardedDataset(manifest, store=where.store, local_dir=where.local_dir, prefetch=prefetch)
    dataset.built = built
    dataset.prepare_s = time.monotonic() - started
    dataset.start_prefetch()
    return dataset


def open_prepared(
    spec: ShardSpec,
    *,
    url: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ShardedDataset | None:
    """Open the committed dataset for `spec`, or None when it was never prepared; nothing is built.

    For a process that must not preprocess (an evaluation job, a check of what a run trained on).

    Args:
        spec: what was prepared.
        url: the base URL of prepared data (default: `default_data_url()`).
        cache_dir: this machine's cache (default: `default_cache_dir()`).
        environ: the process environment (default: `os.environ`).

    Returns:
        The dataset (shards fetched on first read, no prefetch), or None.

    Raises:
        RuntimeSetupError: no data URL is known, or the manifest is of another format or key.
        SpecError: `url` is not a bucket URL.
        StoreError: the bucket cannot be read, or its client library is missing.
    """
    env = os.environ if environ is None else environ
    folder_url = join_url(url or default_data_url(env), spec.folder)
    store = open_store(folder_url)
    manifest = _read_manifest(store)
    if manifest is None:
        return None
    _check_manifest(manifest, spec, folder_url)
    local = Path(cache_dir).expanduser() / spec.folder if cache_dir else default_cache_dir(env) / spec.folder
    return ShardedDataset(manifest, store=store, local_dir=local, prefetch=False)


def _read_manifest(store: Store) -> dict[str, Any] | None:
    try:
        return json.loads(store.get(MANIFEST))
    except KeyNotFoundError:
        return None


def _check_manifest(manifest: Mapping[str, Any], spec: ShardSpec, url: str) -> None:
    if manifest.get("format") != FORMAT_VERSION or manifest.get("key") != spec.key:
        raise RuntimeSetupError(
            f"{url}/{MANIFEST}: format {manifest.get('format')} key {manifest.get('key')}, expected format "
            f"{FORMAT_VERSION} key {spec.key}\n  fix: delete that manifest.json so the data is prepared again"
        )


def _wait_for_manifest(where: _Where, spec: ShardSpec, *, wait_s: float, poll_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        manifest = _read_manifest(where.store)
        if manifest is not None:
            return manifest
    raise RuntimeSetupError(
        f"data {spec.name}: rank 0 did not commit {where.url}/{MANIFEST} within {wait_s:.0f} s\n"
        "  fix: look at rank 0's log for the preprocessing error"
    )


def _narrate(message: str, rank: int) -> None:
    """Say what happened to the data on stderr (rank 0), as the runtime narrates a run.

    The runtime's logging is not set up yet when data is prepared, before `Run` is built.
    """
    if logging.getLogger("skygreen").handlers or logging.getLogger().handlers:
        log.info("%s", message)
    elif rank == 0:
        print(f"skygreen: {message}", file=sys.stderr, flush=True)
