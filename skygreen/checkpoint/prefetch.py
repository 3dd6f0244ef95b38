"""Prefetch: the newest checkpoint downloaded while a recovered VM is still installing packages.

The rendered setup script starts `python -m skygreen.runtime.prefetch` in the background as
its first step wherever skygreen is already importable (an image that holds it, a restarted VM),
and on a fresh image right after installing skygreen (no dependencies) and the bucket's client
library, before the other runtime requirements: the download overlaps the installs instead of
following them. It opens the run's bucket from `SKYGREEN_BUCKET` and `SKYGREEN_RUN_ID`, which
SkyPilot sets for setup too. `prefetch` writes each blob of the newest committed checkpoint to
`prefetch_dir(url)/<step>/<name>`
(written as `.part`, big blobs in ranged parallel parts, renamed once complete and verified).

Nothing here is trusted: the runtime takes a prefetched blob only after its size and sha256
match the manifest it is loading (`take_prefetched`); a blob that does not match is deleted and
downloaded again from the bucket, never loaded. No torch here.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path

from skygreen.checkpoint.manifest import BlobInfo, Manifest, blob_key, iter_manifests
from skygreen.checkpoint.ranged import fetch_verified
from skygreen.checkpoint.store import Store
from skygreen.locks import held_while_alive, is_locked

log = logging.getLogger("skygreen.runtime")

PREFETCH_ROOT = Path(".skygreen") / "prefetch"
_CHUNK_BYTES = 1 << 20
LOCK_NAME = ".prefetching"
"""Held by the prefetch process while it downloads (`flock`: the kernel drops it when the process
dies): a blob still being written is waited for only while its writer is alive."""
PART_STALL_S = 120.0
"""A live prefetch whose file has not been written for this long is taken for hung. Generous:
a ranged download writes a whole 16 MiB part at a time, which on a slow or busy link takes
seconds, and a second download beside the first would only halve both."""


def run_url(bucket: str, run_id: str) -> str:
    """A run's checkpoint URL: `<bucket>/<run_id>`, as the runtime opens it."""
    return f"{bucket.rstrip('/')}/{run_id}"


def prefetch_dir(url: str, *, home: Path | None = None) -> Path:
    """Where blobs of the run at `url` are prefetched to on this machine."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return (home or Path.home()) / PREFETCH_ROOT / digest


def blob_info(path: Path) -> BlobInfo:
    """A file's size and sha256, to compare with what a manifest lists."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return BlobInfo(size=size, sha256=digest.hexdigest())


def prefetch(store: Store, dest: Path) -> int | None:
    """Download every blob of the newest committed checkpoint under `dest/<step>/`; its step,
    or None when the run has no checkpoint yet."""
    with held_while_alive(dest / LOCK_NAME):
        manifest = next(iter_manifests(store), None)
        if manifest is None:
            return None
        folder = dest / str(manifest.step)
        folder.mkdir(parents=True, exist_ok=True)
        for name in sorted(manifest.blobs):
            final = folder / name
            if final.exists():
                continue
            part = folder / f"{name}.part"
            fetch_verified(store, blob_key(manifest.step, name), part, manifest.blobs[name])
            os.replace(part, final)
        return manifest.step


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
    """Move the prefetched blob `name` of `manifest` to `target` if it matches the manifest's
    size and sha256; a blob that does not match is deleted (the caller downloads it). False
    when there is no prefetched blob to take."""
    if dest is None:
        return False
    path = dest / str(manifest.step) / name
    wait_for_part(path.with_name(f"{name}.part"), path, lock=dest / LOCK_NAME)
    if not path.is_file():
        return False
    got, want = blob_info(path), manifest.blobs[name]
    if got != want:
        log.warning(
            "prefetched %s of %s does not match the manifest (size %d vs %d): downloading it again",
            name, manifest.label, got.size, want.size,
        )  # fmt: skip
        path.unlink(missing_ok=True)
        return False
    try:
        os.replace(path, target)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.move(path, target)  # the load folder is on another filesystem (a tmpfs /tmp): a copy
    return True
