"""The checkpoint protocol: key layout, manifest, reading the latest committed step.

What to keep after a commit lives in `skygreen.checkpoint.retention`.

Layout under a run's URL (`<bucket>/<run_id>/`):

    ckpt/<step:012d>/shared.pt           rank 0's shared state (model, optimizer, ...)
    ckpt/<step:012d>/rank<r:05d>.pt      each rank's own state (RNG, data position)
    ckpt/<step:012d>/rank<r:05d>.json    each rank's note: its blob's size and sha256
    ckpt/<step:012d>/manifest.json       the commit, written last by rank 0

A life launched by skygreen (`SKYGREEN_LAUNCH`, `skygreen.checkpoint.lease`) names its blobs
after itself, `shared.<life>.pt` and `rank<r:05d>.<life>.pt` (a sharded checkpoint's DCP files
too: `dcp.<life>.metadata`, `dcp__<r>_<i>.<life>.distcp`) with `<life>` = `l<launch>-<8 hex>`
new in each process, and its notes after its launch, `rank<r:05d>.l<launch>.json`. Two lives
of a run then never write the same key: an older life that passed its lease check just before
a newer one took over can still upload, but only beside the newer life's blobs, never over them,
and a manifest lists only blobs its own life wrote, so whichever manifest of a step is the last
one written names blobs that are all there and verify. Readers find a blob by its base name
(`find_blob`); checkpoints written without a launch keep the plain names.

The manifest is the commit: a step folder without one does not exist for readers, whatever
blobs it holds. It records every blob's size and sha256, so a reader can tell a complete,
intact checkpoint from a partial or corrupted one without trusting the bucket.

`model_sha256` identifies the weights: sha256 over the model's tensors in sorted name order,
each fed as its name (UTF-8), dtype (e.g. "torch.float32"), shape (e.g. "[3, 4]") and raw
bytes, each field followed by a NUL byte. Computing it needs tensors, so the helper lives in
`skygreen.runtime.tensors`; the definition is here, beside the manifest. A sharded (FSDP2)
commit has no rank holding the whole model, so its `model_sha256` is `sharded_model_sha256`:
a digest over its shard files' recorded hashes, computed from the manifest alone.

This module imports no torch and no cloud library: `skygreen status` reads progress through
`latest_manifest` on a laptop without either.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from skygreen.checkpoint.store import Store
from skygreen.errors import CheckpointError, KeyNotFoundError, StoreError, TransientStoreError
from skygreen.files import inside_parts
from skygreen.timestamps import parse_iso_s

log = logging.getLogger("skygreen.checkpoint")

FORMAT_VERSION = 1
CKPT_DIR = "ckpt"
MANIFEST_NAME = "manifest.json"
SHARED_BLOB = "shared.pt"
METRIC_MODES = ("min", "max")
LAYOUTS = ("full", "sharded-dcp")
STATE_KIND = "state"
"""A manifest of the runtime's own state (`shared.pt` and rank blobs), loaded by `sg.Run`."""
FOLDER_KIND = "folder"
"""A manifest of a trainer's checkpoint folder (`skygreen.checkpoint.folders`): files, not state."""
KINDS = (STATE_KIND, FOLDER_KIND)

RUN_META_KEYS: tuple[str, ...] = (
    "state",
    "energy_j",
    "wall_s",
    "preemptions",
    "samples_seen",
    "world_size",
    "checkpoint_interval_s",
    "power",
)
"""The keys every committer of a run's checkpoints (`sg.Run`, the HF and Lightning callbacks)
puts in its manifests' meta: `skygreen status` reads them from the newest manifest whichever
trainer wrote it. `state` is "completed" on the last commit of a finished run."""

COMPLETED_STATE = "completed"
"""`meta["state"]` of the commit that ends a finished run."""


def run_meta(**values: Any) -> dict[str, Any]:
    """A manifest's meta with every `RUN_META_KEYS` key given (None where a trainer cannot know
    it), and any more the committer records; a `ValueError` names a key left out, so a
    committer cannot drift from what `status` reads."""
    missing = [key for key in RUN_META_KEYS if key not in values]
    if missing:
        raise ValueError(f"run meta lacks {', '.join(missing)} (RUN_META_KEYS)")
    return dict(values)


_STEP_KEY = re.compile(r"^ckpt/(\d{12})/([^/]+)\Z")
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


# ---------------------------------------------------------------------------------------
# Key layout


def step_prefix(step: int) -> str:
    """The folder of a step's files, with its trailing slash: `ckpt/000000000042/`."""
    return f"{CKPT_DIR}/{step:012d}/"


def blob_key(step: int, name: str) -> str:
    """The key of the file `name` in the folder of `step`."""
    return step_prefix(step) + name


def manifest_key(step: int) -> str:
    """The key of the manifest that commits `step`."""
    return blob_key(step, MANIFEST_NAME)


def rank_blob_name(rank: int) -> str:
    """The file name of a rank's own state in a step folder: `rank00003.pt`."""
    return f"rank{rank:05d}.pt"


def rank_note_name(rank: int, launch: int | None = None) -> str:
    """The file name of a rank's note (its blob's name, size and sha256) in a step folder:
    `rank00003.json`, or `rank00003.l2.json` for a life of launch 2 (rank 0 of that launch reads
    only its own launch's notes)."""
    return f"rank{rank:05d}.json" if launch is None else f"rank{rank:05d}.l{launch}.json"


def life_tag(launch: int) -> str:
    """This process's name among the lives of its run, for its blob names: `l3-1a2b3c4d` (its
    launch number and 8 random hex digits, new in each process, so two VMs of one launch differ)."""
    return f"l{launch}-{secrets.token_hex(4)}"


def life_blob_name(base: str, life: str | None) -> str:
    """The file name a life gives the blob `base` (`shared.pt`, `rank00001.pt`): `shared.<life>.pt`,
    or `base` itself without a life."""
    if life is None:
        return base
    stem, dot, suffix = base.rpartition(".")
    return f"{stem}.{life}.{suffix}" if dot else f"{base}.{life}"


_LIFE_NAME = re.compile(r"(?P<stem>.+)\.l\d+-[0-9a-f]+(?P<suffix>\.[^.]+)?\Z")


def base_blob_name(name: str) -> str:
    """The blob a file name stands for, its life tag taken out (`life_blob_name` undone):
    `dcp__1_0.l3-1a2b3c4d.distcp` -> `dcp__1_0.distcp`; a plain name is its own base."""
    match = _LIFE_NAME.match(name)
    return match.group("stem") + (match.group("suffix") or "") if match else name


SHARD_FILE = re.compile(r"\A[^/]+\.distcp\Z")
"""A sharded commit's tensor files (`dcp__<rank>_<i>.distcp`): DCP's index (`dcp.metadata`)
holds a save id and a path that differ between equal saves, `shared.pt` the run's counters."""


def sharded_model_sha256(blobs: Mapping[str, BlobInfo]) -> str | None:
    """The identity of a sharded (FSDP2) commit's weights: sha256 over the base name (life tag
    out, `base_blob_name`) and sha256 of each shard file (`SHARD_FILE`), in name order; None
    when it holds none.

    No rank holds the whole model, so this is computed from the manifest, without reading a
    tensor. It names the sharded state as written: the model's shards with the optimizer's, at
    the commit's world size. Two commits with equal weights and optimizer states written by the
    same number of ranks have the same identity; the same state resharded to another world size
    has another (DCP lays shards out per rank), and it never equals `sg.Run`'s tensor hash.
    """
    shards = sorted((base_blob_name(name), info.sha256) for name, info in blobs.items() if SHARD_FILE.match(name))
    if not shards:
        return None
    digest = hashlib.sha256()
    for name, sha256 in shards:
        digest.update(f"{name}\0{sha256}\n".encode())
    return digest.hexdigest()


def find_blob(blobs: Mapping[str, Any], base: str) -> str | None:
    """The name under which `blobs` (a manifest's) holds the blob `base`: `base` itself, or the
    name a life gave it (`life_blob_name`); None when it holds neither."""
    if base in blobs:
        return base
    stem, dot, suffix = base.rpartition(".")
    if not dot:
        return None
    pattern = re.compile(re.escape(stem) + r"\.l\d+-[0-9a-f]+\." + re.escape(suffix) + r"\Z")
    return next((name for name in sorted(blobs) if pattern.match(name)), None)


def parse_step_key(key: str) -> tuple[int, str] | None:
    """(step, file name) for a key inside a step folder, else None."""
    match = _STEP_KEY.match(key)
    return (int(match.group(1)), match.group(2)) if match else None


def step_folders(keys: Sequence[str]) -> dict[int, set[str]]:
    """Step -> names of the files in its folder, from a listing of `ckpt/`."""
    folders: dict[int, set[str]] = {}
    for key in keys:
        parsed = parse_step_key(key)
        if parsed:
            folders.setdefault(parsed[0], set()).add(parsed[1])
    return folders


# ---------------------------------------------------------------------------------------
# Manifest


@dataclass(frozen=True, kw_only=True, slots=True)
class BlobInfo:
    """One blob's size in bytes and sha256 (64 lowercase hex digits), as manifests and rank notes
    record it; anything else is a `ValueError`."""

    size: int
    sha256: str

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"blob size must be a non-negative integer, got {self.size!r}")
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ValueError(f"blob sha256 must be 64 lowercase hex digits, got {self.sha256!r}")

    def to_json(self) -> dict[str, Any]:
        """The form written into manifests and rank notes: `{"size": ..., "sha256": ...}`."""
        return {"size": self.size, "sha256": self.sha256}


def check_blob_name(name: object, *, kind: str) -> None:
    """Refuse a blob name that could lead a reader's path out of its folder.

    Readers store a blob under its name in a local folder (the load folder, the prefetch folder,
    a restored checkpoint folder), and a bucket is untrusted: a manifest naming
    `../../.bashrc` must be unreadable, not a write outside the folder. A name is `/`-separated
    parts, none empty, `.` or `..`, with no backslash or NUL; the runtime's own state (`kind`
    `state`) names plain files only.

    Raises:
        ValueError: the name is not safe (a manifest that lists it is unreadable).
    """
    plain = "a plain file name" if kind == STATE_KIND else "a relative path inside the checkpoint"
    try:
        parts = inside_parts(name)
    except ValueError:
        raise ValueError(f"Manifest.blobs: {name!r} is not {plain}") from None
    if kind == STATE_KIND and len(parts) > 1:
        raise ValueError(f"Manifest.blobs: {name!r} is not {plain}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Manifest:
    """The commit record of one checkpoint. Written last; JSON; immutable once written."""

    step: int
    created_at: str
    """ISO-8601 UTC, e.g. 2025-01-31T12:00:00.000000Z."""
    format_version: int = FORMAT_VERSION
    blobs: Mapping[str, BlobInfo] = field(default_factory=dict)
    model_sha256: str | None = None
    metric: float | None = None
    metric_mode: str = "min"
    """Whether a lower ("min") or higher ("max") metric is better, for keeping the best."""
    pinned: bool = False
    world_size: int = 1
    layout: str = "full"
    """How the state is stored: "full" (`shared.pt` holds every tensor; DDP and single-GPU runs) or
    "sharded-dcp" (each rank's shards in DCP files; FSDP runs, `skygreen.runtime.sharded`)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Free-form JSON from the runtime: state, energy_j, wall_s, preemptions, ..."""
    kind: str = STATE_KIND
    """What the blobs are (`KINDS`): the runtime loads only `state`; folder checkpoints are
    restored as files by `skygreen.checkpoint.folders`. Written only when not `state`, so
    manifests of the runtime's own state keep their bytes."""

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 0:
            raise ValueError(f"Manifest.step must be a non-negative integer, got {self.step!r}")
        parse_iso_s(self.created_at)
        if self.metric is not None and not (isinstance(self.metric, (int, float)) and math.isfinite(self.metric)):
            raise ValueError(f"Manifest.metric must be a finite number or None, got {self.metric!r}")
        if self.metric_mode not in METRIC_MODES:
            raise ValueError(f"Manifest.metric_mode must be one of {METRIC_MODES}, got {self.metric_mode!r}")
        if self.model_sha256 is not None and not _SHA256.match(str(self.model_sha256)):
            raise ValueError(f"Manifest.model_sha256 must be 64 hex digits, got {self.model_sha256!r}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"Manifest.world_size must be an integer >= 1, got {self.world_size!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"Manifest.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.kind not in KINDS:
            raise ValueError(f"Manifest.kind must be one of {KINDS}, got {self.kind!r}")
        for name in self.blobs:
            check_blob_name(name, kind=self.kind)
        if self.kind == STATE_KIND and find_blob(self.blobs, SHARED_BLOB) is None:
            raise ValueError(f"Manifest.blobs must include {SHARED_BLOB!r} (or a life's name for it)")

    @property
    def created_at_s(self) -> float:
        """`created_at` in seconds since the epoch."""
        return parse_iso_s(self.created_at)

    @property
    def label(self) -> str:
        """How warnings and errors name this checkpoint."""
        return f"checkpoint step {self.step} ({step_prefix(self.step)})"

    def to_json(self) -> dict[str, Any]:
        """The manifest as a dict for `json.dumps`, blobs sorted by name; `loads` parses its JSON back.
        `layout` is written only when not "full" and `kind` only when not "state", so manifests of
        a full runtime state read as before."""
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "step": self.step,
            "created_at": self.created_at,
            "blobs": {name: info.to_json() for name, info in sorted(self.blobs.items())},
            "model_sha256": self.model_sha256,
            "metric": self.metric,
            "metric_mode": self.metric_mode,
            "pinned": self.pinned,
            "world_size": self.world_size,
            "meta": dict(self.meta),
        }
        if self.layout != "full":
            out["layout"] = self.layout
        if self.kind != STATE_KIND:
            out["kind"] = self.kind
        return out

    def dumps(self) -> bytes:
        """The bytes stored as `manifest.json`: indented JSON with sorted keys and a final newline.
        A NaN or infinity in `meta` is a `ValueError`: strict JSON has no such numbers."""
        return (json.dumps(self.to_json(), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()

    @classmethod
    def loads(cls, data: bytes | str, *, where: str) -> Manifest:
        """Parse a manifest; anything malformed is a `CheckpointError` naming `where`."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict):
                raise ValueError("not a JSON object")
            version = raw.get("format_version")
            if version != FORMAT_VERSION:
                raise ValueError(
                    f"format_version {version!r} is not {FORMAT_VERSION} (written by another skygreen version)"
                )
            blobs = raw["blobs"]
            if not isinstance(blobs, dict):
                raise ValueError("blobs is not a mapping")
            return cls(
                step=raw["step"],
                created_at=raw["created_at"],
                format_version=version,
                blobs={str(n): BlobInfo(size=b["size"], sha256=b["sha256"]) for n, b in blobs.items()},
                model_sha256=raw.get("model_sha256"),
                metric=raw.get("metric"),
                metric_mode=raw.get("metric_mode", "min"),
                pinned=bool(raw.get("pinned", False)),
                world_size=raw.get("world_size", 1),
                layout=raw.get("layout", "full"),
                meta=raw.get("meta") or {},
                kind=raw.get("kind", STATE_KIND),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{where}: unreadable checkpoint manifest: {e}") from e


# ---------------------------------------------------------------------------------------
# Hashing (plain bytes; torch-free)


class HashingWriter:
    """A write-only file wrapper that counts and hashes every byte on its way to `out`.

    Serialising through it gives the blob's size and sha256 in the same pass, so a
    multi-GB checkpoint is never read back just to be hashed.
    """

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        """Hash and count `data`, then write it to `out`; returns what `out.write` returns."""
        self._hash.update(data)
        self.size += len(data)
        return self._out.write(data)

    def flush(self) -> None:
        """Flush `out`."""
        self._out.flush()

    def info(self) -> BlobInfo:
        """Size and sha256 of everything written so far."""
        return BlobInfo(size=self.size, sha256=self._hash.hexdigest())


def blob_info(data: bytes) -> BlobInfo:
    """Size and sha256 of `data`, for a blob already in memory."""
    return BlobInfo(size=len(data), sha256=hashlib.sha256(data).hexdigest())


_FILE_CHUNK_BYTES = 8 * 1024 * 1024


def file_info(path: str | os.PathLike[str]) -> BlobInfo:
    """A local file's size and sha256, read once in chunks: what a manifest records of it, and
    what a downloaded copy must match."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_FILE_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return BlobInfo(size=size, sha256=digest.hexdigest())


# ---------------------------------------------------------------------------------------
# Reading: committed steps, latest


def committed_steps(store: Store) -> list[int]:
    """Steps with a manifest, oldest first."""
    folders = step_folders(store.list(CKPT_DIR + "/"))
    return sorted(step for step, names in folders.items() if MANIFEST_NAME in names)


def read_manifest(store: Store, step: int) -> Manifest:
    """The manifest of `step`: `KeyNotFoundError` where the step has none, `CheckpointError` where
    it is malformed or names another step."""
    key = manifest_key(step)
    manifest = Manifest.loads(store.get(key), where=f"{store.url}/{key}")
    if manifest.step != step:
        raise CheckpointError(f"{store.url}/{key}: manifest says step {manifest.step}, folder says {step}")
    return manifest


def iter_manifests(store: Store) -> Iterator[Manifest]:
    """Committed manifests, newest first; an unreadable one is skipped with a warning naming it."""
    for step in reversed(committed_steps(store)):
        try:
            yield read_manifest(store, step)
        except TransientStoreError:
            raise
        except (CheckpointError, StoreError) as e:
            log.warning("skipping checkpoint step %d: %s", step, e)


def missing_blobs(store: Store, manifest: Manifest) -> list[str]:
    """Problems with the manifest's blobs found by size alone (cheap: no download)."""
    problems = []
    for name, info in sorted(manifest.blobs.items()):
        key = blob_key(manifest.step, name)
        try:
            size = store.size(key)
        except KeyNotFoundError:
            problems.append(f"{name} is missing")
            continue
        if size != info.size:
            problems.append(f"{name} has {size} bytes, the manifest says {info.size}")
    return problems


def latest_manifest(store: Store) -> Manifest | None:
    """The newest manifest whose blobs are all present with their recorded sizes.

    Newer manifests with missing or short blobs are skipped with a warning naming them. The
    sha256 check needs the bytes; the checkpointer does it while downloading.
    """
    for manifest in iter_manifests(store):
        problems = missing_blobs(store, manifest)
        if not problems:
            return manifest
        log.warning("skipping %s: %s", manifest.label, "; ".join(problems))
    return None


def delete_step(store: Store, step: int) -> None:
    """Delete a step folder, manifest first, so a half-deleted checkpoint is never 'committed'."""
    keys = store.list(step_prefix(step))
    manifest = manifest_key(step)
    if manifest in keys:
        store.delete(manifest)
    for key in keys:
        if key != manifest:
            store.delete(key)
