"""Saving and loading checkpoints from the training loop (the torch side of the protocol).

`save` blocks training only while the state is copied to host memory; serialisation
(`torch.save`) and upload run on a background thread. At most one save is in flight: a save
that comes due while the previous one is still uploading first waits for it to commit, and
that wait counts in `last_save_cost_s`, so the auto interval grows until uploads keep up.

A failed background save never corrupts anything: its manifest is not written, so readers
never see it. The next `save` logs the failure and carries on (training goes on, the last
committed checkpoint stands) when the cause was transient; a permanent cause (no bucket,
access denied) or three transient failures in a row stop training with the error. `wait`
re-raises the failure of the save it waited for.

Loading trusts nothing in the bucket: a checkpoint is used only if its manifest parses and
every blob it lists matches its size and sha256; only then is it read, with
`torch.load(weights_only=True)` and nothing else that unpickles. A corrupt or partial newest
checkpoint is skipped with a warning naming it, and the previous good one is loaded.

DDP, without collectives on the background thread: every rank uploads its own blob, then a
small note (`rank<r>.json`) with the blob's size and sha256; rank 0 also uploads the shared
state, waits (with a deadline) for every rank's note, and only then writes the manifest.
On load, each rank verifies every blob the manifest lists, so all ranks reach the same answer
from the same bucket; when a process group is initialised they also agree by `all_reduce`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch

from skygreen.checkpoint.manifest import (
    SHARED_BLOB,
    STATE_KIND,
    BlobInfo,
    HashingWriter,
    Manifest,
    blob_key,
    find_blob,
    iter_manifests,
    life_blob_name,
    rank_blob_name,
)
from skygreen.checkpoint.prefetch import prefetch_dir, take_prefetched
from skygreen.checkpoint.ranged import fetch_verified
from skygreen.checkpoint.retention import first_line
from skygreen.checkpoint.store import RetryPolicy
from skygreen.errors import CheckpointError, InputError, KeyNotFoundError, StoreError, TransientStoreError
from skygreen.runtime.commits import (
    MAX_FAILED_SAVES_IN_ROW,
    CommitProtocol,
    Loaded,
    default_launch,
    synchronize_devices,
    torch_load_verified,
)
from skygreen.runtime.ranks import all_reduce
from skygreen.runtime.state import Stateful, capture
from skygreen.runtime.tensors import model_sha256, to_host
from skygreen.task.spec import HALF_PRECISIONS
from skygreen.timestamps import utc_now_iso

log = logging.getLogger("skygreen.checkpoint")

_HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
__all__ = ["MAX_FAILED_SAVES_IN_ROW", "Checkpointer", "Loaded"]


class Checkpointer(CommitProtocol):
    """Asynchronous, verified checkpoints of one run (one instance per rank).

    Saving blocks training only for the copy to host memory; serialising and uploading run in
    a background thread, and the manifest, written last, is the commit. Loading takes the
    newest checkpoint whose blobs all verify, so a save cut short by a preemption costs
    nothing but that save. The commit protocol is `skygreen.runtime.commits`'s.
    """

    def __init__(
        self,
        url: str,
        *,
        keep: int = 3,
        half_precision: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        metric_mode: str = "min",
        rank_wait_s: float = 600.0,
        retry: RetryPolicy | None = None,
        tmp_dir: str | os.PathLike[str] | None = None,
        launch: int | None = None,
    ) -> None:
        """Open the checkpoints under `url`; nothing is read or written yet.

        Args:
            url: the run's folder, `s3://`, `gs://` or `file://` (`<bucket>/<run_id>`).
            keep: committed checkpoints kept by retention (at least 2: the newest may be the
                broken one).
            half_precision: `fp16` or `bf16` to store the `model` entry's floating tensors
                in half precision; None stores them as they are.
            rank: this process's rank.
            world_size: the number of ranks; rank 0 writes the shared state and the manifest.
            metric_mode: `min` or `max`, for `keep` by best metric.
            rank_wait_s: how long rank 0 waits for the other ranks' parts before a commit fails.
            retry: the store's retry policy (default: the process's).
            tmp_dir: where blobs are staged on the way up and down (default: the system's).
            launch: this life's launch number, for the writer lease that stops an older life
                from writing over a newer one (default: `SKYGREEN_LAUNCH`; None takes no lease).

        Raises:
            SpecError: `keep` is not an integer of at least 2, or the URL is not a bucket URL.
            InputError: a bad `half_precision`, `metric_mode`, or rank outside the world.
            StoreError: the bucket's client library is not installed.
        """
        if half_precision is not None and half_precision not in HALF_PRECISIONS:
            raise InputError(
                f"checkpoint half_precision: {half_precision!r} is not one of {', '.join(HALF_PRECISIONS)} or None"
            )
        super().__init__(
            url,
            keep=keep,
            rank=rank,
            world_size=world_size,
            metric_mode=metric_mode,
            rank_wait_s=rank_wait_s,
            retry=retry,
            tmp_dir=tmp_dir,
            launch=default_launch(launch, os.environ),
        )
        self.half_precision = half_precision
        self.prefetched = prefetch_dir(url)  # setup's background download; verified before use
        self._load_errors: dict[int, str] = {}
        """Why each checkpoint skipped while loading did not load."""

    # -- saving -------------------------------------------------------------------------

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
        """Snapshot `state` (and this rank's `rank_state`) and commit them in the background.

        Waits for the previous save first. A previous save that failed on the store's
        transient errors or a rank's timeout is logged and training goes on, until
        `MAX_FAILED_SAVES_IN_ROW` (3) failed in a row: a bucket that never takes a checkpoint
        would otherwise cost the whole run's work at the next preemption.

        Args:
            step: the optimizer steps done; the checkpoint's name.
            state: name -> state dict, shared by all ranks; only rank 0's is written.
            rank_state: this rank's own state (its RNG), saved as its own blob.
            metric: the early-stopping metric at this step, for `keep` by best metric.
            meta: JSON-able facts `skygreen status` reads from the manifest without loading weights.
            pin: keep this checkpoint whatever retention says (the final one).

        Raises:
            CheckpointError: after `close`, a step that is not a non-negative integer, a state
                that is not a dict or has keys other than str/int, or 3 failed saves in a row.
            StoreError: the previous save failed on a non-transient store error.
            ValueError: `meta` holds NaN or infinity; TypeError: it is not JSON-able.
            SystemExit: a newer life of the run holds the writer lease (its exit code, 3: superseded).
        """
        if self._closed:
            raise CheckpointError(f"{self.url}: save after close")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"checkpoint step must be a non-negative integer, got {step!r}")
        started = time.perf_counter()
        self._collect_previous()
        half = _HALF_DTYPES[self.half_precision] if self.half_precision else None
        shared = None
        if self.rank == 0:
            if not isinstance(state, Mapping):
                raise CheckpointError(f"checkpoint state must be a dict, got a {type(state).__name__}")
            shared = {
                k: to_host(v, path=f"state[{k!r}]", half=half if k == "model" else None) for k, v in state.items()
            }
        own = to_host(rank_state if rank_state is not None else {}, path="rank_state")
        synchronize_devices()
        meta_json = json.loads(json.dumps(meta or {}, allow_nan=False))
        if half is not None:
            meta_json.setdefault("stored_weights", self.half_precision)
        self._last_save_cost_s = time.perf_counter() - started
        self._start(step, self._write, (step, shared, own, metric, meta_json, pin), name="skygreen-checkpoint")

    def save_state(
        self,
        step: int,
        states: Mapping[str, Stateful | None],
        *,
        rank_state: dict | None = None,
        metric: float | None = None,
        meta: dict | None = None,
        pin: bool = False,
    ) -> dict[str, Any]:
        """Checkpoint a mapping of named stateful objects at `step` (torchtitan's pattern).

        Each object's `state_dict()` is taken now and snapshotted to host memory before this
        returns; serialisation and upload run in the background, as with `save`.

        Args:
            step: the optimizer steps done; the checkpoint's name.
            states: name -> object with `state_dict()`/`load_state_dict()` (model, optimizer,
                scheduler, GradScaler, `TrainingState`, ...); None values are left out. Only
                rank 0's shared state is written; every rank must call this.
            rank_state: this rank's own state (its RNG), saved as its own blob.
            metric: the early-stopping metric at this step, for `keep` by best metric.
            meta: JSON-able facts `skygreen status` reads from the manifest without loading weights.
            pin: keep this checkpoint whatever retention says (the final one).

        Returns:
            The state dict handed to the checkpointer (name -> state).

        Raises:
            CheckpointError: as for `save`: after close, a bad step, or 3 failed saves in a row.
            StoreError: the previous save failed on a non-transient store error.
            TypeError: an object in `states` has no `state_dict`/`load_state_dict`.
            SystemExit: a newer life of the run holds the writer lease.
        """
        state = capture(states)
        self.save(step, state, rank_state=rank_state, metric=metric, meta=meta, pin=pin)
        return state

    def _write(self, step: int, shared: dict | None, own: dict, metric, meta: dict, pin: bool) -> None:
        started = time.perf_counter()
        self._fence()  # a superseded life uploads nothing over a newer life's blobs
        with tempfile.TemporaryDirectory(prefix="skygreen-ckpt-", dir=self.tmp_dir) as tmp:
            own_name = life_blob_name(rank_blob_name(self.rank), self.life)
            blobs = {own_name: self._upload_blob(step, own_name, own, Path(tmp))}
            if not self._put_note(step, blobs, started):
                return
            shared_name = life_blob_name(SHARED_BLOB, self.life)
            blobs[shared_name] = self._upload_blob(step, shared_name, shared, Path(tmp))
            model_hash = (
                model_sha256(shared["model"])
                if shared is not None and isinstance(shared.get("model"), Mapping)
                else None
            )
        blobs.update(self._collect_rank_notes(step))
        manifest = Manifest(
            step=step,
            created_at=utc_now_iso(microseconds=True),
            blobs=blobs,
            model_sha256=model_hash,
            metric=None if metric is None else float(metric),
            metric_mode=self.metric_mode,
            pinned=pin,
            world_size=self.world_size,
            meta=meta,
        )
        self._commit(manifest, started)

    def _upload_blob(self, step: int, name: str, obj: Any, tmp: Path) -> BlobInfo:
        """Serialise `obj` to a temporary file (hashing on the way), then stream it up."""
        path = tmp / name
        with open(path, "wb") as raw:
            writer = HashingWriter(raw)
            torch.save(obj, cast(BinaryIO, writer))  # a file-like that hashes what passes through
            writer.flush()
        self.store.put_file(blob_key(step, name), path)
        return writer.info()

    # -- loading ------------------------------------------------------------------------

    def load_latest(self) -> Loaded | None:
        """The newest checkpoint whose blobs all verify, loaded; None when there is none.

        Call on every rank: the ranks agree on one step (the newest that loaded on all of
        them). An in-flight save is waited for first. Uncommitted step folders newer than the
        loaded step are leftovers of a life that died mid-save; rank 0 removes them so a
        rank's stale note can never be mistaken for a new one.

        Returns:
            The checkpoint, or None when no checkpoint verifies (or there is none).

        Raises:
            StoreError: the bucket cannot be listed or read.
            SystemExit: a newer life of the run holds the writer lease.
        """
        self.wait()
        bound: int | None = None
        first_round = True
        while True:
            loaded = self._load_newest(bound)
            step = loaded.step if loaded else -1
            if first_round:
                self._clear_leftovers(step)  # rank 0, this life's lease first
            first_round = False
            low = int(all_reduce([step], op="MIN", dtype=torch.int64)[0])
            high = int(all_reduce([step], op="MAX", dtype=torch.int64)[0])
            if low == high:
                self.last_committed_step = loaded.step if loaded else None
                self._remember_unloadable(step, self._load_errors, "did not verify on every rank")
                return loaded
            bound = low

    def _load_newest(self, bound: int | None) -> Loaded | None:
        for manifest in iter_manifests(self.store):
            if bound is not None and manifest.step > bound:
                continue
            try:
                return self._load(manifest)
            except TransientStoreError:
                raise
            except (CheckpointError, StoreError) as e:
                log.warning("skipping %s: %s", manifest.label, e)
                self._load_errors[manifest.step] = first_line(e)
        return None

    def _load(self, manifest: Manifest) -> Loaded:
        """Download every blob of `manifest`, check each one's size and sha256, load ours.

        Each blob is verified as it is fetched (`fetch_verified`: big ones in ranged parts,
        hashed in order as they land, so no second read) or, when setup prefetched it, before
        it is taken; only then is it read, so corrupt bytes are never handed to training, and
        `weights_only=True` keeps even unverified bytes from running code. `model_sha256` is
        not recomputed: the blob's sha256 already proves the bytes are the ones saved.
        """
        if manifest.kind != STATE_KIND:
            raise CheckpointError(f"a {manifest.kind} checkpoint (a trainer's files), not the runtime's own state")
        if manifest.layout != "full":
            raise CheckpointError(
                f"written by an FSDP run (layout {manifest.layout!r}); a model wrapped with fully_shard loads it"
            )
        shared_name = find_blob(manifest.blobs, SHARED_BLOB) or SHARED_BLOB  # a life's own name, or the plain one
        own_name = find_blob(manifest.blobs, rank_blob_name(self.rank))
        kept = self._keep_restored()
        with tempfile.TemporaryDirectory(prefix="skygreen-load-", dir=self.tmp_dir) as tmp:
            folder = kept or Path(tmp)
            paths = {name: self._fetch(manifest, name, folder) for name in sorted(manifest.blobs)}
            state = torch_load_verified(paths[shared_name], manifest, shared_name)
            rank_state = torch_load_verified(paths[own_name], manifest, own_name) if own_name is not None else None
        if kept is not None:
            self._restored = {blob_key(manifest.step, name): path for name, path in paths.items()}
        if rank_state is None and self.world_size > 1:
            log.warning(
                "%s has no state for rank %d (saved with %d ranks)", manifest.label, self.rank, manifest.world_size
            )
        return Loaded(step=manifest.step, state=state, rank_state=rank_state, manifest=manifest)

    def _fetch(self, manifest: Manifest, name: str, tmp: Path) -> Path:
        path = tmp / name
        if take_prefetched(self.prefetched, manifest, name, path):
            return path
        try:
            fetch_verified(self.store, blob_key(manifest.step, name), path, manifest.blobs[name])
        except KeyNotFoundError as e:
            raise CheckpointError(f"{name} is missing") from e
        return path
