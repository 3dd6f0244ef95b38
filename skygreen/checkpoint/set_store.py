"""A bucket set as one `Store`: writes go to the bucket nearest the VM, reads see every bucket.

Opened by `skygreen.checkpoint.store_factory.open_store` for a set's URL
(`skygreen.checkpoint.bucket_set`), so the checkpointer, the ledger, retention and every laptop
command work on a set as on one bucket:

- **Writes** (`put`, `put_file`) go to the *near* bucket: the one nearest the VM's place.
- **Reads** (`get`, `get_to`, `get_range`, `size`) take the near bucket's copy first, then the
  other buckets in their order. `list` and `exists` see the union, so a restore takes the newest
  manifest of all the buckets whose blobs verify, wherever each blob is.
- **Deletes** remove the key from every bucket: retention, garbage collection and `cancel`
  work across the set.
- **The writer lease lives in the home bucket** (the first listed), whatever the VM's place:
  every life of a run takes, checks and loses the one `lease.json` there
  (`skygreen.checkpoint.lease`), so fencing stays one compare on one object and there is one
  writer per run, as with a single bucket. The price is one small cross-place read per commit
  and retention pass for a VM far from the home bucket. Checking a fence in every bucket
  instead would race: two lives could each win a different bucket's lease.
- **A changeover copies once** (`settle`): after a restore from another place's bucket, the
  loaded commit's files and then its manifest are copied into the near bucket, manifest last,
  so the next restore here reads local bytes and a crash mid-copy leaves no manifest without
  its blobs.

A key that one life rewrites (its ledger segment, its rank notes) is always written by that
life to its own near bucket; a key rewritten by different lives (only the lease) lives in the
home bucket alone. So a reader never prefers a stale copy over a newer one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from skygreen.checkpoint.bucket_set import Member
from skygreen.checkpoint.lease import LEASE_KEY
from skygreen.checkpoint.store import Store
from skygreen.errors import KeyNotFoundError, StoreError


def is_lease_key(key: str) -> bool:
    """Whether `key` is a run's writer lease (at the store's root or under a run's folder)."""
    return key == LEASE_KEY or key.endswith("/" + LEASE_KEY)


class SetStore:
    """The buckets of a set as one store (module docstring).

    Args:
        url: the set's URL (`buckets://{...}/PATH`), as the run's record keeps it.
        stores: each member with its opened store, in the set's order (the first is home).
        near: the member the VM commits to (`skygreen.checkpoint.bucket_set.nearest`).
    """

    def __init__(self, url: str, stores: Sequence[tuple[Member, Store]], *, near: Member) -> None:
        if not stores:
            raise StoreError(f"{url}: a bucket set has at least one bucket")
        self.url = url
        self.members = tuple(m for m, _ in stores)
        self.stores = tuple(s for _, s in stores)
        self.near = near
        index = self.members.index(near)
        self._near_store = self.stores[index]
        self._home_store = self.stores[0]
        self._read_order = (self._near_store, *(s for i, s in enumerate(self.stores) if i != index))
        self._holders: dict[str, Store] = {}
        """Key -> the store a read found it in, so a ranged download's many parts ask once."""

    @property
    def near_store(self) -> Store:
        """The store of the near bucket, where this process writes."""
        return self._near_store

    def with_stores(self, wrap: object) -> SetStore:
        """The same set with each member's store passed through `wrap` (a callable), e.g. to count
        each bucket's bytes under its own name (`skygreen.checkpoint.traffic.counted`)."""
        assert callable(wrap)
        return SetStore(
            self.url, [(m, wrap(s)) for m, s in zip(self.members, self.stores, strict=True)], near=self.near
        )

    def _writer(self, key: str) -> Store:
        return self._home_store if is_lease_key(key) else self._near_store

    def _readers(self, key: str) -> tuple[Store, ...]:
        return (self._home_store,) if is_lease_key(key) else self._read_order

    def holder(self, key: str) -> Store:
        """The store whose copy of `key` a read takes: the near one's, else the first other's.

        Raises:
            KeyNotFoundError: no bucket of the set holds it.
        """
        known = self._holders.get(key)
        if known is not None:
            return known
        for store in self._readers(key):
            if store.exists(key):
                self._holders[key] = store
                return store
        raise KeyNotFoundError(f"{self.url}: no bucket of the set holds {key}")

    def put(self, key: str, data: bytes | BinaryIO) -> None:
        """`Store.put` into the near bucket (the lease: the home bucket)."""
        self._holders.pop(key, None)
        self._writer(key).put(key, data)

    def put_file(self, key: str, path: str | os.PathLike[str]) -> None:
        """`Store.put_file` into the near bucket."""
        self._holders.pop(key, None)
        self._writer(key).put_file(key, path)

    def get(self, key: str) -> bytes:
        """`Store.get` from the nearest bucket that holds the key."""
        for store in self._readers(key):
            try:
                return store.get(key)
            except KeyNotFoundError:
                continue
        raise KeyNotFoundError(f"{self.url}: no bucket of the set holds {key}")

    def get_to(self, key: str, fileobj: BinaryIO) -> None:
        """`Store.get_to` from the nearest bucket that holds the key."""
        self.holder(key).get_to(key, fileobj)

    def get_range(self, key: str, start: int, stop: int) -> bytes:
        """`RangedStore.get_range` from the nearest bucket that holds the key."""
        store = self.holder(key)
        reader = getattr(store, "get_range", None)
        if reader is None:  # a local directory in a set (tests, a laptop): read it whole
            return store.get(key)[start:stop]
        data: bytes = reader(key, start, stop)
        return data

    def list(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` in any bucket of the set, sorted, each once."""
        keys: set[str] = set()
        for store in self.stores:
            keys.update(store.list(prefix))
        return sorted(keys)

    def delete(self, key: str) -> None:
        """`Store.delete` in every bucket of the set."""
        self._holders.pop(key, None)
        for store in self.stores:
            store.delete(key)

    def exists(self, key: str) -> bool:
        """Whether any bucket of the set holds `key`."""
        return any(store.exists(key) for store in self._readers(key))

    def size(self, key: str) -> int:
        """`Store.size` of the copy a read takes."""
        return self.holder(key).size(key)

    def storage_class(self, key: str) -> str | None:
        """`Store.storage_class` of the copy a read takes."""
        return self.holder(key).storage_class(key)

    def set_storage_class(self, key: str, storage_class: str) -> None:
        """`Store.set_storage_class` in every bucket holding the key."""
        for store in self.stores:
            if store.exists(key):
                store.set_storage_class(key, storage_class)

    def settle(self, keys: Sequence[str], manifest: str, *, local: Mapping[str, Path] | None = None) -> int:
        """Copy a commit the near bucket lacks into it: `keys` first, `manifest` last (the commit).

        Args:
            keys: the commit's blob keys.
            manifest: its manifest's key.
            local: blob key -> the verified file a restore already fetched: uploaded from there,
                so the far bucket is read once per changeover; the others are read again.

        Returns:
            The bytes copied (0 when the near bucket holds the commit already).
        """
        near = self._near_store
        if near.exists(manifest):
            return 0
        copied = 0
        local = local or {}
        for key in [*(k for k in keys if k != manifest), manifest]:
            if key != manifest and near.exists(key):
                continue
            if key in local and local[key].is_file():
                near.put_file(key, local[key])
                copied += local[key].stat().st_size
                self._holders[key] = near
                continue
            with tempfile.NamedTemporaryFile(prefix="skygreen-settle-") as spool:  # a blob may not fit in memory
                self.holder(key).get_to(key, spool)  # type: ignore[arg-type]
                spool.flush()
                near.put_file(key, spool.name)
                copied += spool.tell()
            self._holders[key] = near
        return copied

    def __repr__(self) -> str:
        return f"SetStore({self.url!r}, near={self.near.key!r})"


def settle(store: Store, keys: Sequence[str], manifest: str, *, local: Mapping[str, Path] | None = None) -> int:
    """`SetStore.settle` where `store` is a set (under a counting wrapper or not); 0 otherwise."""
    inner = getattr(store, "inner", store)
    return inner.settle(keys, manifest, local=local) if isinstance(inner, SetStore) else 0
