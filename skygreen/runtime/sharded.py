"""Sharded, asynchronous, verified checkpoints of FSDP2 runs, through skygreen's `Store`.

A model sharded with `fully_shard` holds on each rank only its slice of the weights and of the
optimizer's states; no rank can `torch.save` the whole. `torch.distributed.checkpoint` (DCP)
writes each rank's slices, plus an index (`.metadata`) of which slice of which tensor sits in
which file at which offset. The index is what lets a checkpoint saved by N ranks load into M:
every rank asks DCP for the slices its own sharding needs and DCP reads them wherever they are.

How a save works, and why:

- **Local staging, then per-rank parallel uploads** (not a DCP `StorageWriter` on the Store):
  DCP's `FileSystemWriter` already lays the shards out, writes in parallel and is what DCP is
  tested with; a file on local disk is what every Store uploads fastest (`put_file`: multipart
  with parallel parts) and can re-send after a transient error, which a stream cannot. Each
  rank stages into its own directory, so ranks on different hosts need no shared disk.
- **Asynchronous**: `save` blocks only while every tensor is copied (this rank's local shards
  only) to host memory; `dcp.save` to the staging directory, hashing and uploading run on a
  background thread. Training goes on during the upload. DCP's planning needs collectives;
  those run on a process group of their own (gloo, created once), so they never interleave
  with the training loop's collectives on the default group (the approach of torchtitan's
  asynchronous checkpoints).
- **The manifest is the commit**, written last by rank 0, exactly as for DDP
  (`skygreen.runtime.checkpointer`): each rank uploads its files, then its note
  (`rank<r>.json`: every file's size and sha256); rank 0 waits for every note, then writes the
  manifest listing every file of every rank with its sha256, marked `layout: "sharded-dcp"`.
  A rank that dies mid-save never writes its note: no manifest, the step does not exist.
- **What is not a tensor** (progress, counters, batch shape, the scheduler, optimizer
  hyper-parameters) goes into `shared.pt` with a placeholder where each tensor was; DCP holds
  tensors only. Each rank's own RNG goes into `rank<r>.pt`, as for DDP.

Loading trusts nothing it did not verify, and unpickles nothing from the bucket:

- every file the manifest lists is downloaded and checked against its size and sha256 before
  any of it is read; every rank checks, and the ranks agree (all-reduce) before DCP reads;
- DCP's `.metadata` is a pickle, and `FileSystemReader` unpickles it with `pickle.load`. A
  sha256 proves only that the bytes are those rank 0 wrote to the manifest, and whoever can
  write the bucket can write a manifest too; so `.metadata` is read by a restricted unpickler
  that resolves only DCP's own metadata classes, `torch.Size`, dtypes and layouts, and refuses
  any other global (`os.system`, `builtins.eval`, ...) before it can be called;
- tensor data is read by DCP with `torch.load(weights_only=True)`; DCP's other item kind, a
  pickled object (`BYTE_IO`, `torch.load(weights_only=False)`), is never written by skygreen
  and refused on read; `shared.pt` and `rank<r>.pt` load with `weights_only=True`.

Layout (file names have no slash, like every step folder's):

    ckpt/<step:012d>/dcp.metadata            DCP's index of every shard (rank 0)
    ckpt/<step:012d>/dcp__<r>_<i>.distcp     rank r's shards
    ckpt/<step:012d>/shared.pt               the non-tensor state (rank 0)
    ckpt/<step:012d>/rank<r:05d>.pt          rank r's own state (RNG)
    ckpt/<step:012d>/rank<r:05d>.json        rank r's note
    ckpt/<step:012d>/manifest.json           the commit (rank 0, last)
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadItemType

from skygreen.checkpoint.keep import check_keep
from skygreen.checkpoint.manifest import (
    CKPT_DIR,
    MANIFEST_NAME,
    METRIC_MODES,
    SHARED_BLOB,
    BlobInfo,
    Manifest,
    blob_key,
    committed_steps,
    delete_step,
    iter_manifests,
    manifest_key,
    rank_blob_name,
    rank_note_name,
    step_folders,
    step_prefix,
)
from skygreen.checkpoint.retention import apply_retention
from skygreen.checkpoint.store import RetryPolicy, Store
from skygreen.checkpoint.stores import open_store
from skygreen.errors import (
    CheckpointError,
    InputError,
    KeyNotFoundError,
    RankTimeoutError,
    StoreError,
    TransientStoreError,
)
from skygreen.runtime.checkpointer import MAX_FAILED_SAVES_IN_ROW, Loaded, _note, _read_note
from skygreen.runtime.ranks import all_reduce, distributed
from skygreen.runtime.tensors import to_host
from skygreen.timestamps import utc_now_iso

log = logging.getLogger("skygreen.checkpoint")

LAYOUT = "sharded-dcp"
"""The manifest's `layout` for checkpoints written here."""
DCP_PREFIX = "dcp"
"""Blob names of DCP's files: `dcp` + DCP's own file name (`dcp.metadata`, `dcp__0_0.distcp`)."""
TENSOR_MARK = "__skygreen_dcp_tensor__"
"""In `shared.pt`, a tensor's place holds `{TENSOR_MARK: "<its key in DCP>"}`."""
HOLD_UPLOAD_ENV = "SKYGREEN_TEST_HOLD_UPLOAD"
"""Tests: `STEP:RANKS:DIR`, e.g. `4:0,1:/tmp/x`: those ranks stop inside the upload of step STEP,
after their files are up and before their note, write `DIR/upload-STEP-rank<r>` (holding the
process id) and wait to be killed. `skygreen up` never renders it."""

_NOTE_POLL_S = 0.2
_UPLOAD_THREADS = 4
_HASH_CHUNK_BYTES = 8 * 1024 * 1024


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


# ---------------------------------------------------------------------------------------
# The checkpointer


class ShardedCheckpointer:
    """Asynchronous, verified, resharding checkpoints of one FSDP2 run (one instance per rank).

    The same surface as `skygreen.runtime.checkpointer.Checkpointer` (`save`, `wait`,
    `close`, `load_latest`, `last_save_cost_s`, `last_upload_s`), so `Run` drives either.

    Args:
        url: the run's checkpoint URL (`s3://`, `gs://`, `file://` or a path).
        template: returns this run's current state (sharded as the run now is); `load_latest`
            loads into its tensors, which is how a checkpoint reshards to this world size.
        keep: committed checkpoints to keep.
        rank: this process's rank.
        world_size: the number of ranks.
        metric_mode: whether a lower ("min") or higher ("max") metric is better.
        rank_wait_s: how long rank 0 waits for the other ranks' notes (and the checkpoint
            group's collectives wait for a rank) before the save fails.
        retry: the store's retry policy.
        tmp_dir: where staging and downloads go (the system's temporary folder by default).
        environ: the environment (for the test-only upload hold).

    Raises:
        InputError: a bad `keep`, `rank`/`world_size` or `metric_mode`.
    """

    def __init__(
        self,
        url: str,
        *,
        template: Callable[[], dict],
        keep: int = 3,
        rank: int = 0,
        world_size: int = 1,
        metric_mode: str = "min",
        rank_wait_s: float = 600.0,
        retry: RetryPolicy | None = None,
        tmp_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        check_keep(keep, "checkpoint keep")
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise InputError(
                f"checkpoint rank/world_size: need 0 <= rank < world_size, got rank={rank!r} world_size={world_size!r}"
            )
        if metric_mode not in METRIC_MODES:
            raise InputError(f"checkpoint metric_mode: {metric_mode!r} is not one of {', '.join(METRIC_MODES)}")
        self.url = url
        self.store: Store = open_store(url, retry=retry)
        self.template = template
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.metric_mode = metric_mode
        self.rank_wait_s = rank_wait_s
        self.tmp_dir = tmp_dir
        self.hold = UploadHold.from_env(os.environ if environ is None else environ)
        self._group: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._failed_in_row = 0
        self._closed = False
        self.last_committed_step: int | None = None
        self._last_save_cost_s: float | None = None
        self.last_upload_s: float | None = None
        self.last_stage_s: float | None = None
        """Seconds the last `save` spent copying tensors to host memory (the staging copy)."""
        self._unloadable: dict[int, str] = {}

    # -- saving -------------------------------------------------------------------------

    @property
    def last_save_cost_s(self) -> float | None:
        """Seconds the last `save` blocked training (staging copy + waiting for the previous)."""
        return self._last_save_cost_s

    @property
    def in_flight(self) -> bool:
        """Whether a background save is still running."""
        return self._thread is not None and self._thread.is_alive()

    def save(
        self,
        step: int,
        state: dict,
        *,
        rank_state: dict | None = None,
        metric: float | None = None,
        meta: dict | None = None,
        pin: bool = False,
    ) -> None:
        """Stage this rank's shards of `state` (and its `rank_state`) to host memory, then write,
        upload and commit them in the background. Call on every rank at the same step.

        Raises:
            CheckpointError: a bad step or state, a save after `close`, or too many failed saves.
        """
        if self._closed:
            raise CheckpointError(f"{self.url}: save after close")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"checkpoint step must be a non-negative integer, got {step!r}")
        if not isinstance(state, Mapping):
            raise CheckpointError(f"checkpoint state must be a dict, got a {type(state).__name__}")
        started = time.perf_counter()
        self._collect_previous()
        group = self._checkpoint_group()
        waited = time.perf_counter()
        skeleton, tensors = split_tensors(state)
        staged = stage_tensors(tensors)
        _synchronize_devices()
        skeleton = to_host(skeleton, path="state")
        own = to_host(rank_state if rank_state is not None else {}, path="rank_state")
        meta_json = dict(meta or {})
        self.last_stage_s = time.perf_counter() - waited
        self._last_save_cost_s = time.perf_counter() - started
        self._thread = threading.Thread(
            target=self._write_guarded,
            args=(step, staged, skeleton, own, group, metric, meta_json, pin),
            name=f"skygreen-sharded-checkpoint-{step}",
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until the in-flight save committed; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Finish the in-flight save (re-raising its error) and refuse further saves."""
        try:
            self.wait()
        finally:
            self._closed = True

    def __enter__(self) -> ShardedCheckpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _checkpoint_group(self) -> Any:
        """The gloo group the background thread's collectives use (None when alone).

        Created on the main thread, at the same point on every rank (creating a group is
        itself a collective)."""
        if self._group is None and distributed():
            import datetime

            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.rank_wait_s))
        return self._group

    def _collect_previous(self) -> None:
        try:
            self.wait()
        except (TransientStoreError, RankTimeoutError) as e:
            if self._failed_in_row >= MAX_FAILED_SAVES_IN_ROW:
                raise CheckpointError(
                    f"{self.url}: {self._failed_in_row} checkpoints in a row failed to commit; last error: {e}\n"
                    f"  the last committed checkpoint is step {self.last_committed_step}; check the bucket's health"
                ) from e
            log.warning(
                "checkpoint was not committed (%s); training goes on, the next save tries again; "
                "last committed step: %s",
                e,
                self.last_committed_step,
            )

    def _write_guarded(self, *args: Any) -> None:
        try:
            self._write(*args)
        except BaseException as e:  # surfaced by wait()/save(); never lost in the thread
            self._failed_in_row += 1
            self._error = e

    def _write(
        self,
        step: int,
        staged: dict[str, torch.Tensor],
        skeleton: Any,
        own: dict,
        group: Any,
        metric: float | None,
        meta: dict,
        pin: bool,
    ) -> None:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="skygreen-dcp-", dir=self.tmp_dir) as tmp:
            stage = Path(tmp) / f"rank{self.rank}"
            writer = dcp.FileSystemWriter(stage, sync_files=False)
            dcp.save(staged, storage_writer=writer, process_group=group, no_dist=group is None)
            del staged
            files = {DCP_PREFIX + p.name: p for p in sorted(stage.iterdir()) if p.is_file()}
            files[rank_blob_name(self.rank)] = _torch_save(own, Path(tmp) / rank_blob_name(self.rank))
            if self.rank == 0:
                files[SHARED_BLOB] = _torch_save(skeleton, Path(tmp) / SHARED_BLOB)
            blobs = self._upload_all(step, files)
            if self.hold is not None:
                self.hold.wait_if_due(step, self.rank)
        self.store.put(blob_key(step, rank_note_name(self.rank)), _note(step, self.rank, blobs))
        if self.rank != 0:
            self.last_upload_s = time.perf_counter() - started
            self._failed_in_row = 0
            return
        blobs.update(self._collect_rank_notes(step))
        manifest = Manifest(
            step=step,
            created_at=utc_now_iso(microseconds=True),
            blobs=blobs,
            metric=None if metric is None else float(metric),
            metric_mode=self.metric_mode,
            pinned=pin,
            world_size=self.world_size,
            layout=LAYOUT,
            meta=meta,
        )
        self.store.put(manifest_key(step), manifest.dumps())
        self.last_committed_step = step
        self._failed_in_row = 0
        self.last_upload_s = time.perf_counter() - started
        log.info(
            "sharded checkpoint step %d committed to %s (%.2f s in the background)", step, self.url, self.last_upload_s
        )
        self._unloadable.pop(step, None)
        apply_retention(self.store, keep=self.keep, committed_step=step, unloadable=self._unloadable)
        self._unloadable = {}

    def _upload_all(self, step: int, files: Mapping[str, Path]) -> dict[str, BlobInfo]:
        """Hash and upload this rank's files, several at once; their sizes and sha256s."""

        def one(name: str) -> BlobInfo:
            info = _file_info(files[name])
            self.store.put_file(blob_key(step, name), files[name])
            return info

        with ThreadPoolExecutor(max_workers=_UPLOAD_THREADS, thread_name_prefix="skygreen-upload") as pool:
            futures = {name: pool.submit(one, name) for name in files}
            return {name: f.result() for name, f in futures.items()}

    def _collect_rank_notes(self, step: int) -> dict[str, BlobInfo]:
        pending = set(range(1, self.world_size))
        found: dict[str, BlobInfo] = {}
        deadline = time.monotonic() + self.rank_wait_s
        while pending:
            for rank in sorted(pending):
                try:
                    raw = self.store.get(blob_key(step, rank_note_name(rank)))
                except KeyNotFoundError:
                    continue
                found.update(_read_note(raw, step, rank, self.url))
                pending.discard(rank)
            if pending and time.monotonic() > deadline:
                raise RankTimeoutError(
                    f"{self.url}: checkpoint step {step} not committed: rank(s) "
                    f"{', '.join(map(str, sorted(pending)))} did not upload their part within {self.rank_wait_s:g} s"
                )
            if pending:
                time.sleep(_NOTE_POLL_S)
        return found

    # -- loading ------------------------------------------------------------------------

    def load_latest(self) -> Loaded | None:
        """The newest checkpoint that verifies on every rank, resharded into this run's layout;
        None when there is none. Call on every rank (collectives), not while a save is in flight.

        Older commits are tried in turn when a newer one fails anywhere; rank 0 removes
        uncommitted step folders newer than the one loaded (leftovers of a life that died mid-save).
        """
        self.wait()
        errors: dict[int, str] = {}
        loaded: Loaded | None = None
        for manifest in iter_manifests(self.store):
            problem = self._fetch_and_verify(manifest)
            ok = int(all_reduce([int(problem is None)], op="MIN", dtype=torch.int64)[0])
            if ok:
                try:
                    loaded = self._read(manifest)
                    break
                except CheckpointError as e:
                    problem = str(e)
                finally:
                    self._discard_download()
            else:
                self._discard_download()
            problem = problem or "did not verify on every rank"
            log.warning("skipping %s: %s", manifest.label, problem)
            errors[manifest.step] = problem.splitlines()[0]
        step = loaded.step if loaded else -1
        if self.rank == 0:
            self._remove_uncommitted_after(step)
            self._unloadable = {s: errors.get(s, "did not load") for s in committed_steps(self.store) if s > step}
        self.last_committed_step = loaded.step if loaded else None
        return loaded

    _download: tempfile.TemporaryDirectory | None = None

    def _fetch_and_verify(self, manifest: Manifest) -> str | None:
        """Download every file of `manifest` into a fresh folder, checking each; the problem, or None."""
        if manifest.layout != LAYOUT:
            return f"written by a DDP run (layout {manifest.layout!r}), not sharded"
        self._download = tempfile.TemporaryDirectory(prefix="skygreen-dcp-load-", dir=self.tmp_dir)
        folder = Path(self._download.name)
        (folder / DCP_PREFIX).mkdir()

        def one(name: str) -> str | None:
            local = folder / DCP_PREFIX / name[len(DCP_PREFIX) :] if name.startswith(DCP_PREFIX) else folder / name
            with open(local, "wb") as out:
                try:
                    self.store.get_to(blob_key(manifest.step, name), out)
                except KeyNotFoundError:
                    return f"{name} is missing"
            got, want = _file_info(local), manifest.blobs[name]
            if got != want:
                return (
                    f"{name} does not match the manifest (size {got.size} vs {want.size}, "
                    f"sha256 {got.sha256[:12]}... vs {want.sha256[:12]}...): corrupt or partial"
                )
            return None

        try:
            with ThreadPoolExecutor(max_workers=_UPLOAD_THREADS, thread_name_prefix="skygreen-fetch") as pool:
                problems = [p for p in pool.map(one, sorted(manifest.blobs)) if p]
        except TransientStoreError:
            raise
        except StoreError as e:
            return str(e)
        if DCP_PREFIX + ".metadata" not in manifest.blobs:
            problems.append("dcp.metadata is not in the manifest")
        if not problems:
            try:  # refused here, on every rank alike, before DCP's collectives start
                read_dcp_metadata((folder / DCP_PREFIX / ".metadata").read_bytes(), where="dcp.metadata")
            except CheckpointError as e:
                problems.append(str(e))
        return "; ".join(problems) or None

    def _discard_download(self) -> None:
        if self._download is not None:
            self._download.cleanup()
            self._download = None

    def _read(self, manifest: Manifest) -> Loaded:
        """DCP-load the verified files into this run's current state (resharding it)."""
        assert self._download is not None
        folder = Path(self._download.name)
        skeleton = _torch_load(folder / SHARED_BLOB, manifest, SHARED_BLOB)
        own_path = folder / rank_blob_name(self.rank)
        rank_state = _torch_load(own_path, manifest, own_path.name) if own_path.exists() else None
        _, targets = split_tensors(self.template())
        wanted = _placeholders(skeleton)
        missing = sorted(set(wanted) - set(targets))
        if missing:
            raise CheckpointError(f"{manifest.label}: this run's state has no {', '.join(missing[:3])}")
        # fresh tensors of this run's layout: a failed load leaves the live state alone
        into = {key: targets[key].detach().clone() for key in wanted}
        try:
            group = self._checkpoint_group()
            dcp.load(
                into, storage_reader=VerifiedReader(folder / DCP_PREFIX), process_group=group, no_dist=group is None
            )
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as e:  # DCP raises CheckpointException on every rank alike
            raise CheckpointError(f"{manifest.label}: verified but DCP cannot load it into this run: {e}") from e
        state = join_tensors(skeleton, into)
        if rank_state is None and self.world_size > 1:
            log.warning(
                "%s has no state for rank %d (saved with %d ranks); its random streams restart",
                manifest.label,
                self.rank,
                manifest.world_size,
            )
        return Loaded(step=manifest.step, state=state, rank_state=rank_state, manifest=manifest)

    def _remove_uncommitted_after(self, step: int) -> None:
        folders = step_folders(self.store.list(CKPT_DIR + "/"))
        for stale in sorted(s for s in folders if s > step and MANIFEST_NAME not in folders[s]):
            log.info("removing uncommitted leftovers of step %d (%s)", stale, step_prefix(stale))
            delete_step(self.store, stale)


def _placeholders(skeleton: Any) -> list[str]:
    """The tensor keys a skeleton's placeholders name."""
    if isinstance(skeleton, Mapping):
        if set(skeleton) == {TENSOR_MARK}:
            return [skeleton[TENSOR_MARK]]
        return [k for v in skeleton.values() for k in _placeholders(v)]
    if isinstance(skeleton, (list, tuple)):
        return [k for v in skeleton for k in _placeholders(v)]
    return []


def _torch_save(obj: Any, path: Path) -> Path:
    torch.save(obj, path)
    return path


def _torch_load(path: Path, manifest: Manifest, name: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, ... for bad files
        raise CheckpointError(f"{manifest.label}: {name} verified but cannot be loaded safely: {e}") from e


def _file_info(path: Path) -> BlobInfo:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return BlobInfo(size=size, sha256=digest.hexdigest())


def _synchronize_devices() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
