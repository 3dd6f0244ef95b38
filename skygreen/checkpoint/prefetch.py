"""Prefetch: the newest checkpoint downloaded while a recovered VM is still installing packages.

The rendered setup script starts `python -m skygreen.runtime.prefetch` in the background as
its first step wherever skygreen is already importable (an image that holds it, a restarted VM),
and on a fresh image right after installing skygreen (no dependencies) and the bucket's client
library, before the other runtime requirements: the download overlaps the installs instead of
following them. It opens the run's bucket from `SKYGREEN_BUCKET` and `SKYGREEN_RUN_ID`, which
SkyPilot sets for setup too. `prefetch` writes each blob of the newest committed checkpoint to
`prefetch_dir(url)/<step>/<name>`
(written as `.part`, big blobs in ranged parallel parts, renamed once complete and verified).

Nothing unverified is trusted: the runtime takes a prefetched blob only once it is proven to be
the blob of the manifest it is loading (`take_prefetched`); one that is not is deleted and
downloaded again from the bucket, never loaded. The proof is either a hash of the file or the
prefetch's receipt: the prefetch hashes each blob as it lands (`fetch_verified`) and, once it
matches, writes `<name>.verified` beside it with the sha256 it proved and the file's identity
(device, inode, size, modification time), then renames the file into place. The runtime
accepts a receipt whose sha256 and size are the manifest's and whose identity is the file's as
it finds it; anything else (no receipt, another file put in its place, a file written since)
is hashed again. A receipt saves a second read and hash of every byte, a few seconds per GB,
on the changeover's critical path. No torch here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

from skygreen.checkpoint.bucket_url import join_url
from skygreen.checkpoint.manifest import BlobInfo, Manifest, blob_key, file_info, iter_manifests
from skygreen.checkpoint.ranged import fetch_verified
from skygreen.checkpoint.store import Store
from skygreen.files import write_atomic
from skygreen.locks import held_while_alive, is_locked

log = logging.getLogger("skygreen.runtime")

PREFETCH_ROOT = Path(".skygreen") / "prefetch"
LOCK_NAME = ".prefetching"
"""Held by the prefetch process while it downloads (`flock`: the kernel drops it when the process
dies): a blob still being written is waited for only while its writer is alive."""
PART_STALL_S = 120.0
"""A live prefetch whose file has not been written for this long is taken for hung. Generous:
a ranged download writes a whole 16 MiB part at a time, which on a slow or busy link takes
seconds, and a second download beside the first would only halve both."""


def run_url(bucket: str, run_id: str) -> str:
    """A run's checkpoint URL: `<bucket>/<run_id>`, as the runtime opens it."""
    return join_url(bucket, run_id)


def prefetch_dir(url: str, *, home: Path | None = None) -> Path:
    """Where blobs of the run at `url` are prefetched to on this machine."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return (home or Path.home()) / PREFETCH_ROOT / digest


RECEIPT_SUFFIX = ".verified"


def file_identity(path: Path) -> list[int]:
    """What changes when a file is replaced or written: device, inode, size, modification time
    (ns). Not the change time: a rename sets it, and the receipt is written before the rename."""
    info = path.stat()
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns]


def receipt_path(blob: Path) -> Path:
    """Where the prefetch's receipt for `blob` lies."""
    return blob.with_name(blob.name + RECEIPT_SUFFIX)


def write_receipt(blob: Path, proved: BlobInfo, *, final: Path) -> None:
    """Say that `blob` (about to be renamed to `final`) was hashed as it landed and is `proved`."""
    receipt = {"size": proved.size, "sha256": proved.sha256, "identity": file_identity(blob)}
    write_atomic(receipt_path(final), json.dumps(receipt))


def receipt_vouches(blob: Path, want: BlobInfo, *, receipt_at: Path | None = None) -> bool:
    """Whether the prefetch's receipt (`receipt_at`, default beside `blob`) proves `blob` is
    `want`: the receipt's sha256 and size are `want`'s and its identity is the file's now (a
    rename keeps it). False, never an error, for anything else."""
    try:
        receipt = json.loads((receipt_at or receipt_path(blob)).read_text())
        proved = BlobInfo(size=receipt["size"], sha256=receipt["sha256"])
        return proved == want and receipt["identity"] == file_identity(blob)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prefetch(store: Store, dest: Path, *, nodes: int = 1) -> str:
    """Download every blob of the newest committed checkpoint under `dest/<step>/` (a folder
    checkpoint's files under their paths); what was done, in a few words.

    A sharded (FSDP) checkpoint is prefetched on a single node, whose ranks together read every
    file; over several `nodes` it is left to the ranks, each downloading only the shard files it
    reads, since every node fetching every rank's files would only compete with them. Folders of
    other steps, left by an earlier life on this disk and never taken, are removed.
    """
    with held_while_alive(dest / LOCK_NAME):
        manifest = next(iter_manifests(store), None)
        if manifest is None:
            return "no checkpoint yet"
        for old in dest.iterdir():
            if old.is_dir() and old.name.isdecimal() and old.name != str(manifest.step):
                shutil.rmtree(old, ignore_errors=True)
        if manifest.layout != "full" and nodes > 1:
            return f"step {manifest.step} is sharded over {nodes} nodes; each rank downloads the shard files it reads"
        folder = dest / str(manifest.step)
        for name in sorted(manifest.blobs):
            final = folder.joinpath(*name.split("/"))  # names are checked safe by the manifest
            if final.exists():
                continue
            final.parent.mkdir(parents=True, exist_ok=True)
            part = final.with_name(f"{final.name}.part")
            fetch_verified(store, blob_key(manifest.step, name), part, manifest.blobs[name])
            write_receipt(part, manifest.blobs[name], final=final)
            os.replace(part, final)
        return f"step {manifest.step} prefetched"


def wait_for_part(part: Path, final: Path, *, lock: Path, stall_s: float = PART_STALL_S, poll_s: float = 0.05) -> None:
    """While a prefetch is still writing `part`, wait for it to become `final`: the download is
    already under way, and a second one would only halve both. Waits only while the prefetch
    process holds `lock` (it is alive); a part left by a dead prefetch is not waited for. Gives
    up too when a live prefetch has not written the part for `stall_s` (hung), leaving the caller
    to download. Progress is the file's size and modification time together: a ranged download
    preallocates the whole file and then writes into it, so its size alone never changes."""
    last_seen: tuple[int, int] | None = None
    last_change = time.monotonic()
    while part.exists() and not final.exists():
        if not is_locked(lock):
            if not final.exists():
                log.warning("the prefetch of %s is not running; downloading it instead", final.name)
            return
        try:
            info = part.stat()
        except OSError:
            break
        now = time.monotonic()
        seen = (info.st_size, info.st_mtime_ns)
        if seen != last_seen:
            last_seen, last_change = seen, now
        elif now - last_change > stall_s:
            log.warning("prefetch of %s stalled; downloading it instead", final.name)
            return
        time.sleep(poll_s)


def take_prefetched(dest: Path | None, manifest: Manifest, name: str, target: Path) -> bool:
    """Move the prefetched blob `name` of `manifest` to `target` if it is proven to match the
    manifest's size and sha256 (by the prefetch's receipt, else by hashing it); a blob that does
    not match is deleted (the caller downloads it). False when there is no prefetched blob to
    take, or another process took it first: the ranks of a node may want the same file (an
    FSDP checkpoint's metadata), and the first to claim it (an atomic rename) has it."""
    if dest is None:
        return False
    path = dest.joinpath(str(manifest.step), *name.split("/"))
    wait_for_part(path.with_name(f"{path.name}.part"), path, lock=dest / LOCK_NAME)
    if not path.is_file():
        return False
    claimed = path.with_name(f"{path.name}.taking-{os.getpid()}-{threading.get_ident()}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return False  # none prefetched, or another process of this node took it first
    want = manifest.blobs[name]
    vouched = receipt_vouches(claimed, want, receipt_at=receipt_path(path))
    receipt_path(path).unlink(missing_ok=True)
    got = want if vouched else file_info(claimed)
    if got != want:
        log.warning(
            "prefetched %s of %s does not match the manifest (size %d vs %d): downloading it again",
            name, manifest.label, got.size, want.size,
        )  # fmt: skip
        claimed.unlink(missing_ok=True)
        return False
    try:
        os.replace(claimed, target)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.move(claimed, target)  # the load folder is on another filesystem (a tmpfs /tmp): a copy
    return True
