"""The run registry: what `skygreen up` launched, kept on the user's machine.

One JSON file per run under `<data dir>/runs/<run_id>/run.json` (data dir:
`$SKYGREEN_DATA_DIR`, else `$XDG_DATA_HOME/skygreen`, else `~/.local/share/skygreen`).
Writes are atomic (temporary file, fsync, rename), so a `kill -9` never leaves half a record.
A record holds no credentials: the task snapshot keeps secret names only.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from skygreen.errors import InputError, SkygreenError
from skygreen.files import DATA_DIR_ENV as DATA_DIR_ENV
from skygreen.files import data_dir, write_atomic
from skygreen.locks import exclusive_lock
from skygreen.timestamps import utc_now_iso

RECORD_VERSION = 1
LAUNCH_LOCK_FILE = "launch.lock"
_RUN_ID = re.compile(r"^[a-z][a-z0-9-]{0,62}\Z")


def default_local_bucket(environ: Mapping[str, str] | None = None) -> Path:
    """Where `--local` runs keep checkpoints when the task names no bucket."""
    return data_dir(environ) / "buckets"


def new_run_id(task_name: str | None, *, now_s: float | None = None) -> str:
    """`<task>-<yyyymmdd-hhmmss>-<4 hex>`: readable, sortable, unique, and a valid SkyPilot
    job name (lowercase letters, digits and dashes, starting with a letter)."""
    stem = re.sub(r"[^a-z0-9]+", "-", (task_name or "run").lower()).strip("-")[:24].strip("-") or "run"
    if not stem[0].isalpha():
        stem = "r-" + stem
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now_s is None else now_s))
    import secrets  # here, not at the top: `plan` reads the registry and never makes an id

    return f"{stem}-{stamp}-{secrets.token_hex(2)}"


def launching_user(environ: Mapping[str, str] | None = None) -> str | None:
    """The login name of whoever runs `skygreen up` here: `$LOGNAME`, `$USER` or `$USERNAME` as
    `getpass.getuser` reads them, else the account's name; None when none can be told.

    Recorded in the run record and rendered into the job (`RuntimeSettings.user`), so a team's
    spend can be split by user on any machine that reads the run's ledger from the bucket.
    """
    import os

    environ = os.environ if environ is None else environ
    for name in ("LOGNAME", "USER", "USERNAME"):
        if environ.get(name, "").strip():
            return environ[name].strip()
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name or None
    except (ImportError, KeyError, OSError):
        return None


def check_run_id(run_id: str) -> str:
    """`run_id` itself when it is a run id: a lowercase letter, then up to 62 lowercase letters,
    digits and dashes (so it is always one safe folder name); else `InputError`.
    """
    if not _RUN_ID.match(run_id or ""):
        raise InputError(f"not a run id: {run_id!r}\n  fix: use an id from `skygreen status`")
    return run_id


@dataclass(frozen=True, kw_only=True, slots=True)
class Launch:
    """One launch of a run (the first `up`, then each `resume`)."""

    at: str
    job_id: str
    pid: int | None = None
    """Local runs: the process group leader started for this launch."""
    spot: bool | None = None
    """The capacity a deadline watcher chose for this launch; None: as rendered (the plan's)."""
    started_at_s: float | None = None
    """When the launch call started, in Unix seconds on the deadline clock
    (`skygreen.deadline.clock`), whoever launched it: a watcher dates every job by it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """What this machine keeps about one run: its task, how and where it runs, its bucket, its
    launches and its last known state. Raises `InputError` for a malformed run id and ValueError
    for a mode other than cloud or local.
    """

    run_id: str
    task_path: str
    task_name: str | None
    mode: str
    """"cloud" or "local"."""
    launcher: str
    """The launcher's kind ("skypilot", "local", or a fake's name)."""
    bucket: str
    """Base checkpoint URL; the run's checkpoints are under `<bucket>/<run_id>/`."""
    task_yaml: str
    """Path of the rendered SkyPilot task this run launches (and `resume` relaunches)."""
    spec_snapshot: Mapping[str, Any]
    """The task file as parsed, secret values removed."""
    created_at: str
    state: str
    """Last known `JobState` value, or "CREATED" before the first launch."""
    launches: tuple[Launch, ...] = ()
    plan_summary: Mapping[str, Any] | None = None
    """The offers handed to SkyPilot and their estimates (`Candidate.to_json`)."""
    secret_names: tuple[str, ...] = ()
    cancelled: bool = False
    """Set by `skygreen cancel`, so a stopped process reads as cancelled, not killed."""
    deadline: Mapping[str, Any] | None = None
    """`skygreen.deadline.live.DeadlineTerms` as JSON, for a run launched with a deadline."""
    pending_launch: int | None = None
    """The number of a launch whose launcher call has not returned (set just before it). A command
    killed inside that call leaves it set: `status` then adopts the job named for it
    (`launch_name`), so a paid job never goes unrecorded."""
    pending_at_s: float | None = None
    """When that pending launch started (`Launch.started_at_s`)."""
    user: str | None = None
    """Who launched the run (`launching_user`), for `skygreen cost --all --by user`; None in
    records written before it was kept."""
    updated_at: str = ""
    version: int = RECORD_VERSION

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        if self.mode not in ("cloud", "local"):
            raise ValueError(f"mode must be cloud or local, got {self.mode!r}")

    @property
    def job_id(self) -> str | None:
        """The job id of the latest launch; None before the first."""
        return self.launches[-1].job_id if self.launches else None

    @property
    def checkpoint_url(self) -> str:
        """Where the run's checkpoints are: `<bucket>/<run_id>`."""
        return f"{self.bucket.rstrip('/')}/{self.run_id}"

    def with_launch(
        self,
        job_id: str,
        *,
        pid: int | None = None,
        state: str = "PENDING",
        spot: bool | None = None,
        started_at_s: float | None = None,
    ) -> RunRecord:
        """A copy with one more launch (on `spot` capacity when a watcher chose it, begun at
        `started_at_s`), stamped now (UTC), in `state`, and no longer marked cancelled; not saved."""
        launch = Launch(at=utc_now_iso(), job_id=job_id, pid=pid, spot=spot, started_at_s=started_at_s)
        return replace(self, launches=(*self.launches, launch), state=state, cancelled=False, pending_launch=None)

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON values, as run.json holds it."""
        data = asdict(self)
        data["launches"] = [asdict(launch) for launch in self.launches]
        data["secret_names"] = list(self.secret_names)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunRecord:
        """The record from run.json's data; keys it does not know are ignored, and a missing required
        one (or launches that are not a list of objects) raises TypeError."""
        values = dict(data)
        launches = values.get("launches", ())
        if not isinstance(launches, (list, tuple)) or not all(isinstance(launch, Mapping) for launch in launches):
            raise TypeError(f"launches must be a list of objects, got {launches!r}")
        values["launches"] = tuple(Launch(**launch) for launch in launches)
        values["secret_names"] = tuple(values.get("secret_names", ()))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in values.items() if k in known})


@dataclass(frozen=True, kw_only=True, slots=True)
class Registry:
    """Run records under `root` (default: `<data dir>/runs`)."""

    root: Path = field(default_factory=lambda: data_dir() / "runs")

    def run_dir(self, run_id: str) -> Path:
        """The run's folder under `root`, whether or not it exists; `InputError` for a malformed run id."""
        return self.root / check_run_id(run_id)

    def claim_run_id(self, task_name: str | None, *, now_s: float | None = None) -> str:
        """A new run id (`new_run_id`) whose folder this call made, so no other `up` has it.

        Ids differ only in 4 hex digits within a second: of 20 runs started in one second, two
        share an id about once in 340 batches, and the second would overwrite the first's record
        and share its bucket folder. Making the folder is atomic across processes; a taken id
        draws again.
        """
        while True:
            run_id = new_run_id(task_name, now_s=now_s)
            try:
                self.run_dir(run_id).mkdir(parents=True)
            except (FileExistsError, FileNotFoundError):  # taken, or `root` given back meanwhile
                continue
            return run_id

    def release_unused(self, run_id: str) -> None:
        """Remove a claimed run folder that is still empty (its `up` failed before writing), and
        `root` too when that leaves it empty, so a refused first `up` leaves nothing behind."""
        with contextlib.suppress(OSError):
            self.run_dir(run_id).rmdir()
            self.root.rmdir()

    def save(self, record: RunRecord) -> RunRecord:
        """Write the record, stamped `updated_at` now, to `<root>/<run_id>/run.json` atomically;
        returns the stamped record."""
        record = replace(record, updated_at=utc_now_iso())
        folder = self.run_dir(record.run_id)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "run.json", json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
        return record

    @contextlib.contextmanager
    def relaunching(self, run_id: str) -> Iterator[bool]:
        """Hold the run's relaunch lock for the block (`<run dir>/launch.lock`); yields False when
        another process holds it. A relaunch checks that the run is stopped and then launches it:
        two at once (the user's `resume` and a deadline watcher's switch) would both find it
        stopped, both launch, and the record would keep only one of the two jobs."""
        with exclusive_lock(self.run_dir(run_id) / LAUNCH_LOCK_FILE, wait_s=0) as taken:
            yield taken

    def resolve(self, run_id: str) -> str:
        """The full id of the one run whose id is `run_id` or starts with it (as git and docker
        take any unique prefix); an ambiguous prefix lists the runs it matches (exit 2)."""
        check_run_id(run_id)
        if (self.run_dir(run_id) / "run.json").exists():
            return run_id
        matches = sorted(p.parent.name for p in self.root.glob(f"{run_id}*/run.json")) if self.root.is_dir() else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            shown = "\n".join(f"    {m}" for m in matches[:20]) + (
                f"\n    ... and {len(matches) - 20} more" if len(matches) > 20 else ""
            )
            raise InputError(
                f"run id prefix {run_id!r} matches {len(matches)} runs:\n{shown}\n  fix: type more of the id"
            )
        return run_id

    def load(self, run_id: str) -> RunRecord:
        """The record of run `run_id`, or of the one run whose id starts with it."""
        run_id = self.resolve(run_id)
        path = self.run_dir(run_id) / "run.json"
        try:
            return _read_record(path)
        except FileNotFoundError:
            known = ", ".join(r.run_id for r in self.list()[-5:]) or "none yet"
            raise InputError(
                f"no run {run_id!r} on this machine\n  known runs: {known}\n  fix: `skygreen status` lists the runs"
            ) from None

    def list(self) -> list[RunRecord]:
        """All runs, oldest first."""
        if not self.root.is_dir():
            return []
        records = []
        for path in self.root.glob("*/run.json"):
            try:
                records.append(_read_record(path))
            except (OSError, SkygreenError):
                continue  # a foreign or damaged file does not hide the other runs
        return sorted(records, key=lambda r: (r.created_at, r.run_id))

    def latest(self) -> RunRecord | None:
        """The run created last; None when there are none."""
        records = self.list()
        return records[-1] if records else None


def checkpoint_target(target: str) -> str:
    """A URL or existing path as given; otherwise a run id, resolved to its checkpoint URL."""
    if "://" in target or Path(target).exists():
        return target
    return Registry().load(target).checkpoint_url


def _read_record(path: Path) -> RunRecord:
    """The record in run.json at `path`. `FileNotFoundError` when there is none; `SkygreenError`
    for any file that is not a record (not JSON, not an object, a field missing or of the wrong
    kind), so that a damaged record reads as such rather than as an internal error."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"it holds a JSON {type(data).__name__}, not an object")
        return RunRecord.from_json(data)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, TypeError, KeyError, AttributeError, InputError) as e:
        problem = (str(e).splitlines() or [type(e).__name__])[0]
        raise SkygreenError(
            f"run record {path} is unreadable: {problem}\n"
            f"  fix: repair the file, or delete {path.parent} to forget this run (its bucket is left as is)"
        ) from e
