"""Shards: a preprocessed dataset as NumPy `.npy` files in the bucket, memory-mapped on read.

`prepare(spec, build)` returns the dataset for `spec`. The first start that asks for it runs
`build` (tokenize, resize, pack), writes the rows as shards to the local cache and uploads
them under `<data_url>/<name>-<key>/`, manifest last; every later start (a resume after a
preemption, another run of the same task, the other ranks) finds the manifest and streams
the shards down instead: each shard is fetched the first time one of its rows is read, and a
background thread fetches the rest in order. `key` is a hash of the source and the
preprocessing config, so changing either (another tokenizer, another block size,
deduplication on) prepares again under a new key instead of reusing stale shards.

Why NumPy `.npy` files, not Parquet or WebDataset tar:

- Exact resume draws *global sample indices* from a seeded permutation
  (`skygreen.runtime.data.SampleStream`), so a row must be reachable by index in O(1). A
  `.npy` file memory-maps: row `i` is an offset, with no decoding and no row group to read
  (Parquet decodes whole row groups), and no sequential stream with a shuffle buffer whose
  contents would become part of the position (WebDataset tar).
- What preprocessing produces here is fixed-shape: packed token blocks (rows x block size),
  resized images (rows x H x W x C) and labels. Nothing needs a record container.
- `.npy` is numpy's own documented format (stable since 2007), and numpy is already in the
  runtime: no new dependency (pyarrow is a 40 MB wheel). Karpathy's build-nanogpt stores
  FineWeb the same way, as uint16 `.npy` shards.
- The cost: no compression. Token ids are stored in the narrowest unsigned type that holds
  the vocabulary (`skygreen.data.text.token_dtype`: uint16 for BERT's and GPT-2's), which
  is most of what a compressor would win; images stored as uint8 pixels take more room than
  JPEG, traded for decoding once instead of every epoch.

Layout under `<data_url>/<name>-<key>/`:

    00000.<field>.npy   one file per field per shard, `rows_per_shard` rows each (the last fewer)
    files/<name>        extra files the build produced (a tokenizer, a label map)
    manifest.json       written last: the commit. A folder without one is rebuilt.

Every file's sha256 and size are in the manifest; a download is checked against them. A file
already in the local cache with the right size is reused without hashing it again (the cache
is this machine's own disk; the bucket is the untrusted side).

`data_url` defaults to `<SKYGREEN_BUCKET>/skygreen-data`, so every run of a bucket shares
its prepared data; `SKYGREEN_DATA_URL` names another prefix (a team's shared data bucket).
The local cache is `SKYGREEN_DATA_CACHE`, else `$XDG_CACHE_HOME/skygreen/data`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from skygreen.errors import InputError, RuntimeSetupError
from skygreen.checkpoint.store import KeyNotFoundError, Store, join_url, open_store

log = logging.getLogger("skygreen.data")

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DATA_PREFIX = "skygreen-data"
DATA_URL_ENV = "SKYGREEN_DATA_URL"
CACHE_ENV = "SKYGREEN_DATA_CACHE"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ShardSpec:
    """What to prepare: a name, where the data comes from and how it is preprocessed.

    `source` and `config` are JSON values; together they are the cache key, so put in them
    everything that changes the rows (dataset id and revision, tokenizer, block size, dedup
    settings, image size) and nothing that does not (paths on this machine, worker counts).
    """

    name: str
    source: Mapping[str, Any]
    config: Mapping[str, Any]
    rows_per_shard: int = 1 << 16

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InputError(
                f"data name {self.name!r}: use letters, digits, '.', '_' or '-' (at most 81 characters)"
            )
        if not isinstance(self.rows_per_shard, int) or self.rows_per_shard < 1:
            raise InputError(f"rows_per_shard must be a positive integer, got {self.rows_per_shard!r}")
        try:
            _canonical({"source": self.source, "config": self.config})
        except TypeError as e:
            raise InputError(f"data {self.name}: source and config must be JSON values: {e}") from e

    @property
    def key(self) -> str:
        """16 hex digits of sha256 over the format version, the source and the config."""
        payload = _canonical({"format": FORMAT_VERSION, "source": self.source, "config": self.config})
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @property
    def folder(self) -> str:
        return f"{self.name}-{self.key}"


def default_data_url(environ: Mapping[str, str] | None = None) -> str:
    """`SKYGREEN_DATA_URL`, else `<SKYGREEN_BUCKET>/skygreen-data`."""
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
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "skygreen" / "data"


# ---------------------------------------------------------------------------------------
# Writing


class ShardWriter:
    """Collects rows from `build`, cuts them into shards, uploads each shard as it fills.

    `add({"input_ids": array(n, L)})` appends n rows (every call the same fields, dtypes and
    row shapes); `add_file(name, data)` stores an extra file beside the shards.
    """

    def __init__(self, spec: ShardSpec, store: Store, local_dir: Path) -> None:
        self.spec = spec
        self.store = store
        self.local_dir = local_dir
        self.fields: dict[str, dict[str, Any]] = {}
        self.shards: list[dict[str, Any]] = []
        self.files: dict[str, dict[str, Any]] = {}
        self.rows = 0
        self._pending: dict[str, list[np.ndarray]] = {}
        self._pending_rows = 0

    def add(self, batch: Mapping[str, Any]) -> None:
        arrays = {name: np.asarray(value) for name, value in batch.items()}
        if not arrays:
            return
        counts = {len(a) for a in arrays.values()}
        if len(counts) != 1:
            raise ValueError(f"every field of a batch needs the same number of rows, got {dict((k, len(v)) for k, v in arrays.items())}")
        if not self.fields:
            self.fields = {n: {"dtype": a.dtype.str, "shape": list(a.shape[1:])} for n, a in arrays.items()}
            self._pending = {n: [] for n in arrays}
        elif set(arrays) != set(self.fields):
            raise ValueError(f"batch fields {sorted(arrays)} differ from the first batch's {sorted(self.fields)}")
        for name, array in arrays.items():
            want = self.fields[name]
            if array.dtype.str != want["dtype"] or list(array.shape[1:]) != want["shape"]:
                raise ValueError(
                    f"field {name!r}: rows of {array.dtype.str} {list(array.shape[1:])}, "
                    f"the first batch had {want['dtype']} {want['shape']}"
                )
            self._pending[name].append(array)
        self._pending_rows += counts.pop()
        while self._pending_rows >= self.spec.rows_per_shard:
            self._flush(self.spec.rows_per_shard)

    def add_file(self, name: str, data: bytes) -> None:
        if not _NAME.match(name):
            raise ValueError(f"extra file name {name!r}: letters, digits, '.', '_' or '-' only")
        key = f"files/{name}"
        path = self.local_dir / key
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_local(path, data)
        self.store.put(key, data)
        self.files[name] = {"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def finish(self, *, preprocess_s: float) -> dict[str, Any]:
        if self._pending_rows:
            self._flush(self._pending_rows)
        if not self.rows:
            raise RuntimeSetupError(f"data {self.spec.name}: the build produced no rows")
        manifest = {
            "format": FORMAT_VERSION,
            "name": self.spec.name,
            "key": self.spec.key,
            "source": self.spec.source,
            "config": self.spec.config,
            "rows": self.rows,
            "fields": self.fields,
            "shards": self.shards,
            "files": self.files,
            "preprocess_s": round(preprocess_s, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        self.store.put(MANIFEST, body)  # the commit: blobs are all up before this
        _write_local(self.local_dir / MANIFEST, body)
        return manifest

    def _flush(self, rows: int) -> None:
        index = len(self.shards)
        entry: dict[str, Any] = {"rows": rows, "files": {}}
        for name, parts in self._pending.items():
            joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
            head, rest = joined[:rows], joined[rows:]
            self._pending[name] = [rest] if len(rest) else []
            key = f"{index:05d}.{name}.npy"
            path = self.local_dir / key
            with _temp_beside(path) as tmp, open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(head), allow_pickle=False)
            size, digest = path.stat().st_size, _sha256_file(path)
            with path.open("rb") as f:
                self.store.put(key, f)
            entry["files"][name] = {"key": key, "size": size, "sha256": digest}
        self._pending_rows -= rows
        self.rows += rows
        self.shards.append(entry)


# ---------------------------------------------------------------------------------------
# Reading


class ShardedDataset:
    """A map-style dataset over committed shards: `len()` rows, `ds[i]` a tuple of arrays
    (or one array for a single field), in the manifest's field order.

    Pass it to `skygreen.runtime.Run` as the dataset and as `extra_state={"data": ds}`: the
    checkpoint then records which prepared data the position refers to, and a resume against
    different data (a changed source or config) stops with a clear error instead of silently
    training on other rows.
    """

    def __init__(self, manifest: Mapping[str, Any], *, store: Store, local_dir: Path, prefetch: bool = True) -> None:
        self.manifest = dict(manifest)
        self.store = store
        self.local_dir = local_dir
        self.fields = tuple(self.manifest["fields"])
        self.key = str(self.manifest["key"])
        self.built = False
        """True in the process that ran the preprocessing, False where it streamed shards."""
        self.prepare_s = 0.0
        """Seconds `prepare` took: the build and upload, or reading the manifest."""
        self._starts = np.cumsum([0] + [int(s["rows"]) for s in self.manifest["shards"]])
        self._maps: dict[int, tuple[np.ndarray, ...]] = {}
        self._locks = [threading.Lock() for _ in self.manifest["shards"]]
        self._prefetch = prefetch
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return int(self.manifest["rows"])

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows")
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        arrays = self._maps.get(shard) or self._open(shard)
        row = index - int(self._starts[shard])
        values = tuple(_row(a, row) for a in arrays)
        return values[0] if len(values) == 1 else values

    def file(self, name: str) -> bytes:
        """An extra file stored with the shards (e.g. the tokenizer the build trained)."""
        meta = self.manifest["files"].get(name)
        if meta is None:
            raise KeyError(f"data {self.manifest['name']}: no extra file {name!r} (has: {sorted(self.manifest['files'])})")
        return self._local(meta).read_bytes()

    @property
    def nbytes(self) -> int:
        """Bytes of all shard and extra files, as stored in the bucket."""
        sizes = [f["size"] for s in self.manifest["shards"] for f in s["files"].values()]
        return int(sum(sizes) + sum(f["size"] for f in self.manifest["files"].values()))

    def fetch_all(self) -> None:
        """Bring every shard into the local cache now (the prefetch thread's job)."""
        for shard in range(len(self.manifest["shards"])):
            self._open(shard)

    def state_dict(self) -> dict[str, Any]:
        return {"key": self.key, "rows": len(self)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("key") != self.key or int(state.get("rows", -1)) != len(self):
            raise RuntimeSetupError(
                f"the checkpoint was trained on prepared data {state.get('key')} ({state.get('rows')} rows), "
                f"this start prepared {self.key} ({len(self)} rows) for {self.manifest['name']}: "
                "the source or the preprocessing config changed, so the saved data position means other rows\n"
                "  fix: restore the data settings of that run, or start a new run"
            )

    def start_prefetch(self) -> None:
        if self._prefetch and self._thread is None and len(self._maps) < len(self._locks):
            self._thread = threading.Thread(target=self._prefetch_all, name="skygreen-data-prefetch", daemon=True)
            self._thread.start()

    def _prefetch_all(self) -> None:
        try:
            self.fetch_all()
        except Exception as e:  # the reader fetches on demand and raises there
            log.warning("skygreen: data prefetch stopped: %s", e)

    def _open(self, shard: int) -> tuple[np.ndarray, ...]:
        with self._locks[shard]:
            arrays = self._maps.get(shard)
            if arrays is None:
                files = self.manifest["shards"][shard]["files"]
                arrays = tuple(np.load(self._local(files[name]), mmap_mode="r") for name in self.fields)
                self._maps[shard] = arrays
        return arrays

    def _local(self, meta: Mapping[str, Any]) -> Path:
        path = self.local_dir / meta["key"]
        if path.exists() and path.stat().st_size == int(meta["size"]):
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        with _temp_beside(path) as tmp:
            with open(tmp, "wb") as f:
                self.store.get_to(meta["key"], f)
            digest = _sha256_file(Path(tmp))
            if digest != meta["sha256"]:
                raise RuntimeSetupError(
                    f"{join_url(self.store.url, meta['key'])}: sha256 {digest[:12]}... does not match the manifest's "
                    f"{meta['sha256'][:12]}...: the shard is corrupt or was replaced\n"
                    "  fix: delete the folder's manifest.json so the next start prepares the data again"
                )
        return path

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers: reopen lazily, no threads
        state = self.__dict__.copy()
        state.update(_maps={}, _locks=None, _thread=None, _prefetch=False)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._locks = [threading.Lock() for _ in self.manifest["shards"]]


# ---------------------------------------------------------------------------------------
# prepare


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
    """The prepared dataset for `spec`: streamed from the bucket if committed, else built once.

    `build(writer)` does the preprocessing, calling `writer.add(...)` with batches of rows.
    Under torchrun only rank 0 builds; the other ranks wait (up to `wait_s`) for its manifest.
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
        _narrate(f"data {spec.name}: prepared {manifest['rows']} rows in {manifest['preprocess_s']:.1f} s, stored at {folder_url}", rank)
    else:
        _check_manifest(manifest, spec, folder_url)
        _narrate(f"data {spec.name}: streaming {manifest['rows']} prepared rows from {folder_url} "
                 f"(preprocessing skipped: it took {manifest.get('preprocess_s', 0):.1f} s once)", rank)
    dataset = ShardedDataset(manifest, store=where.store, local_dir=where.local_dir, prefetch=prefetch)
    dataset.built = built
    dataset.prepare_s = time.monotonic() - started
    dataset.start_prefetch()
    return dataset


def open_prepared(spec: ShardSpec, *, url: str | None = None, cache_dir: str | os.PathLike[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> ShardedDataset | None:
    """The committed dataset for `spec`, or None when it was never prepared (nothing is built)."""
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


# ---------------------------------------------------------------------------------------
# helpers


def _row(array: np.ndarray, row: int) -> np.ndarray:
    """A copy of one row. Token ids stored as uint16/uint32 come back as int64: torch's
    embeddings and losses take int64, and its uint16/uint32 tensors support few operations."""
    value = np.array(array[row])
    if value.dtype.kind == "u" and value.dtype.itemsize > 1:
        return value.astype(np.int64)
    return value


def _narrate(message: str, rank: int) -> None:
    """Say what happened to the data on stderr (rank 0), as the runtime narrates a run: the
    runtime's logging is not set up yet when data is prepared, before `Run` is built."""
    if logging.getLogger("skygreen").handlers or logging.getLogger().handlers:
        log.info("%s", message)
    elif rank == 0:
        print(f"skygreen: {message}", file=sys.stderr, flush=True)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_local(path: Path, data: bytes) -> None:
    with _temp_beside(path) as tmp:
        Path(tmp).write_bytes(data)


class _temp_beside:
    """A temporary file name beside `path`, renamed onto it when the block succeeds."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass
