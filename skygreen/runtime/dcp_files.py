"""DCP's files for `skygreen.runtime.sharded`: a state split into tensors (for DCP) and the rest
(for `shared.pt`), DCP's reader restricted to what skygreen verified and can read without
unpickling, the test-only hold inside an upload, and the small pieces of the commit protocol around them.

Why a restricted unpickler: `FileSystemReader.read_metadata` reads `.metadata` with
`pickle.load`. The sha256 in the manifest proves only that the bytes are those rank 0 listed,
and whoever can write the bucket can write a manifest too; so the metadata is read by an
unpickler that resolves only DCP's own metadata classes, `torch.Size`, dtypes and layouts and
refuses every other global (`os.system`, `builtins.eval`, ...) before it can be called.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.planner import LoadItemType

from skygreen.checkpoint.manifest import BlobInfo, blob_key, rank_note_name
from skygreen.checkpoint.store import Store
from skygreen.errors import CheckpointError, InputError, KeyNotFoundError, RankTimeoutError
from skygreen.runtime.checkpointer import _read_note

log = logging.getLogger("skygreen.checkpoint")

TENSOR_MARK = "__skygreen_dcp_tensor__"
"""In `shared.pt`, a tensor's place holds `{TENSOR_MARK: "<its key in DCP>"}`."""
HOLD_UPLOAD_ENV = "SKYGREEN_TEST_HOLD_UPLOAD"
"""Tests: `STEP:RANKS:DIR`, e.g. `4:0,1:/tmp/x`: those ranks stop inside the upload of step STEP,
after their files are up and before their note, write `DIR/upload-STEP-rank<r>` (holding the
process id) and wait to be killed. `skygreen up` never renders it."""


# ---------------------------------------------------------------------------------------
# Splitting a state into tensors (for DCP) and the rest (for shared.pt)


def split_tensors(state: Any, *, path: str = "") -> tuple[Any, dict[str, torch.Tensor]]:
    """(skeleton, tensors): `state` with each tensor replaced by a placeholder naming its key,
    and those tensors (DTensor shards included, not copied) by key, for DCP.

    Keys are the path of the tensor in the state, joined with dots (`model.0.weight`,
    `optimizer.state.0.weight.exp_avg`): the same key on every rank and at every world size.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(obj: Any, where: str) -> Any:
        if isinstance(obj, torch.Tensor):
            tensors[where] = obj
            return {TENSOR_MARK: where}
        if isinstance(obj, Mapping):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v, f"{where}.{i}") for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(walk(v, f"{where}.{i}") for i, v in enumerate(obj))
        return obj

    return walk(state, path), tensors


def join_tensors(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The inverse of `split_tensors`: the skeleton with each placeholder replaced by its tensor.

    Raises:
        CheckpointError: a placeholder names a tensor that `tensors` lacks.
    """
    if isinstance(skeleton, Mapping):
        if set(skeleton) == {TENSOR_MARK}:
            key = skeleton[TENSOR_MARK]
            if key not in tensors:
                raise CheckpointError(f"the checkpoint holds tensor {key!r}, which this run's state lacks")
            return tensors[key]
        return {k: join_tensors(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [join_tensors(v, tensors) for v in skeleton]
    if isinstance(skeleton, tuple):
        return tuple(join_tensors(v, tensors) for v in skeleton)
    return skeleton


def stage_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host-memory copy of each tensor (a DTensor stays a DTensor of copied local shards):
    training may change the originals the moment `save` returns."""
    return {k: t.detach().to("cpu", copy=True) for k, t in tensors.items()}


# ---------------------------------------------------------------------------------------
# Reading DCP's files without unpickling anything but DCP's own metadata


_META_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED_GLOBALS = frozenset(
    {
        (_META_MODULE, "Metadata"),
        (_META_MODULE, "MetadataIndex"),
        (_META_MODULE, "ChunkStorageMetadata"),
        (_META_MODULE, "TensorStorageMetadata"),
        (_META_MODULE, "BytesStorageMetadata"),
        (_META_MODULE, "TensorProperties"),
        (_META_MODULE, "StorageMeta"),
        (_META_MODULE, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals DCP's `.metadata` needs; anything else is refused unresolved."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


def read_dcp_metadata(data: bytes, *, where: str) -> Any:
    """DCP's `Metadata` from the bytes of `.metadata`, through the restricted unpickler.

    Raises:
        CheckpointError: the bytes are no DCP metadata, or name a global it does not need.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # pickle raises many kinds for bad bytes
        raise CheckpointError(f"{where}: DCP metadata cannot be loaded safely: {e}") from e
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where}: DCP metadata is a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


class VerifiedReader(dcp.FileSystemReader):
    """DCP's file reader over verified files: metadata through the restricted unpickler, tensor
    data through `torch.load(weights_only=True)` (DCP's own), pickled objects refused."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """DCP's `Metadata` through the restricted unpickler (never `pickle.load`)."""
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = Path(self.path) / ".metadata"
        metadata = read_dcp_metadata(path.read_bytes(), where=str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        """DCP's reading of tensors (`weights_only=True`); a plan with a pickled object is refused."""
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                raise CheckpointError(
                    f"checkpoint item {item.dest_index.fqn!r} is a pickled object; skygreen never writes one "
                    "and does not unpickle them"
                )
        return super().read_data(plan, planner)


# ---------------------------------------------------------------------------------------
# The test-only hold inside an upload


@dataclass(frozen=True, kw_only=True, slots=True)
class UploadHold:
    """Where `SKYGREEN_TEST_HOLD_UPLOAD` stops an upload: a step, the ranks, the marker folder."""

    step: int
    ranks: frozenset[int]
    folder: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> UploadHold | None:
        """The hold named by the environment; None when unset.

        Raises:
            InputError: the variable is not `STEP:RANKS:DIR`.
        """
        raw = environ.get(HOLD_UPLOAD_ENV, "").strip()
        if not raw:
            return None
        try:
            step, ranks, folder = raw.split(":", 2)
            return cls(step=int(step), ranks=frozenset(int(r) for r in ranks.split(",")), folder=Path(folder))
        except ValueError as e:
            raise InputError(f"{HOLD_UPLOAD_ENV}={raw!r}: expected STEP:RANK[,RANK...]:DIR, e.g. 4:1:/tmp/x") from e

    def wait_if_due(self, step: int, rank: int) -> None:
        """At the held step on a held rank: leave the marker, then wait for the kill that must come."""
        if step != self.step or rank not in self.ranks:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"upload-{step}-rank{rank}").write_text(f"{os.getpid()}\n")
        log.warning("rank %d held inside the upload of step %d (%s); waiting to be killed", rank, step, HOLD_UPLOAD_ENV)
        while True:
            time.sleep(0.05)


def placeholders(skeleton: Any) -> list[str]:
    """The tensor keys a skeleton's placeholders name."""
    if isinstance(skeleton, Mapping):
        if set(skeleton) == {TENSOR_MARK}:
            return [skeleton[TENSOR_MARK]]
        return [k for v in skeleton.values() for k in placeholders(v)]
    if isinstance(skeleton, (list, tuple)):
        return [k for v in skeleton for k in placeholders(v)]
    return []


def torch_save_to(obj: Any, path: Path) -> Path:
    """`torch.save` to `path`; returns `path`."""
    torch.save(obj, path)
    return path


def torch_load_verified(path: Path, manifest: Any, name: str) -> Any:
    """A verified blob, with `torch.load(weights_only=True)`; a refusal is a `CheckpointError`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, ... for bad files
        raise CheckpointError(f"{manifest.label}: {name} verified but cannot be loaded safely: {e}") from e


def synchronize_devices() -> None:
    """Wait for device-to-host copies; a no-op on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


_NOTE_POLL_S = 0.2


def collect_rank_notes(store: Store, step: int, *, world_size: int, wait_s: float) -> dict[str, BlobInfo]:
    """Rank 0: every other rank's files, from its note (`rank<r>.json`); waits up to `wait_s`.

    Raises:
        RankTimeoutError: a rank's note did not come in time (the step stays uncommitted).
    """
    pending = set(range(1, world_size))
    found: dict[str, BlobInfo] = {}
    deadline = time.monotonic() + wait_s
    while pending:
        for rank in sorted(pending):
            try:
                raw = store.get(blob_key(step, rank_note_name(rank)))
            except KeyNotFoundError:
                continue
            found.update(_read_note(raw, step, rank, store.url))
            pending.discard(rank)
        if pending and time.monotonic() > deadline:
            raise RankTimeoutError(
                f"{store.url}: checkpoint step {step} not committed: rank(s) "
                f"{', '.join(map(str, sorted(pending)))} did not upload their part within {wait_s:g} s"
            )
        if pending:
            time.sleep(_NOTE_POLL_S)
    return found
