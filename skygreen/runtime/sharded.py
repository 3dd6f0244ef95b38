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
- **What is not sharded** (progress, counters, batch shape, the scheduler, optimizer
  hyper-parameters, and in a multi-rank run every plain tensor, which FSDP2 keeps alike on
  every rank: buffers, optimizer step counts) goes into `shared.pt` with a placeholder where
  each DCP tensor was; DCP holds the sharded tensors (alone in one process: every tensor).
  Each rank's own RNG goes into `rank<r>.pt`, as for DDP.

Loading trusts nothing it did not verify, and unpickles nothing from the bucket:

- a rank downloads only what it reads: `dcp.metadata`, `shared.pt`, its own `rank<r>.pt`, and
  the shard files DCP's load plan for this rank's slices names (worked out from the verified
  metadata before any shard is fetched; `dcp_files.planned_files`). At the same world size
  that is its own file; 2 -> 4 ranks, the one file its half came from; 4 -> 1, all four.
  Each file is checked against its size and sha256 before any of it is read, the ranks agree
  (all-reduce) before DCP reads, and DCP's reader refuses a file this rank did not check;
- DCP's `.metadata` is a pickle: it is read by a restricted unpickler, never `pickle.load`
  (`skygreen.runtime.dcp_files` says why a matching sha256 is not enough);
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

A life launched by skygreen (`SKYGREEN_LAUNCH`) uploads each of these files under its own
name, as the full checkpointer does (`skygreen.checkpoint.manifest.life_blob_name`):
`dcp.<life>.metadata`, `dcp__<r>_<i>.<life>.distcp`, `shared.<life>.pt`, `rank<r:05d>.<life>.pt`,
notes `rank<r:05d>.l<launch>.json`, and rank 0 checks the writer lease before any upload. An
older life that passed that check just before a newer one took over uploads beside the newer
life's shard files, never over them, and the manifest lists only its own life's files. A rank
downloads each file under its base name (the life tag taken out, `blobs_by_base`), so DCP reads
its own names; checkpoints written without a launch keep the plain names and load as before.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from skygreen.checkpoint.manifest import (
    SHARED_BLOB,
    STATE_KIND,
    BlobInfo,
    Manifest,
    base_blob_name,
    blob_key,
    file_info,
    iter_manifests,
    life_blob_name,
    rank_blob_name,
    sharded_model_sha256,
)
from skygreen.checkpoint.prefetch import prefetch_dir, take_prefetched
from skygreen.checkpoint.ranged import fetch_verified
from skygreen.checkpoint.store import RetryPolicy
from skygreen.errors import CheckpointError, KeyNotFoundError, StoreError, TransientStoreError
from skygreen.runtime.commits import (
    CommitProtocol,
    Loaded,
    default_launch,
    synchronize_devices,
    torch_load_verified,
)
from skygreen.runtime.dcp_files import (
    UploadHold,
    VerifiedReader,
    join_tensors,
    placeholders,
    planned_files,
    read_dcp_metadata,
    split_tensors,
    stage_tensors,
    torch_save_to,
)
from skygreen.runtime.ranks import World, all_reduce, distributed
from skygreen.runtime.state import Stateful, capture
from skygreen.runtime.tensors import to_host
from skygreen.task.settings import RuntimeSettings
from skygreen.timestamps import utc_now_iso

log = logging.getLogger("skygreen.checkpoint")

LAYOUT = "sharded-dcp"
"""The manifest's `layout` for checkpoints written here."""
DCP_PREFIX = "dcp"
"""Blob names of DCP's files: `dcp` + DCP's own file name (`dcp.metadata`, `dcp__0_0.distcp`)."""

_UPLOAD_THREADS = 4


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Fetched:
    """What a rank verified of one checkpoint, ready for DCP.

    The non-tensor state, its own state, fresh tensors of this run's layout to load into, and
    the DCP files it checked.
    """

    skeleton: Any
    rank_state: dict | None
    into: dict[str, torch.Tensor]
    files: frozenset[str]


def open_sharded_checkpointer(
    settings: RuntimeSettings, *, world: World, environ: Mapping[str, str] | None = None
) -> ShardedCheckpointer:
    """The checkpointer of an FSDP2 run, at `<bucket>/<run_id>`.

    It takes the settings' keep and early-stopping mode, as `open_checkpointer` opens a full
    one (weights are never stored in half precision here: each rank's shards are saved as
    trained).

    Args:
        settings: the run's settings.
        world: this process's rank and world size (one checkpointer per rank).
        environ: the process environment (for the test-only upload hold; default `os.environ`).

    Returns:
        The checkpointer; `close()` it at the end.

    Raises:
        InputError: a bad keep or metric mode, or a rank outside the world (`SpecError`, a
            subclass, for the keep count and for a bucket URL that is not `s3://`, `gs://` or
            `file://`).
        StoreError: the bucket's client library (boto3, google-cloud-storage) is not installed.
    """
    return ShardedCheckpointer(
        f"{settings.bucket.rstrip('/')}/{settings.run_id}",
        keep=settings.checkpoint_keep,
        rank=world.rank,
        world_size=world.size,
        metric_mode=settings.early_stop.mode if settings.early_stop else "min",
        environ=environ,
    )


def blobs_by_base(manifest: Manifest) -> dict[str, str]:
    """Each blob of `manifest` by its base name (`base_blob_name`: the life tag taken out).

    The base name is the one a blob is read and stored locally under:
    `dcp__1_0.distcp` -> `dcp__1_0.l3-1a2b3c4d.distcp`.

    Raises:
        CheckpointError: a name that is no plain file name, or two names of one blob (a manifest
            lists only its own life's blobs, one of each).
    """
    names: dict[str, str] = {}
    for name in sorted(manifest.blobs):
        base = base_blob_name(name)
        if "/" in name or "\\" in name or base in ("", ".", "..") or base == DCP_PREFIX:
            raise CheckpointError(f"{manifest.label}: blob name {name!r} is not a file name")
        if base in names:
            raise CheckpointError(f"{manifest.label}: lists {base} twice ({names[base]}, {name})")
        names[base] = name
    return names


# ---------------------------------------------------------------------------------------
# The checkpointer


class ShardedCheckpointer(CommitProtocol):
    """Asynchronous, verified, resharding checkpoints of one FSDP2 run (one instance per rank).

    The commit protocol is `skygreen.runtime.commits`'s.

    The same surface as `skygreen.runtime.checkpointer.Checkpointer` (`save_state`,
    `restore_state`, `save`, `wait`, `close`, `load_latest`, `last_save_cost_s`,
    `last_upload_s`), so `Run` drives either.

    Args:
        url: the run's checkpoint URL (`s3://`, `gs://`, `file://` or a path).
        template: returns this run's current state (sharded as the run now is); `load_latest`
            loads into its tensors, which is how a checkpoint reshards to this world size.
            Without one, the states last given to `save_state` / `restore_state` are the template.
        keep: committed checkpoints to keep.
        rank: this process's rank.
        world_size: the number of ranks.
        metric_mode: whether a lower ("min") or higher ("max") metric is better.
        rank_wait_s: how long rank 0 waits for the other ranks' notes (and the checkpoint
            group's collectives wait for a rank) before the save fails.
        retry: the store's retry policy.
        tmp_dir: where staging and downloads go (the system's temporary folder by default).
        environ: the environment (for the test-only upload hold and `SKYGREEN_LAUNCH`).
        launch: this life's launch number for the writer lease (`skygreen.checkpoint.lease`);
            default `SKYGREEN_LAUNCH`, and None takes no lease.

    Raises:
        InputError: a bad `keep`, `rank`/`world_size` or `metric_mode` (`SpecError` for `keep`
            and for a URL that is not a bucket URL).
        StoreError: the bucket's client library is not installed.
    """

    def __init__(
        self,
        url: str,
        *,
        template: Callable[[], dict] | None = None,
        keep: int = 3,
        rank: int = 0,
        world_size: int = 1,
        metric_mode: str = "min",
        rank_wait_s: float = 600.0,
        retry: RetryPolicy | None = None,
        tmp_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
        launch: int | None = None,
    ) -> None:
        """Open the checkpoints under `url` (arguments: the class's); nothing is read or written yet."""
        env = os.environ if environ is None else environ
        super().__init__(
            url,
            keep=keep,
            rank=rank,
            world_size=world_size,
            metric_mode=metric_mode,
            rank_wait_s=rank_wait_s,
            retry=retry,
            tmp_dir=tmp_dir,
            launch=default_launch(launch, env),
        )
        self.template: Callable[[], dict] | None = template
        self.prefetched = prefetch_dir(url)  # setup's background download (one node); proven before use
        self.hold = UploadHold.from_env(env)
        self._group: Any = None
        self.last_stage_s: float | None = None
        """Seconds the last `save` spent copying tensors to host memory (the staging copy)."""
        self._states: Mapping[str, Stateful | None] | None = None
        self._download: tempfile.TemporaryDirectory | None = None
        self._fetched: _Fetched | None = None
        self.last_fetched: tuple[str, ...] = ()
        """The blob names the last load attempt downloaded and verified on this rank."""

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
        """Stage this rank's shards to host memory, then write, upload and commit them in the background.

        Call on every rank at the same step; `rank_state` is staged with `state`.

        Args:
            step: the optimizer steps done; the checkpoint's name.
            state: name -> state dict, with this rank's shards as DTensors.
            rank_state: this rank's own state (its RNG), saved as its own blob.
            metric: the early-stopping metric at this step, for `keep` by best metric.
            meta: JSON-able facts `skygreen status` reads from the manifest.
            pin: keep this checkpoint whatever retention says (the final one).

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
        skeleton, tensors = split_tensors(state, sharded_only=group is not None)
        staged = stage_tensors(tensors)
        synchronize_devices()
        skeleton = to_host(skeleton, path="state")
        own = to_host(rank_state if rank_state is not None else {}, path="rank_state")
        meta_json = dict(meta or {})
        self.last_stage_s = time.perf_counter() - waited
        self._last_save_cost_s = time.perf_counter() - started
        self._start(
            step,
            self._write,
            (step, staged, skeleton, own, group, metric, meta_json, pin),
            name="skygreen-sharded-checkpoint",
        )

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
        """Checkpoint a mapping of named stateful objects at `step`, sharded.

        As `Checkpointer.save_state`; a sharded model's entries come from `fsdp.sharded_states`.

        Args:
            step: the optimizer steps done; the checkpoint's name.
            states: name -> object with `state_dict()`/`load_state_dict()`; None values are left out.
                Every rank must call this with the same names.
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
        self._states = states
        self.save(step, state, rank_state=rank_state, metric=metric, meta=meta, pin=pin)
        return state

    def restore_state(self, states: Mapping[str, Stateful | None]) -> Loaded | None:
        """Load the newest checkpoint that verifies on every rank into named stateful objects.

        The checkpoint is resharded to this run's layout (the objects' current state is the
        template). Every rank must call this. Entries the checkpoint lacks leave their object as it is and
        are logged.

        Args:
            states: name -> object with `load_state_dict()`, as given to `save_state`.

        Returns:
            The checkpoint loaded (its state in today's layout), or None when there is none.

        Raises:
            StoreError: the bucket cannot be listed or read (checkpoints that fail to verify
                or load are skipped with a warning, not raised).
            SystemExit: a newer life of the run holds the writer lease.
        """
        self._states = states
        return super().restore_state(states)

    def _checkpoint_group(self) -> Any:
        """The gloo group the background thread's collectives use (None when alone).

        Created on the main thread, at the same point on every rank (creating a group is
        itself a collective).
        """
        if self._group is None and distributed():
            import datetime

            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.rank_wait_s))
        return self._group

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
            # rank 0, after DCP's collectives (no rank waits on it): a superseded life uploads nothing
            self._fence()
            files = self._life_named(stage, own, skeleton, Path(tmp))
            blobs = self._upload_all(step, files)
            if self.hold is not None:
                self.hold.wait_if_due(step, self.rank)
        if not self._put_note(step, blobs, started):
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
            model_sha256=sharded_model_sha256(blobs),
            meta=meta,
        )
        self._commit(manifest, started, what="sharded checkpoint")

    def _life_named(self, stage: Path, own: dict, skeleton: Any, tmp: Path) -> dict[str, Path]:
        """This rank's files by the blob name they are uploaded under.

        DCP's staged files (`dcp` + DCP's name), its own state and, on rank 0, the shared state,
        each named after this life (`life_blob_name`), so no other life of the run ever uploads
        over them.
        """
        files = {life_blob_name(DCP_PREFIX + p.name, self.life): p for p in sorted(stage.iterdir()) if p.is_file()}
        own_name = life_blob_name(rank_blob_name(self.rank), self.life)
        files[own_name] = torch_save_to(own, tmp / own_name)
        if self.rank == 0:
            shared_name = life_blob_name(SHARED_BLOB, self.life)
            files[shared_name] = torch_save_to(skeleton, tmp / shared_name)
        return files

    def _upload_all(self, step: int, files: Mapping[str, Path]) -> dict[str, BlobInfo]:
        """Hash and upload this rank's files, several at once; their sizes and sha256s."""

        def one(name: str) -> BlobInfo:
            info = file_info(files[name])
            self.store.put_file(blob_key(step, name), files[name])
            return info

        with ThreadPoolExecutor(max_workers=_UPLOAD_THREADS, thread_name_prefix="skygreen-upload") as pool:
            futures = {name: pool.submit(one, name) for name in files}
            return {name: f.result() for name, f in futures.items()}

    # -- loading ------------------------------------------------------------------------

    def load_latest(self) -> Loaded | None:
        """The newest checkpoint that verifies on every rank, resharded into this run's layout.

        None when there is none. Call on every rank (collectives), not while a save is in flight.

        Each rank downloads and verifies only what it reads: the manifest's `dcp.metadata`,
        `shared.pt` and its own `rank<r>.pt`, then the shard files DCP's plan for this rank's
        slices names (`planned_files`). Older commits are tried in turn when a newer one fails
        on any rank; rank 0 removes uncommitted step folders newer than the one loaded
        (leftovers of a life that died mid-save).

        Raises:
            CheckpointError: no template and no states saved or restored yet (nothing to load
                into); raised before any checkpoint is tried, so none is judged unloadable for it.
            StoreError: the bucket cannot be listed or read.
            SystemExit: a newer life of the run holds the writer lease.
        """
        self.wait()
        _, targets = split_tensors(self._template())
        errors: dict[int, str] = {}
        loaded: Loaded | None = None
        for manifest in iter_manifests(self.store):
            try:
                problem = self._fetch_and_verify(manifest, targets)
            except TransientStoreError:
                self._discard_download()
                raise
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
        self._clear_leftovers(step)  # rank 0, this life's lease first
        self._remember_unloadable(step, errors, "did not load")
        self.last_committed_step = loaded.step if loaded else None
        return loaded

    def _fetch_and_verify(self, manifest: Manifest, targets: Mapping[str, torch.Tensor]) -> str | None:
        """Download and check what this rank reads of `manifest`; the problem, or None.

        First `dcp.metadata`, `shared.pt` and this rank's own blob, read only once verified (the
        metadata through the restricted unpickler); then the shard files that DCP's plan for
        this rank's tensors reads, each checked against its size and sha256 as it lands. Blobs
        are looked up by their base name (a life's own name or the plain one) and land under it,
        DCP's files in the folder DCP reads, under DCP's own names.
        """
        if manifest.kind != STATE_KIND:
            return f"a {manifest.kind} checkpoint (a trainer's files), not the runtime's own state"
        if manifest.layout != LAYOUT:
            return f"written by a DDP run (layout {manifest.layout!r}), not sharded"
        try:
            names = blobs_by_base(manifest)
        except CheckpointError as e:
            return str(e)
        metadata_name = DCP_PREFIX + ".metadata"
        own_name = rank_blob_name(self.rank)
        common = [n for n in (metadata_name, SHARED_BLOB) if n not in names]
        if common:
            return f"{', '.join(common)} not in the manifest"
        self._download = tempfile.TemporaryDirectory(prefix="skygreen-dcp-load-", dir=self.tmp_dir)
        folder = Path(self._download.name)
        (folder / DCP_PREFIX).mkdir()
        self.last_fetched = ()
        first = [metadata_name, SHARED_BLOB] + ([own_name] if own_name in names else [])
        problem = self._fetch_blobs(manifest, names, first, folder)
        if problem:
            return problem
        try:
            metadata = read_dcp_metadata((folder / DCP_PREFIX / ".metadata").read_bytes(), where=names[metadata_name])
            skeleton = torch_load_verified(folder / SHARED_BLOB, manifest, names[SHARED_BLOB])
            own_path = folder / own_name
            rank_state = torch_load_verified(own_path, manifest, names[own_name]) if own_path.exists() else None
            wanted = placeholders(skeleton)
            missing = sorted(set(wanted) - set(targets))
            if missing:
                return f"this run's state has no {', '.join(missing[:3])}"
            # fresh tensors of this run's layout: a failed load leaves the live state alone
            into = {key: targets[key].detach().clone() for key in wanted}
            files = planned_files(metadata, into)
        except CheckpointError as e:
            return str(e)
        shards = sorted(DCP_PREFIX + f for f in files)
        unlisted = [n for n in shards if n not in names]
        if unlisted:
            return f"{', '.join(unlisted)} not in the manifest"
        problem = self._fetch_blobs(manifest, names, shards, folder)
        if problem:
            return problem
        log.info(
            "%s: rank %d verified %d of %d shard files (what its slices need)",
            manifest.label,
            self.rank,
            len(shards),
            sum(1 for n in names if n.startswith(DCP_PREFIX + "__")),
        )
        self._fetched = _Fetched(skeleton=skeleton, rank_state=rank_state, into=into, files=frozenset(files))
        return None

    def _fetch_blobs(self, manifest: Manifest, names: Mapping[str, str], bases: list[str], folder: Path) -> str | None:
        """Download the blobs `bases` of `manifest` into `folder`, several at once, each verified.

        Each is stored as `names[base]` and lands under its base name; the problems are returned
        (None when there are none).
        """

        def one(base: str) -> str | None:
            local = folder / DCP_PREFIX / base[len(DCP_PREFIX) :] if base.startswith(DCP_PREFIX) else folder / base
            name = names[base]
            if take_prefetched(self.prefetched, manifest, name, local):
                return None
            try:
                fetch_verified(self.store, blob_key(manifest.step, name), local, manifest.blobs[name])
            except KeyNotFoundError:
                return f"{name} is missing"
            except CheckpointError as e:
                return str(e)
            return None

        try:
            with ThreadPoolExecutor(max_workers=_UPLOAD_THREADS, thread_name_prefix="skygreen-fetch") as pool:
                problems = [p for p in pool.map(one, bases) if p]
        except TransientStoreError:
            raise
        except StoreError as e:
            return str(e)
        self.last_fetched += tuple(names[base] for base in bases)
        return "; ".join(problems) or None

    def _discard_download(self) -> None:
        self._fetched = None
        if self._download is not None:
            self._download.cleanup()
            self._download = None

    def _read(self, manifest: Manifest) -> Loaded:
        """DCP-load the verified files into this run's current state (resharding it)."""
        assert self._download is not None and self._fetched is not None
        fetched = self._fetched
        reader = VerifiedReader(Path(self._download.name) / DCP_PREFIX, verified=fetched.files)
        try:
            group = self._checkpoint_group()
            dcp.load(fetched.into, storage_reader=reader, process_group=group, no_dist=group is None)
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as e:  # DCP raises CheckpointException on every rank alike
            raise CheckpointError(f"{manifest.label}: verified but DCP cannot load it into this run: {e}") from e
        state = join_tensors(fetched.skeleton, fetched.into)
        if fetched.rank_state is None and self.world_size > 1:
            log.warning(
                "%s has no state for rank %d (saved with %d ranks); its random streams restart",
                manifest.label,
                self.rank,
                manifest.world_size,
            )
        return Loaded(
            step=manifest.step, state=state, rank_state=fetched.rank_state, manifest=manifest, fetched=self.last_fetched
        )

    def _template(self) -> dict:
        """This run's current state, whose tensors a load fills (and so reshards to)."""
        if self.template is not None:
            return self.template()
        if self._states is not None:
            return capture(self._states)
        raise CheckpointError(f"{self.url}: nothing to load into; call restore_state with the run's states")
