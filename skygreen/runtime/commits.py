"""The commit protocol both checkpointers share.

The full checkpointer (`skygreen.runtime.checkpointer`, DDP, `torch.save` of the whole state) and
the sharded one (`skygreen.runtime.sharded`, FSDP2, DCP) both use it.

What they save differs; how a save becomes a commit, and how a load falls back, does not:

- **One save in flight, in the background.** A save that comes due while the previous one still
  uploads first waits for it (`_collect_previous`). A failure never corrupts anything, because
  nothing is committed until the manifest is; a transient one (the bucket, a rank too slow) is
  logged and training goes on, until `MAX_FAILED_SAVES_IN_ROW` in a row stop it; a permanent
  one stops it at once.
- **Rank notes, then the manifest.** Each rank uploads its files, then a note (`rank<r>.json`:
  every file's size and sha256); rank 0 waits for every note (with a deadline) and writes the
  manifest last (`_commit`), after checking the run's writer lease (`skygreen.checkpoint.lease`),
  then applies retention.
- **Loading** skips what does not verify; rank 0 then removes uncommitted step folders newer than
  the step loaded (leftovers of a life that died mid-save, whose stale notes must never be
  mistaken for new ones), and remembers the newer commits that did not load so retention can
  move them aside after its next commit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from skygreen.checkpoint.bucket_set import is_set_url
from skygreen.checkpoint.keep import check_keep
from skygreen.checkpoint.lease import Lease, LeaseLostError, check_lease, launch_number, take_lease
from skygreen.checkpoint.manifest import (
    CKPT_DIR,
    MANIFEST_NAME,
    METRIC_MODES,
    BlobInfo,
    Manifest,
    blob_key,
    committed_steps,
    delete_step,
    life_tag,
    manifest_key,
    rank_note_name,
    step_folders,
    step_prefix,
)
from skygreen.checkpoint.retention import apply_retention
from skygreen.checkpoint.set_store import settle
from skygreen.checkpoint.store import RetryPolicy, Store
from skygreen.checkpoint.store_factory import open_store
from skygreen.checkpoint.traffic import counted, note_checkpoint
from skygreen.errors import CheckpointError, InputError, KeyNotFoundError, RankTimeoutError, TransientStoreError
from skygreen.runtime.state import Stateful, apply, upgrade_layout

log = logging.getLogger("skygreen.checkpoint")

MAX_FAILED_SAVES_IN_ROW = 3
"""Transient save failures in a row that stop training (the bucket is not coming back)."""
_NOTE_POLL_S = 0.2
_Self = TypeVar("_Self", bound="CommitProtocol")


@dataclass(frozen=True, kw_only=True, slots=True)
class Loaded:
    """A checkpoint that loaded with every blob verified.

    Attributes:
        step: the optimizer steps done when it was saved.
        state: the state shared by all ranks (name -> state dict).
        manifest: the commit: step, blob sizes and sha256s, and the `meta` the run filed.
    """

    step: int
    state: dict
    rank_state: dict | None
    """This rank's own state; None when the checkpoint has none for this rank."""
    manifest: Manifest
    fetched: tuple[str, ...] | None = None
    """The blobs this rank downloaded to load it; None: every blob the manifest lists (a rank of
    a sharded run downloads only the files its own shards are in)."""


class CommitProtocol:
    """What both checkpointers do around their own saving and loading (one instance per rank).

    A subclass runs its save on the background thread as `_write` (through `_write_guarded`) and
    commits it with `_put_note` / `_commit`; it loads with `load_latest`, which calls
    `_clear_leftovers` and `_remember_unloadable` once it knows the step it loaded.

    Args:
        url: the run's checkpoint URL (`s3://`, `gs://`, `file://` or a path).
        keep: committed checkpoints to keep.
        rank: this process's rank.
        world_size: the number of ranks.
        metric_mode: whether a lower ("min") or higher ("max") metric is better.
        rank_wait_s: how long rank 0 waits for the other ranks' notes before the save fails.
        retry: the store's retry policy.
        tmp_dir: where staging and downloads go (the system's temporary folder by default).
        launch: this life's launch number for the writer lease; None takes no lease.

    Raises:
        InputError: a bad `keep`, `rank`/`world_size` or `metric_mode`.
    """

    def __init__(
        self,
        url: str,
        *,
        keep: int,
        rank: int,
        world_size: int,
        metric_mode: str,
        rank_wait_s: float,
        retry: RetryPolicy | None,
        tmp_dir: str | os.PathLike[str] | None,
        launch: int | None,
    ) -> None:
        """Check the arguments and open the run's store; the lease waits for the first save or load."""
        check_keep(keep, "checkpoint keep")
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise InputError(
                f"checkpoint rank/world_size: need 0 <= rank < world_size, got rank={rank!r} world_size={world_size!r}"
            )
        if metric_mode not in METRIC_MODES:
            raise InputError(f"checkpoint metric_mode: {metric_mode!r} is not one of {', '.join(METRIC_MODES)}")
        self.url = url
        self.store: Store = counted(open_store(url, retry=retry))
        """Counted (`skygreen.checkpoint.traffic`): the run ledger records the bytes it moved."""
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.metric_mode = metric_mode
        self.rank_wait_s = rank_wait_s
        self.tmp_dir = tmp_dir
        self.launch = launch
        """This life's launch number (`SKYGREEN_LAUNCH`); None: no writer lease is taken."""
        self.life = life_tag(launch) if launch is not None else None
        """The name this process gives its blobs (`skygreen.checkpoint.manifest.life_tag`), so no
        other life of the run ever writes over them; None: plain names."""
        self._lease: Lease | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._failed_in_row = 0
        self._closed = False
        self.last_committed_step: int | None = None
        self._last_save_cost_s: float | None = None
        self.last_upload_s: float | None = None
        self._unloadable: dict[int, str] = {}
        """Commits newer than the loaded one, for retention to quarantine after the next commit."""
        self._restored: dict[str, Path] = {}
        self._restored_dir: Path | None = None
        """Rank 0 on a bucket set: blob key -> the verified file the load fetched, kept until
        `_settle` uploads it into the near bucket (so a changeover reads the far bucket once)."""

    # -- the save in flight ---------------------------------------------------------------

    @property
    def last_save_cost_s(self) -> float | None:
        """Seconds the last `save` blocked training (copy to host + waiting for the previous)."""
        return self._last_save_cost_s

    @property
    def in_flight(self) -> bool:
        """Whether a background save is still running."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the in-flight save committed; re-raise its error if it failed.

        Raises:
            StoreError: the save failed in the store (`TransientStoreError` after its retries).
            CheckpointError: the save failed otherwise (`RankTimeoutError`: a rank's part never came).
            SystemExit: a newer life of the run took the writer lease meanwhile.
        """
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if isinstance(error, LeaseLostError):
            stop_superseded(error)
        if error is not None:
            raise error

    def close(self) -> None:
        """Finish the in-flight save and refuse further saves; a second call does nothing.

        Raises:
            StoreError: the in-flight save failed (re-raised, as by `wait`).
            CheckpointError: the same, for a failure outside the store.
        """
        try:
            self.wait()
        finally:
            self._closed = True
            self._forget_restored()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start(self, step: int, target: Any, args: tuple, *, name: str) -> None:
        """Run `target(*args)` as the background save of `step` (failures kept for `wait`)."""
        self._thread = threading.Thread(target=self._write_guarded, args=(target, *args), name=f"{name}-{step}")
        self._thread.start()

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

    def _write_guarded(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except BaseException as e:  # surfaced by wait()/save(); never lost in the thread
            self._failed_in_row += 1
            self._error = e

    # -- committing -----------------------------------------------------------------------

    def _fence(self) -> None:
        """Take this life's writer lease, or check it is still ours (`skygreen.checkpoint.lease`).

        Raises `LeaseLostError` when a newer life holds it. Rank 0 holds it for the run; a no-op
        on other ranks and without a launch number.
        """
        if self.launch is None or self.rank != 0:
            return
        if self._lease is None:
            self._lease = take_lease(self.store, self.launch)
        else:
            check_lease(self.store, self._lease)

    def _put_note(self, step: int, blobs: Mapping[str, BlobInfo], started: float) -> bool:
        """Upload this rank's note for `step`; True on rank 0, which goes on to commit.

        Another rank's part of the save ends here.
        """
        self.store.put(blob_key(step, rank_note_name(self.rank, self.launch)), note(step, self.rank, blobs))
        if self.rank == 0:
            return True
        self.last_upload_s = time.perf_counter() - started
        self._failed_in_row = 0
        return False

    def _collect_rank_notes(self, step: int) -> dict[str, BlobInfo]:
        """Rank 0: every other rank's files, from its note; waits up to `rank_wait_s`."""
        return collect_rank_notes(
            self.store, step, world_size=self.world_size, wait_s=self.rank_wait_s, launch=self.launch
        )

    def _commit(self, manifest: Manifest, started: float, *, what: str = "checkpoint") -> None:
        """Rank 0: write `manifest` (the commit) if this life still holds the lease, then retention."""
        self._fence()  # a superseded life commits nothing
        self.store.put(manifest_key(manifest.step), manifest.dumps())
        self.last_committed_step = manifest.step
        note_checkpoint(self.store, manifest.step, sum(info.size for info in manifest.blobs.values()))
        self._failed_in_row = 0
        self.last_upload_s = time.perf_counter() - started
        log.info(
            "%s step %d committed to %s (%.2f s in the background)", what, manifest.step, self.url, self.last_upload_s
        )
        self._unloadable.pop(manifest.step, None)  # rewritten by this life: good now
        apply_retention(
            self.store, keep=self.keep, committed_step=manifest.step, unloadable=self._unloadable, lease=self._lease
        )
        self._unloadable = {}

    # -- loading --------------------------------------------------------------------------

    def load_latest(self) -> Loaded | None:
        """The newest checkpoint that loads on every rank; None when there is none."""
        raise NotImplementedError

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
            StoreError: the bucket cannot be listed or read (`TransientStoreError` once retries
                ran out). Checkpoints that fail to verify or load are no error: each is skipped
                with a warning, and None is returned when none is left.
            SystemExit: a newer life of the run holds the writer lease.
        """
        loaded = self.load_latest()
        if loaded is None:
            return None
        loaded = dataclasses.replace(loaded, state=upgrade_layout(loaded.state))
        missing = apply(states, loaded.state)
        if missing:
            log.warning("%s has no state for %s; they start fresh", loaded.manifest.label, ", ".join(missing))
        return loaded

    def _clear_leftovers(self, step: int) -> None:
        """Rank 0, after a load: remove the uncommitted step folders newer than `step`.

        This life's lease is checked first (a superseded life stops here, deleting nothing);
        `step` is -1 when none was loaded.
        """
        if self.rank != 0:
            return
        try:
            self._fence()
        except LeaseLostError as e:
            stop_superseded(e)
        folders = step_folders(self.store.list(CKPT_DIR + "/"))
        for stale in sorted(s for s in folders if s > step and MANIFEST_NAME not in folders[s]):
            log.info("removing uncommitted leftovers of step %d (%s)", stale, step_prefix(stale))
            delete_step(self.store, stale)
        if step >= 0:
            self._settle(step)

    def _settle(self, step: int) -> None:
        """Copy a commit loaded from another place's bucket into the near one (a bucket set only).

        Once per changeover, its manifest last (`skygreen.checkpoint.set_store`).
        """
        if not is_set_url(self.url):
            return
        manifest = Manifest.loads(self.store.get(manifest_key(step)), where=f"{self.url} step {step}")
        keys = [blob_key(step, name) for name in manifest.blobs]
        try:
            copied = settle(self.store, keys, manifest_key(step), local=self._restored)
        finally:
            self._forget_restored()
        if copied:
            log.info("copied checkpoint step %d (%d bytes) into this place's bucket", step, copied)

    def _keep_restored(self) -> Path | None:
        """A folder for the blobs a load fetches that outlives the load; None where unneeded.

        Rank 0 on a bucket set keeps them for `_settle`; each load starts a fresh folder.
        """
        self._forget_restored()
        if self.rank != 0 or not is_set_url(self.url):
            return None
        self._restored_dir = Path(tempfile.mkdtemp(prefix="skygreen-restored-", dir=self.tmp_dir))
        return self._restored_dir

    def _forget_restored(self) -> None:
        if self._restored_dir is not None:
            shutil.rmtree(self._restored_dir, ignore_errors=True)
        self._restored_dir, self._restored = None, {}

    def _remember_unloadable(self, step: int, errors: Mapping[int, str], default: str) -> None:
        """Rank 0: remember the commits newer than the step the ranks loaded.

        Each of them failed to load somewhere; retention moves them aside after the next commit
        (`skygreen.checkpoint.retention`).
        """
        if self.rank != 0:
            return
        self._unloadable = {s: errors.get(s, default) for s in committed_steps(self.store) if s > step}


def default_launch(launch: int | None, environ: Mapping[str, str]) -> int | None:
    """The launch number given, else the environment's (`SKYGREEN_LAUNCH`)."""
    return launch if launch is not None else launch_number(environ)


def stop_superseded(error: LeaseLostError) -> None:
    """A newer life owns the bucket: say so in one line and exit with the superseded code."""
    log.error("%s", error)
    raise SystemExit(error.exit_code) from error


def note(step: int, rank: int, blobs: Mapping[str, BlobInfo]) -> bytes:
    """A rank's note for `step`: the size and sha256 of every file it uploaded."""
    return json.dumps({"step": step, "rank": rank, "blobs": {n: b.to_json() for n, b in blobs.items()}}).encode()


def read_note(raw: bytes, step: int, rank: int, url: str) -> dict[str, BlobInfo]:
    """The files of a rank's note, checked to be that rank's for that step.

    Raises:
        CheckpointError: the note does not parse or is another step's or rank's.
    """
    try:
        parsed = json.loads(raw)
        if parsed["step"] != step or parsed["rank"] != rank:
            raise ValueError(f"note is for step {parsed['step']} rank {parsed['rank']}")
        return {name: BlobInfo(size=b["size"], sha256=b["sha256"]) for name, b in parsed["blobs"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{url}: bad note of rank {rank} for step {step}: {e}") from e


def collect_rank_notes(
    store: Store, step: int, *, world_size: int, wait_s: float, launch: int | None = None
) -> dict[str, BlobInfo]:
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
                raw = store.get(blob_key(step, rank_note_name(rank, launch)))
            except KeyNotFoundError:
                continue
            found.update(read_note(raw, step, rank, store.url))
            pending.discard(rank)
        if pending and time.monotonic() > deadline:
            raise RankTimeoutError(
                f"{store.url}: checkpoint step {step} not committed: rank(s) "
                f"{', '.join(map(str, sorted(pending)))} did not upload their part within {wait_s:g} s"
            )
        if pending:
            time.sleep(_NOTE_POLL_S)
    return found


def torch_load_verified(path: Path, manifest: Manifest, name: str) -> Any:
    """A verified blob, with `torch.load(weights_only=True)`; a refusal is a `CheckpointError`."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, ... for bad files
        raise CheckpointError(f"{manifest.label}: {name} verified but cannot be loaded safely: {e}") from e


def synchronize_devices() -> None:
    """Wait for device-to-host copies; a no-op on CPU."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
