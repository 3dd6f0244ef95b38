"""DCP's files for `skygreen.runtime.sharded`: a state split into tensors (for DCP) and the rest
(for `shared.pt`), DCP's reader restricted to what skygreen verified and can read without
unpickling, the test-only hold inside an upload, and the small pieces around them.

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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType
from torch.distributed.tensor import DTensor

from skygreen.errors import CheckpointError, InputError

log = logging.getLogger("skygreen.checkpoint")

TENSOR_MARK = "__skygreen_dcp_tensor__"
"""In `shared.pt`, a tensor's place holds `{TENSOR_MARK: "<its key in DCP>"}`."""
HOLD_UPLOAD_ENV = "SKYGREEN_TEST_HOLD_UPLOAD"
"""Tests: `STEP:RANKS:DIR`, e.g. `4:0,1:/tmp/x`: those ranks stop inside the upload of step STEP,
after their files are up and before their note, write `DIR/upload-STEP-rank<r>` (holding the
process id) and wait to be killed. `skygreen up` never renders it."""


# ---------------------------------------------------------------------------------------
# Splitting a state into tensors (for DCP) and the rest (for shared.pt)


def split_tensors(state: Any, *, path: str = "", sharded_only: bool = False) -> tuple[Any, dict[str, torch.Tensor]]:
    """(skeleton, tensors): `state` with each tensor replaced by a placeholder naming its key,
    and those tensors (DTensor shards included, not copied) by key, for DCP.

    Keys are the path of the tensor in the state, joined with dots (`model.0.weight`,
    `optimizer.state.0.weight.exp_avg`): the same key on every rank and at every world size.

    With `sharded_only`, only DTensors go to DCP and plain tensors stay in the skeleton. Under
    FSDP2 a plain tensor (a buffer, an optimizer's step count) is the same on every rank; DCP
    would keep one copy of it in whichever rank's file its load balancing picks, so every rank
    would need every rank's file to resume. In `shared.pt`, which every rank reads anyway, a
    rank needs only the files that hold its own shards.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(obj: Any, where: str) -> Any:
        if isinstance(obj, torch.Tensor) and not (sharded_only and not isinstance(obj, DTensor)):
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


def planned_files(metadata: Any, into: Mapping[str, torch.Tensor]) -> set[str]:
    """DCP's files (`__0_0.distcp`, ...) that loading `into` will read: the files holding the
    saved chunks that overlap this rank's own slice of each tensor, at any world size.

    This is DCP's own local plan (`DefaultLoadPlanner`, the planner `dcp.load` uses): each read
    item names a stored chunk, and `metadata.storage_data` names the file that holds it. A
    rank's local plan depends only on its own tensors and the metadata (the global step of a
    load changes nothing), so it can be made before any file is fetched, with no collective.

    Raises:
        CheckpointError: the metadata cannot serve these tensors (a key or shape it lacks).
    """
    planner = DefaultLoadPlanner()
    try:
        planner.set_up_planner(dict(into), metadata, is_coordinator=False)
        plan = planner.create_local_plan()
        return {metadata.storage_data[item.storage_index].relative_path for item in plan.items}
    except (Exception, CheckpointException) as e:  # DCP raises RuntimeError, KeyError, ... for a mismatch
        raise CheckpointError(f"DCP cannot plan loading this run's state from it: {e}") from e


class VerifiedReader(dcp.FileSystemReader):
    """DCP's file reader over verified files: metadata through the restricted unpickler, tensor
    data through `torch.load(weights_only=True)` (DCP's own), pickled objects refused, and a read
    from any file not in `verified` refused (a plan that differs from `planned_files`'s can never
    read a file this rank did not check)."""

    def __init__(self, path: str | os.PathLike[str], *, verified: set[str] | frozenset[str] | None = None) -> None:
        super().__init__(path)
        self.verified = None if verified is None else frozenset(verified)

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
            if self.verified is not None:
                name = self.storage_data[item.storage_index].relative_path
                if name not in self.verified:
                    raise CheckpointError(
                        f"checkpoint item {item.dest_index.fqn!r} is in {name}, which was not verified"
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
