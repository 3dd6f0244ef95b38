"""A trainer's checkpoint folder as a verified, manifest-last commit, and back.

HF `Trainer`, Lightning and most scripts save checkpoints as folders of files
(`checkpoint-500/model.safetensors`, `optimizer.pt`, `trainer_state.json`, ...). A bucket
mounted at that folder gives no atomicity: a preemption during an upload leaves a partial
folder that the next start loads. Here a folder is committed the way the runtime commits its
own state (`skygreen.checkpoint.manifest`):

    ckpt/<step:012d>/files/<path inside the folder>   every regular file, nested folders kept
    ckpt/<step:012d>/manifest.json                    written last; kind "folder"

The manifest records each file's size and sha256 and, in `meta["folder"]`, the folder's name.
Its `kind` keeps the runtime's own loader (`sg.Run`) from taking it, and keeps this module
from taking the runtime's state. Files sit under `files/` so a file of the folder named
`manifest.json` can never stand in for the commit.

Restoring downloads the newest folder commit into a temporary sibling of its target, checks
every file's size and sha256, and only then renames it into place: a reader never sees a
partial folder, and a commit that does not verify is skipped for the next older one. The
bucket is untrusted: every file name in a manifest is checked to stay inside the folder, and
nothing here unpickles anything.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from skygreen.checkpoint.manifest import (
    COMPLETED_STATE,
    FOLDER_KIND,
    BlobInfo,
    Manifest,
    blob_key,
    file_info,
    iter_manifests,
    manifest_key,
    missing_blobs,
)
from skygreen.checkpoint.prefetch import prefetch_dir, take_prefetched
from skygreen.checkpoint.ranged import fetch_verified
from skygreen.checkpoint.retention import apply_retention, first_line
from skygreen.checkpoint.store import Store
from skygreen.checkpoint.traffic import note_checkpoint
from skygreen.errors import CheckpointError, KeyNotFoundError, StoreError, TransientStoreError
from skygreen.files import inside_parts
from skygreen.timestamps import utc_now_iso

log = logging.getLogger("skygreen.folders")

FILES_DIR = "files"
"""Blob names of a folder commit are `files/<relative path>`."""
FOLDER_META = "folder"
"""`meta` key of a folder commit: the folder's own name (`checkpoint-500`)."""
TEMP_PREFIX = ".skygreen-"
"""Names of the temporary siblings a restore downloads into; never taken for checkpoints."""

_TRAILING_NUMBER = re.compile(r"(\d+)\Z")


@dataclass(frozen=True, kw_only=True, slots=True)
class RestoredFolder:
    """A folder commit restored to local disk."""

    path: Path
    step: int
    manifest: Manifest


def folder_step(name: str) -> int | None:
    """The step a checkpoint folder's name ends with (`checkpoint-500`, `step_500`,
    `global_step500` -> 500), else None: a folder without one cannot be ordered."""
    match = _TRAILING_NUMBER.search(name)
    return int(match.group(1)) if match else None


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every regular file under `folder`, sorted; symbolic links
    to files count as the files they point at, other special files are left out."""
    files = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            files.append((path.relative_to(folder).as_posix(), path))
    return files


# ---------------------------------------------------------------------------------------
# Commit


def commit_folder(
    store: Store,
    folder: str | Path,
    *,
    step: int,
    metric: float | None = None,
    metric_mode: str = "min",
    meta: Mapping[str, Any] | None = None,
) -> Manifest:
    """Upload every file of `folder` as a blob of `step`, then its manifest last.

    A commit of the same step already in the bucket (a trainer that saves one step twice) stops
    being one first: its manifest is deleted before any blob is replaced.

    Args:
        store: the run's store (rooted at `<bucket>/<run_id>`).
        folder: a complete checkpoint folder; its name is recorded and restored.
        step: the training step the folder holds.
        metric: the value retention keeps the best of, if any.
        metric_mode: "min" or "max", for `metric`.
        meta: more JSON to record (run id, trainer, epoch).

    Returns:
        The manifest written.

    Raises:
        CheckpointError: the folder is missing, holds no file, or a file whose name has a
            backslash (checked before anything is uploaded).
        StoreError: the bucket refused an upload; nothing is committed then.
    """
    path = Path(folder)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist")
    files = folder_files(path)
    if not files:
        raise CheckpointError(f"checkpoint folder {path} holds no files")
    for relative, _ in files:
        try:
            inside_parts(relative)
        except ValueError:
            raise CheckpointError(
                f"checkpoint folder {path}: the file name {relative!r} cannot be restored on another machine "
                "(a backslash in a name)\n  fix: rename the file, or write it outside the checkpoint folder"
            ) from None
    store.delete(manifest_key(step))  # a commit of this step already there stops being one first
    blobs: dict[str, BlobInfo] = {}
    for relative, file in files:
        name = f"{FILES_DIR}/{relative}"
        blobs[name] = file_info(file)
        store.put_file(blob_key(step, name), file)
    manifest = Manifest(
        kind=FOLDER_KIND,
        step=step,
        created_at=utc_now_iso(microseconds=True),
        blobs=blobs,
        metric=metric,
        metric_mode=metric_mode,
        model_sha256=folder_model_sha256(blobs),
        meta={**dict(meta or {}), FOLDER_META: path.name},
    )
    store.put(manifest_key(step), manifest.dumps())
    note_checkpoint(store, step, sum(info.size for info in blobs.values()))
    log.info("committed checkpoint folder %s as step %d (%d files)", path.name, step, len(files))
    return manifest


MODEL_FILE = re.compile(r"(^|/)((pytorch_|adapter_)?model[^/]*\.(safetensors|bin|pt|pth)|[^/]*\.ckpt)$")
"""The files of a trainer's folder that hold the model: HF's `model*.safetensors`,
`pytorch_model*.bin`, PEFT's `adapter_model.*`, Lightning's `*.ckpt`; not the optimizer,
scheduler, RNG or trainer state, which differ between runs that end with the same weights."""


def folder_model_sha256(blobs: Mapping[str, BlobInfo]) -> str | None:
    """The model's identity in a folder commit: sha256 over the name and sha256 of each model
    file (`MODEL_FILE`), in name order; None when the folder holds none. `status` shows it
    as it shows `sg.Run`'s hash over the model's tensors."""
    names = sorted(name for name in blobs if MODEL_FILE.search(name))
    if not names:
        return None
    digest = hashlib.sha256()
    for name in names:
        digest.update(f"{name}\0{blobs[name].sha256}\n".encode())
    return digest.hexdigest()


def mark_completed(store: Store, manifest: Manifest) -> Manifest:
    """Say in a run's last commit that the run finished (`meta["state"]` "completed"), for a
    trainer whose final save came before it knew training was over (HF's `on_train_end`
    follows its last `on_save`). The blobs stay; only the manifest is written again, whole."""
    done = dataclasses.replace(manifest, meta={**dict(manifest.meta), "state": COMPLETED_STATE})
    store.put(manifest_key(manifest.step), done.dumps())
    return done


def commit_and_retain(store: Store, folder: str | Path, *, step: int, keep: int, **kwargs: Any) -> Manifest:
    """`commit_folder`, then the task's `keep` rule (`skygreen.checkpoint.retention`): the
    commit just made always stays, commits that do not verify never count towards `keep`."""
    manifest = commit_folder(store, folder, step=step, **kwargs)
    apply_retention(store, keep=keep, committed_step=step)
    return manifest


# ---------------------------------------------------------------------------------------
# Restore


def folder_manifests(store: Store) -> Iterator[Manifest]:
    """Folder commits, newest first; the runtime's own state commits are passed over."""
    for manifest in iter_manifests(store):
        if manifest.kind == FOLDER_KIND:
            yield manifest


def committed_folder_steps(store: Store) -> list[int]:
    """Steps of the folder commits whose manifest reads, oldest first."""
    return sorted(m.step for m in folder_manifests(store))


def restore_latest(store: Store, parent: str | Path, *, prefetched: Path | None = None) -> RestoredFolder | None:
    """Restore the newest folder commit that verifies into `parent/<its folder name>`.

    Newer commits with a missing, short or corrupt file, or an unsafe name, are skipped with
    a warning naming them. A folder of that name already under `parent` (a partial save of the
    life that died) is replaced only once the download verified.

    Args:
        store: the run's store.
        parent: the local folder the trainer saves its checkpoint folders into.
        prefetched: where setup's prefetch put the run's newest checkpoint (its files are taken
            once proven, `skygreen.checkpoint.prefetch`); default: the prefetch folder of
            `store.url` on this machine.

    Returns:
        The restored folder, or None where the bucket holds no folder commit that verifies.

    Raises:
        TransientStoreError: the bucket kept failing; retrying later may help.
    """
    root = Path(parent)
    root.mkdir(parents=True, exist_ok=True)
    prefetched = prefetch_dir(store.url) if prefetched is None else prefetched
    for manifest in folder_manifests(store):
        try:
            problems = missing_blobs(store, manifest)
            if problems:
                log.warning("skipping checkpoint folder of step %d: %s", manifest.step, "; ".join(problems))
                continue
            path = restore_folder(store, manifest, root, prefetched=prefetched)
        except TransientStoreError:
            raise
        except (CheckpointError, StoreError) as e:
            log.warning("skipping checkpoint folder of step %d: %s", manifest.step, first_line(e))
            continue
        log.info("restored checkpoint folder %s (step %d) from %s", path, manifest.step, store.url)
        return RestoredFolder(path=path, step=manifest.step, manifest=manifest)
    return None


def restore_folder(store: Store, manifest: Manifest, parent: Path, *, prefetched: Path | None = None) -> Path:
    """Download one folder commit into a temporary sibling, verify every file, rename it into
    place; returns the folder. Files setup prefetched into `prefetched` are taken once proven;
    the rest are downloaded (big ones in ranged parts, hashed as they land). Anything that does
    not verify is a `CheckpointError` and leaves `parent` as it was."""
    name = safe_folder_name(manifest.meta.get(FOLDER_META))
    relatives = {blob: safe_relative_path(blob) for blob in manifest.blobs}
    staging = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}restore-{name}-", dir=parent))
    try:
        for blob, relative in sorted(relatives.items()):
            target = staging.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            if take_prefetched(prefetched, manifest, blob, target):
                continue
            try:
                fetch_verified(store, blob_key(manifest.step, blob), target, manifest.blobs[blob])
            except KeyNotFoundError as e:
                raise CheckpointError(f"{blob} is missing") from e
        return _swap_in(staging, parent / name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_in(staging: Path, target: Path) -> Path:
    """Rename `staging` to `target`; an existing `target` is moved aside first and removed after."""
    if target.exists() or target.is_symlink():
        aside = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}replaced-{target.name}-", dir=target.parent))
        target.rename(aside / target.name)
        staging.rename(target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        staging.rename(target)
    return target


def safe_folder_name(value: object) -> str:
    """A folder name from a manifest, refused unless it is one plain path component."""
    if not isinstance(value, str) or not value or value in (".", "..") or "/" in value or "\\" in value:
        raise CheckpointError(f"folder name {value!r} in the manifest is not a plain folder name")
    if value.startswith(TEMP_PREFIX):
        raise CheckpointError(f"folder name {value!r} in the manifest is a temporary name")
    return value


def safe_relative_path(blob: str) -> PurePosixPath:
    """The path inside the folder of blob `files/<path>`, refused where it could leave the folder."""
    prefix = FILES_DIR + "/"
    try:
        return PurePosixPath(*inside_parts(blob[len(prefix) :] if blob.startswith(prefix) else ""))
    except ValueError:
        raise CheckpointError(f"file name {blob!r} in the manifest is not a safe path inside the folder") from None
