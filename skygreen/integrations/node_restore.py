"""One restore per node when a trainer runs as several processes.

Under torchrun every rank builds the trainer, so every rank would restore the newest checkpoint
folder into the same `output_dir` at once: N downloads of the same files, and one rank's rename
into place while another already reads the folder. Here local rank 0 restores and the other
ranks on that node wait for it, then name the same folder without downloading it.

How the others learn that the restore is done:

- once a process group exists (HF's `Trainer` creates it in `TrainingArguments`): local rank 0
  removes the old marker, restores, writes the marker; every rank meets at a
  `torch.distributed.barrier()`; the others read the marker, which the barrier proves fresh;
- before any process group (Lightning's callback is built before its `Trainer`), under
  torchrun: a marker file named by this launch (the torchrun agent's pid, the workers' parent,
  and torchelastic's restart count), which local rank 0 writes once the folder is in place;
- any other multi-process launch skygreen cannot recognise (Lightning's own subprocess
  launcher, which starts the other ranks only inside `fit()`): each process restores for
  itself, as a single process does.

Only global rank 0 commits (`TrainerServices.commit`); every node restores into its own disk.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from skygreen.checkpoint.folders import FOLDER_META, RestoredFolder, folder_manifests, restore_latest, safe_folder_name
from skygreen.checkpoint.store import Store
from skygreen.errors import RuntimeSetupError

MARKER_PREFIX = ".skygreen-restored-"
"""The file local rank 0 writes into the checkpoint folder's parent once its restore is done."""
WAIT_S = 1800.0
"""The most a rank waits for local rank 0's restore (a big checkpoint over a slow link)."""
POLL_S = 0.2


def launch_token(environ: Mapping[str, str]) -> str | None:
    """What names this launch of the workers on this node, the same on each local rank: torchrun's
    agent (their parent) and its restart count; None when torchrun did not start this process."""
    if "TORCHELASTIC_RUN_ID" not in environ or "LOCAL_RANK" not in environ:
        return None
    return f"{os.getppid()}-{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def restore_per_node(
    store: Store,
    parent: str | Path,
    *,
    local_rank: int,
    token: str | None,
    barrier: Callable[[], object] | None,
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
) -> RestoredFolder | None:
    """Restore the newest verified folder on local rank 0 only; the other local ranks wait.

    Args:
        store: the run's store.
        parent: the folder the trainer saves its checkpoint folders into.
        local_rank: this process's rank on its node.
        token: names this launch (`launch_token`), for the marker when there is no `barrier`.
        barrier: a collective every rank joins (`torch.distributed.barrier`), or None before a
            process group exists.
        wait_s: how long the other ranks wait for local rank 0's marker.
        poll_s: how often they look.

    Returns:
        The restored folder (the same on every local rank), or None on a fresh start.

    Raises:
        RuntimeSetupError: no `barrier` and no `token` (the ranks cannot meet), or local rank 0
            did not finish its restore within `wait_s`.
    """
    root = Path(parent)
    if barrier is None and token is None:
        raise RuntimeSetupError(
            "several processes restore into one folder, and they share neither a process group nor a torchrun launch"
        )
    marker = root / f"{MARKER_PREFIX}{'group' if barrier is not None else token}"
    if local_rank == 0:
        for old in root.glob(f"{MARKER_PREFIX}*"):
            old.unlink(missing_ok=True)
        restored = restore_latest(store, root)
        _write_marker(marker, restored.step if restored is not None else None)
        if barrier is not None:
            barrier()
        return restored
    if barrier is not None:
        barrier()
    step = _wait_for_marker(marker, wait_s=wait_s, poll_s=poll_s)
    return None if step is None else _restored_by_rank_0(store, root, step)


def _write_marker(marker: Path, step: int | None) -> None:
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_name(marker.name + ".partial")
    partial.write_text(json.dumps({"step": step}), encoding="utf-8")
    os.replace(partial, marker)


def _wait_for_marker(marker: Path, *, wait_s: float, poll_s: float) -> int | None:
    deadline = time.monotonic() + wait_s
    while not marker.is_file():
        if time.monotonic() > deadline:
            raise RuntimeSetupError(
                f"local rank 0 did not restore the checkpoint into {marker.parent} within {wait_s:g} s "
                f"(no {marker.name})\n  fix: look at local rank 0's output for its error"
            )
        time.sleep(poll_s)
    step = json.loads(marker.read_text(encoding="utf-8"))["step"]
    return None if step is None else int(step)


def _restored_by_rank_0(store: Store, root: Path, step: int) -> RestoredFolder:
    """The folder local rank 0 restored, named from its manifest (the files are not read again)."""
    for manifest in folder_manifests(store):
        if manifest.step == step:
            path = root / safe_folder_name(manifest.meta.get(FOLDER_META))
            if path.is_dir():
                return RestoredFolder(path=path, step=step, manifest=manifest)
            break
    raise RuntimeSetupError(
        f"local rank 0 restored the checkpoint folder of step {step} into {root}, and this rank cannot find it there\n"
        "  fix: every rank on a node must see the same output_dir (a folder on the node's own disk)"
    )
