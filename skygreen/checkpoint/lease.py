"""The writer lease: one life of a run writes its bucket folder at a time.

A run's process can outlive what its launcher knows of it: a local wrapper killed alone leaves
its trainer running, and a cloud VM that the controller gave up on can keep training while a
relaunch starts elsewhere. Two trainers then commit to the same folder, and the retention of
each deletes the other's checkpoints. Every life therefore takes a lease in the run's folder
(`lease.json`) that carries its launch number (`SKYGREEN_LAUNCH`, one per `up`, `resume` or
watcher relaunch) and a token of its own. Commits and retention check the lease first:

- a life whose launch number is lower than the lease's never takes it, and stops at once;
- a life of the same or a higher number takes it over (a managed job's recovery relaunches
  with the same number, and the newest VM is the one its controller watches);
- a writer that finds someone else's lease of the same or a higher number has lost it: it
  commits nothing more and deletes nothing (`LeaseLostError`), and exits with a line saying why.

The check and the write after it are two requests, so an older life can pass its check just
before a newer one takes over and still upload. Its blobs carry its own name
(`skygreen.checkpoint.manifest.life_blob_name`), so they land beside the newer life's, never
over them; its manifest write fails the check that comes before it.

A life without a launch number (training code run outside skygreen's launchers) takes no lease
and checks none. Pure `Store` operations; no torch.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from skygreen.checkpoint.store import Store
from skygreen.errors import CheckpointError, KeyNotFoundError
from skygreen.exit_codes import SUPERSEDED
from skygreen.timestamps import utc_now_iso

LEASE_KEY = "lease.json"
"""Under the run's checkpoint folder, beside `ckpt/`."""
LAUNCH_ENV = "SKYGREEN_LAUNCH"
"""The life's launch number (1 for `up`, one more for each relaunch), set by the launcher side."""


class LeaseLostError(CheckpointError):
    """A newer life of the run holds its lease: this writer must stop without writing."""

    exit_code = SUPERSEDED


@dataclass(frozen=True, kw_only=True, slots=True)
class Lease:
    """Who may write the run's folder: a launch number and the token of the life holding it."""

    launch: int
    holder: str
    taken_at: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.launch, bool) or not isinstance(self.launch, int) or self.launch < 1:
            raise ValueError(f"lease launch must be an integer >= 1, got {self.launch!r}")
        if not self.holder:
            raise ValueError("lease holder must be a non-empty token")

    def dumps(self) -> bytes:
        """The lease as the JSON object `lease.json` holds."""
        return json.dumps({"launch": self.launch, "holder": self.holder, "taken_at": self.taken_at}).encode()

    @classmethod
    def loads(cls, raw: bytes) -> Lease | None:
        """The lease in `raw`; None for bytes that are not one (a damaged lease fences nobody)."""
        try:
            data = json.loads(raw)
            return cls(launch=data["launch"], holder=str(data["holder"]), taken_at=str(data.get("taken_at", "")))
        except (ValueError, KeyError, TypeError):
            return None


def launch_number(environ: Mapping[str, str]) -> int | None:
    """The life's launch number from `SKYGREEN_LAUNCH`, read by the settings codec
    (`RuntimeSettings.launch`); None when unset.

    Raises:
        RuntimeSetupError: a value that is not a whole number >= 1, naming the variable.
    """
    from skygreen.task.settings import field_from_env

    launch: int | None = field_from_env("launch", environ)
    return launch


def read_lease(store: Store) -> Lease | None:
    """The lease in the run's folder; None when there is none (or it is damaged)."""
    try:
        return Lease.loads(store.get(LEASE_KEY))
    except KeyNotFoundError:
        return None


def take_lease(store: Store, launch: int) -> Lease:
    """Take the run's lease for launch `launch` with a new token; returns it. Raises
    `LeaseLostError` when a newer launch already holds it (this life started too late)."""
    current = read_lease(store)
    if current is not None and current.launch > launch:
        raise LeaseLostError(_superseded(store, launch, current))
    lease = Lease(launch=launch, holder=secrets.token_hex(8), taken_at=utc_now_iso(microseconds=True))
    store.put(LEASE_KEY, lease.dumps())
    return lease


def check_lease(store: Store, lease: Lease) -> None:
    """Before a commit or a deletion: `lease` must still be the run's. Raises `LeaseLostError`
    when a life of the same or a newer launch took it over. An older life's lease written over
    ours (it read before we wrote) is taken back, so that life finds ours at its next check."""
    current = read_lease(store)
    if current is None or current.holder == lease.holder:
        if current is None:
            store.put(LEASE_KEY, lease.dumps())
        return
    if current.launch >= lease.launch:
        raise LeaseLostError(_superseded(store, lease.launch, current))
    store.put(LEASE_KEY, lease.dumps())


def _superseded(store: Store, launch: int, current: Lease) -> str:
    newer = "a newer launch" if current.launch > launch else "a newer VM of the same launch"
    return (
        f"{store.url}: launch {launch} of this run is superseded: {newer} (launch {current.launch}, since "
        f"{current.taken_at or 'unknown'}) writes its checkpoints now; this process stops without "
        "committing or deleting anything"
    )
