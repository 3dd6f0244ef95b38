"""The writer: rows from a preprocessing build, cut into shards and uploaded as they fill."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from skygreen.checkpoint.store import Store
from skygreen.data.cache import sha256_file, temp_beside, write_local
from skygreen.data.layout import FORMAT_VERSION, MANIFEST, NAME_PATTERN, ShardSpec
from skygreen.errors import RuntimeSetupError
from skygreen.timestamps import utc_now_iso


class ShardWriter:
    """Collects rows from `build`, cuts them into shards, uploads each shard as it fills.

    `add({"input_ids": array(n, L)})` appends n rows (every call the same fields, dtypes and
    row shapes); `add_file(name, data)` stores an extra file beside the shards. Uploading as
    shards fill keeps memory bounded by one shard, whatever the dataset's size.
    """

    def __init__(self, spec: ShardSpec, store: Store, local_dir: Path) -> None:
        """Start an empty dataset; `prepare` makes the writer and hands it to `build`.

        Args:
            spec: what is prepared (`rows_per_shard`, name, key).
            store: the dataset's folder in the bucket.
            local_dir: this machine's cache folder for it.
        """
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
        """Append a batch of rows: field name to an array whose first axis is the rows.

        The first batch fixes the fields, their dtypes and row shapes. Every full shard
        (`rows_per_shard` rows) is written to the local cache and uploaded before this returns.
        An empty mapping is ignored.

        Args:
            batch: field name -> array (or anything `np.asarray` takes) of rows.

        Raises:
            ValueError: the fields' row counts differ, or the fields, a dtype or a row shape
                differ from the first batch's.
            StoreError: a shard cannot be uploaded.
        """
        arrays = {name: np.asarray(value) for name, value in batch.items()}
        if not arrays:
            return
        counts = {len(a) for a in arrays.values()}
        if len(counts) != 1:
            sizes = {k: len(v) for k, v in arrays.items()}
            raise ValueError(f"every field of a batch needs the same number of rows, got {sizes}")
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
        """Store an extra file as `files/<name>`: written to the local cache and uploaded now.

        Adding the same name again replaces it.

        Args:
            name: a letter or digit, then letters, digits, '.', '_' or '-' (at most 81 characters).
            data: the file's bytes.

        Raises:
            ValueError: a name that does not match that pattern.
            StoreError: the file cannot be uploaded.
        """
        if not NAME_PATTERN.match(name):
            raise ValueError(f"extra file name {name!r}: letters, digits, '.', '_' or '-' only")
        key = f"files/{name}"
        path = self.local_dir / key
        path.parent.mkdir(parents=True, exist_ok=True)
        write_local(path, data)
        self.store.put(key, data)
        self.files[name] = {"key": key, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def finish(self, *, preprocess_s: float) -> dict[str, Any]:
        """Upload the last, partial shard and then the manifest, which commits the data.

        The manifest is also written to the local cache.

        Args:
            preprocess_s: seconds the build took, recorded in the manifest rounded to
                milliseconds (later starts say what they saved).

        Returns:
            The manifest, as every later start reads it back.

        Raises:
            RuntimeSetupError: the build added no rows.
            StoreError: the last shard or the manifest cannot be uploaded.
        """
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
            "created": utc_now_iso(),
        }
        body = json.dumps(manifest, indent=1, sort_keys=True).encode()
        self.store.put(MANIFEST, body)  # the commit: blobs are all up before this
        write_local(self.local_dir / MANIFEST, body)
        return json.loads(body)  # as every later start reads it: fields in name order, not `add`'s

    def _flush(self, rows: int) -> None:
        index = len(self.shards)
        entry: dict[str, Any] = {"rows": rows, "files": {}}
        for name, parts in self._pending.items():
            joined = np.concatenate(parts) if len(parts) > 1 else parts[0]
            head, rest = joined[:rows], joined[rows:]
            self._pending[name] = [rest] if len(rest) else []
            key = f"{index:05d}.{name}.npy"
            path = self.local_dir / key
            with temp_beside(path) as tmp, open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(head), allow_pickle=False)
            size, digest = path.stat().st_size, sha256_file(path)
            with path.open("rb") as f:
                self.store.put(key, f)
            entry["files"][name] = {"key": key, "size": size, "sha256": digest}
        self._pending_rows -= rows
        self.rows += rows
        self.shards.append(entry)
