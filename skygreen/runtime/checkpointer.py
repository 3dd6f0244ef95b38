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

import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import torch

from skygreen.checkpoint.keep import check_keep
from skygreen.checkpoint.lease import Lease, LeaseLostError, check_lease, launch_number, take_lease
from skygreen.checkpoint.manifest import (
    CKPT_DIR,
    MANIFEST_NAME,
    METRIC_MODES,
    SHARED_BLOB,
    STATE_KIND,
    BlobInfo,
    HashingWriter,
    Manifest,
    blob_key,
    committed_steps,
    delete_step,
    find_blob,
    iter_manifests,
    life_blob_name,
    life_tag,
    manifest_key,
    rank_blob_name,
    rank_note_name,
    step_folders,
    step_prefix,
)
from skygreen.checkpoint.prefetch import prefetch_dir, take_prefetched
from skygreen.checkpoint.ranged import fetch_verified
from skygreen.checkpoint.retention import apply_retention, first_line
from skygreen.checkpoint.store import RetryPolicy, Store
from skygreen.checkpoint.store_factory import open_store
from skygreen.errors import (
    CheckpointError,
    InputError,
    KeyNotFoundError,
    RankTimeoutError,
    StoreError,
    TransientStoreError,
)
from skygreen.runtime.ranks import all_reduce
from skygreen.runtime.state import Stateful, apply, capture, upgrade_layout
from skygreen.runtime.tensors import model_sha256, to_host
from skygreen.spec import HALF_PRECISIONS
from skygreen.timestamps import utc_now_iso

log = logging.getLogger("skygreen.checkpoint")

MAX_FAILED_SAVES_IN_ROW = 3
_HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_NOTE_POLL_S = 0.2


@dataclass(frozen=True, kw_only=True, slots=True)
class Loaded:
    """A checkpoint that loaded with every blob verified: its step, the state shared by all ranks,
    this rank's own state and the manifest."""

    step: int
    state: dict
    rank_state: dict | None
    """This rank's own state; None when the checkpoint has none for this rank."""
    manifest: Manifest


class Checkpointer:
    """Asynchronous, verified checkpoints of one run (one instance per rank)."""

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
        check_keep(keep, "checkpoint keep")
        if half_precision is not None and half_precision not in HALF_PRECISIONS:
            raise InputError(
                f"checkpoint half_precision: {half_precision!r} is not one of {', '.join(HALF_PRECISIONS)} or None"
            )
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise InputError(
                f"checkpoint rank/world_size: need 0 <= rank < world_size, got rank={rank!r} world_size={world_size!r}"
            )
        if metric_mode not in METRIC_MODES:
            raise InputError(f"checkpoint metric_mode: {metric_mode!r} is not one of {', '.join(METRIC_MODES)}")
        self.url = url
        self.store: Store = open_store(url, retry=retry)
        self.keep = keep
        self.half_precision = half_precision
        self.rank = rank
        self.world_size = world_size
        self.metric_mode = metric_mode
        self.rank_wait_s = rank_wait_s
        self.tmp_dir = tmp_dir
        self.prefetched = prefetch_dir(url)  # setup's background download; verified before use
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._failed_in_row = 0
        self._closed = False
        self.last_committed_step: int | None = None
        self._last_save_cost_s: float | None = None
        self.last_upload_s: float | None = None
        self._load_errors: dict[int, str] = {}
        """Why each checkpoint skipped while loading did not load."""
        self._unloadable: dict[int, str] = {}
        """Commits newer than the loaded one, for retention to quarantine after the next commit."""
        self.launch = launch if launch is not None else launch_number(os.environ)
        """This life's launch number (`SKYGREEN_LAUNCH`); None: no writer lease is taken."""
        self._lease: Lease | None = None
        self.life = life_tag(self.launch) if self.launch is not None else None
        """The name this process gives its blobs (`skygreen.checkpoint.manifest.life_tag`), so no
        other life of the run ever writes over them; None: plain names."""

    # -- saving -------------------------------------------------------------------------

    @property
    def last_save_cost_s(self) -> float | None:
        """Seconds the last `save` blocked training (copy to host + waiting for the previous)."""
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
        """Snapshot `state` (and this rank's `rank_state`) and commit them in the background."""
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
        _synchronize_devices(state)
        meta_json = json.loads(json.dumps(meta or {}, allow_nan=False))
        if half is not None:
            meta_json.setdefault("stored_weights", self.half_precision)
        self._last_save_cost_s = time.perf_counter() - started
        self._thread = threading.Thread(
            target=self._write_guarded,
            args=(step, shared, own, metric, meta_json, pin),
            name=f"skygreen-checkpoint-{step}",
        )
        self._thread.start()

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
            CheckpointError: after close, a bad step, or the earlier failed saves that stop training.
            TypeError: an object in `states` has no `state_dict`/`load_state_dict`.
        """
        state = capture(states)
        self.save(step, state, rank_state=rank_state, metric=metric, meta=meta, pin=pin)
        return state

    def restore_state(self, states: Mapping[str, Stateful | None]) -> Loaded | None:
        """Load the newest verified checkpoint into a mapping of named stateful objects.

        Every rank must call this (the ranks agree on the step). Entries the checkpoint lacks
        leave their object as it is and are logged; a checkpoint written before the training
        state was one record is read in today's layout (`skygreen.runtime.state.upgrade_layout`).

        Args:
            states: name -> object with `load_state_dict()`, as given to `save_state`.

        Returns:
            The checkpoint loaded (its state in today's layout), or None when there is none.

        Raises:
            CheckpointError: the bucket cannot be read (every checkpoint in it failing to verify
                is no error: they are skipped and None returned).
        """
        loaded = self.load_latest()
        if loaded is None:
            return None
        loaded = dataclasses.replace(loaded, state=upgrade_layout(loaded.state))
        missing = apply(states, loaded.state)
        if missing:
            log.warning("%s has no state for %s; they start fresh", loaded.manifest.label, ", ".join(missing))
        return loaded

    def wait(self) -> None:
        """Block until the in-flight save committed; re-raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if isinstance(error, LeaseLostError):
            _stop_superseded(error)
        if error is not None:
            raise error

    def close(self) -> None:
        """Finish the in-flight save (re-raising its error) and refuse further saves."""
        try:
            self.wait()
        finally:
            self._closed = True

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _collect_previous(self) -> None:
        """Wait for the previous save; decide whether its failure stops training."""
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
            return

    def _write_guarded(self, *args) -> None:
        try:
            self._write(*args)
        except BaseException as e:  # surfaced by wait()/save(); never lost in the thread
            self._failed_in_row += 1
            self._error = e

    def _write(self, step: int, shared: dict | None, own: dict, metric, meta: dict, pin: bool) -> None:
        started = time.perf_counter()
        self._fence()  # a superseded life uploads nothing over a newer life's blobs
        with tempfile.TemporaryDirectory(prefix="skygreen-ckpt-", dir=self.tmp_dir) as tmp:
            own_name = life_blob_name(rank_blob_name(self.rank), self.life)
            blobs = {own_name: self._upload_blob(step, own_name, own, Path(tmp))}
            self.store.put(blob_key(step, rank_note_name(self.rank, self.launch)), _note(step, self.rank, blobs))
            if self.rank != 0:
                self.last_upload_s = time.perf_counter() - started
                self._failed_in_row = 0
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
        self._fence()
        self.store.put(manifest_key(step), manifest.dumps())
        self.last_committed_step = step
        self._failed_in_row = 0
        self.last_upload_s = time.perf_counter() - started
        log.info("checkpoint step %d committed to %s (%.2f s in the background)", step, self.url, self.last_upload_s)
        self._unloadable.pop(step, None)  # rewritten by this life: good now
        apply_retention(self.store, keep=self.keep, committed_step=step, unloadable=self._unloadable, lease=self._lease)
        self._unloadable = {}

    def _fence(self) -> None:
        """Take this life's writer lease, or check it is still ours (`skygreen.checkpoint.lease`);
        `LeaseLostError` when a newer life holds it. Rank 0 holds it for the run; a no-op on other
        ranks and without a launch number."""
        if self.launch is None or self.rank != 0:
            return
        if self._lease is None:
            self._lease = take_lease(self.store, self.launch)
        else:
            check_lease(self.store, self._lease)

    def _upload_blob(self, step: int, name: str, obj: Any, tmp: Path) -> BlobInfo:
        """Serialise `obj` to a temporary file (hashing on the way), then stream it up."""
        path = tmp / name
        with open(path, "wb") as raw:
            writer = HashingWriter(raw)
            torch.save(obj, cast(BinaryIO, writer))  # a file-like that hashes what passes through
            writer.flush()
        self.store.put_file(blob_key(step, name), path)
        return writer.info()

    def _collect_rank_notes(self, step: int) -> dict[str, BlobInfo]:
        """Rank 0: every other rank's blob info, from its note; waits up to `rank_wait_s`."""
        pending = set(range(1, self.world_size))
        found: dict[str, BlobInfo] = {}
        deadline = time.monotonic() + self.rank_wait_s
        while pending:
            for rank in sorted(pending):
                try:
                    raw = self.store.get(blob_key(step, rank_note_name(rank, self.launch)))
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
        """The newest checkpoint whose blobs all verify, loaded; None when there is none.

        Call on every rank (not while a save is in flight). Uncommitted step folders newer
        than the loaded step are leftovers of a life that died mid-save; rank 0 removes them
        so a rank's stale note can never be mistaken for a new one.
        """
        self.wait()
        bound: int | None = None
        first_round = True
        while True:
            loaded = self._load_newest(bound)
            step = loaded.step if loaded else -1
            if first_round and self.rank == 0:
                try:
                    self._fence()  # this life's lease, before it deletes anything
                except LeaseLostError as e:
                    _stop_superseded(e)
                self._remove_uncommitted_after(step)
            first_round = False
            low = int(all_reduce([step], op="MIN", dtype=torch.int64)[0])
            high = int(all_reduce([step], op="MAX", dtype=torch.int64)[0])
            if low == high:
                self.last_committed_step = loaded.step if loaded else None
                self._remember_unloadable(step)
                return loaded
            bound = low

    def _remember_unloadable(self, loaded_step: int) -> None:
        """Every commit newer than the step the ranks agreed on failed to load somewhere;
        rank 0's retention moves them aside after its first new commit (`skygreen.checkpoint.retention`)."""
        if self.rank != 0:
            return
        newer = [s for s in committed_steps(self.store) if s > loaded_step]
        self._unloadable = {s: self._load_errors.get(s, "did not verify on every rank") for s in newer}

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
        with tempfile.TemporaryDirectory(prefix="skygreen-load-", dir=self.tmp_dir) as tmp:
            paths = {name: self._fetch(manifest, name, Path(tmp)) for name in sorted(manifest.blobs)}
            state = _torch_load(paths[shared_name], manifest, shared_name)
            rank_state = _torch_load(paths[own_name], manifest, own_name) if own_name is not None else None
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

    def _remove_uncommitted_after(self, step: int) -> None:
        folders = step_folders(self.store.list(CKPT_DIR + "/"))
        for stale in sorted(s for s in folders if s > step and MANIFEST_NAME not in folders[s]):
            log.info("removing uncommitted leftovers of step %d (%s)", stale, step_prefix(stale))
            delete_step(self.store, stale)


def _stop_superseded(error: LeaseLostError) -> None:
    """A newer life owns the bucket: say so in one line and exit with the superseded code."""
    log.error("%s", error)
    raise SystemExit(error.exit_code) from error


def _note(step: int, rank: int, blobs: Mapping[str, BlobInfo]) -> bytes:
    return json.dumps({"step": step, "rank": rank, "blobs": {n: b.to_json() for n, b in blobs.items()}}).encode()


def _read_note(raw: bytes, step: int, rank: int, url: str) -> dict[str, BlobInfo]:
    try:
        note = json.loads(raw)
        if note["step"] != step or note["rank"] != rank:
            raise ValueError(f"note is for step {note['step']} rank {note['rank']}")
        return {name: BlobInfo(size=b["size"], sha256=b["sha256"]) for name, b in note["blobs"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{url}: bad note of rank {rank} for step {step}: {e}") from e


def _torch_load(path: Path, manifest: Manifest, name: str) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, ... for bad files
        raise CheckpointError(f"{manifest.label}: {name} verified but cannot be loaded safely: {e}") from e


def _synchronize_devices(state: Any) -> None:
    """Wait for device-to-host copies; a no-op on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
