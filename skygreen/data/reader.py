"""The reader: a map-style dataset over committed shards, fetched into the local cache on demand."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from skygreen.checkpoint.store import Store, join_url
from skygreen.data.cache import sha256_file, temp_beside
from skygreen.data.layout import MANIFEST
from skygreen.errors import RuntimeSetupError
from skygreen.files import inside_parts

log = logging.getLogger("skygreen.data")


class ShardedDataset:
    """A map-style dataset over committed shards, memory-mapped from the local cache.

    `len(ds)` rows; `ds[i]` is a tuple of arrays, one per field in name order (or one array
    for a single field). A shard is fetched and its sha256 checked the first time one of its
    rows is read, so training starts before the whole dataset is down.

    Pass it to `skygreen.runtime.Run` as the dataset and as `extra_state={"data": ds}`: the
    checkpoint then records which prepared data the position refers to, and a resume against
    different data (a changed source or config) stops with a clear error instead of silently
    training on other rows.
    """

    def __init__(self, manifest: Mapping[str, Any], *, store: Store, local_dir: Path, prefetch: bool = True) -> None:
        """Open the dataset a manifest describes; nothing is fetched yet (`prepare` does this).

        Args:
            manifest: the committed manifest (rows, fields, shards, extra files).
            store: the dataset's folder in the bucket.
            local_dir: this machine's cache folder for it.
            prefetch: whether `start_prefetch` starts a background fetch of every shard.

        Raises:
            KeyError: the manifest lacks `fields`, `key` or `shards`.
        """
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
        """Return an extra file stored with the shards (e.g. the tokenizer the build trained).

        Args:
            name: the name given to `ShardWriter.add_file`.

        Returns:
            Its bytes, fetched into the cache and checked against the manifest's sha256.

        Raises:
            KeyError: no extra file of that name.
            RuntimeSetupError: the fetched file's sha256 does not match the manifest.
            StoreError: the bucket cannot be read.
        """
        meta = self.manifest["files"].get(name)
        if meta is None:
            raise KeyError(
                f"data {self.manifest['name']}: no extra file {name!r} (has: {sorted(self.manifest['files'])})"
            )
        return self._local(meta).read_bytes()

    @property
    def nbytes(self) -> int:
        """Bytes of all shard and extra files, as stored in the bucket."""
        sizes = [f["size"] for s in self.manifest["shards"] for f in s["files"].values()]
        return int(sum(sizes) + sum(f["size"] for f in self.manifest["files"].values()))

    def fetch_all(self) -> None:
        """Bring every shard into the local cache now (the prefetch thread's job).

        Raises:
            RuntimeSetupError: a shard's sha256 does not match the manifest.
            StoreError: the bucket cannot be read.
        """
        for shard in range(len(self.manifest["shards"])):
            self._open(shard)

    def state_dict(self) -> dict[str, Any]:
        """Return what a checkpoint records of the data: its key and row count, not the rows."""
        return {"key": self.key, "rows": len(self)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check that a checkpoint was trained on this data; nothing is loaded.

        Args:
            state: what `state_dict` returned in the run that saved the checkpoint.

        Raises:
            RuntimeSetupError: the saved key or row count differs from this dataset's, since
                the saved sample position would then point at other rows.
        """
        if state.get("key") != self.key or int(state.get("rows", -1)) != len(self):
            raise RuntimeSetupError(
                f"the checkpoint was trained on prepared data {state.get('key')} ({state.get('rows')} rows), "
                f"this start prepared {self.key} ({len(self)} rows) for {self.manifest['name']}: "
                "the source or the preprocessing config changed, so the saved data position means other rows\n"
                "  fix: restore the data settings of that run, or start a new run"
            )

    def start_prefetch(self) -> None:
        """Start one daemon thread that brings every shard into the local cache.

        Does nothing when the dataset was made with `prefetch=False` (always so in an
        unpickled copy, such as a DataLoader worker's), when the thread was started before, or
        when every shard is already open. The thread logs a failure and stops; rows it did not
        fetch are fetched on demand, which raises there.
        """
        if self._prefetch and self._thread is None and len(self._maps) < len(self._locks):
            self._thread = threading.Thread(target=self._prefetch_all, name="skygreen-data-prefetch", daemon=True)
            self._thread.start()

    def _prefetch_all(self) -> None:
        try:
            self.fetch_all()
        except Exception as e:  # the reader fetches on demand and raises there
            log.warning("data prefetch stopped: %s", e)

    def _open(self, shard: int) -> tuple[np.ndarray, ...]:
        with self._locks[shard]:
            arrays = self._maps.get(shard)
            if arrays is None:
                files = self.manifest["shards"][shard]["files"]
                arrays = tuple(np.load(self._local(files[name]), mmap_mode="r") for name in self.fields)
                self._maps[shard] = arrays
        return arrays

    def _local(self, meta: Mapping[str, Any]) -> Path:
        try:
            path = self.local_dir.joinpath(*inside_parts(meta["key"]))
        except ValueError as e:  # the manifest is the bucket's: a key must not lead out of the cache
            raise RuntimeSetupError(
                f"data {self.manifest.get('name')}: {e} (a shard key in {self.store.url}/{MANIFEST})\n"
                "  fix: delete that manifest.json so the next start prepares the data again"
            ) from None
        if path.exists() and path.stat().st_size == int(meta["size"]):
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        with temp_beside(path) as tmp:
            with open(tmp, "wb") as f:
                self.store.get_to(meta["key"], f)
            digest = sha256_file(Path(tmp))
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


def _row(array: np.ndarray, row: int) -> np.ndarray:
    """Return a copy of one row, with token ids stored as uint16/uint32 widened to int64.

    Torch's embeddings and losses take int64, and its uint16/uint32 tensors support few operations.
    """
    value = np.array(array[row])
    if value.dtype.kind == "u" and value.dtype.itemsize > 1:
        return value.astype(np.int64)
    return value
