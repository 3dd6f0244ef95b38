"""The folder mode: verified checkpoints for any script that saves checkpoint folders.

`skygreen up` renders a task with `checkpoint.dir` as

    python -m skygreen.folder_mode -- 'THE TASK'S RUN COMMAND'

Around the command this module

1. checks the folder belongs to this run (a marker file holds the run id; a folder with
   checkpoint folders of another run, or of no run, is an error before training starts);
2. restores the newest checkpoint folder that verifies from the bucket into it, and removes
   local checkpoint folders the bucket does not hold (partial saves of a life that died), so
   the script's own "resume from the latest folder" finds only verified ones;
3. starts the command and mirrors each new complete checkpoint folder as a verified,
   manifest-last commit (`skygreen.checkpoint.folders`), then applies the task's `keep` rule;
   complete means the marker file is there (`trainer_state.json`, DCP's `.metadata`) and the
   folder did not change between two looks, or, without a marker, nothing changed for `quiet_s`;
4. on SIGTERM forwards the signal to the command, finishes the commit in flight and commits
   the last complete folder, then exits with the command's code (the rendered run script turns
   a non-zero code after SIGTERM into the preempted code SkyPilot recovers).

Under `SKYGREEN_SMOKE=1` it runs the command only until its first complete checkpoint folder,
commits it, restores it into a scratch folder, compares every file, stops the command, removes
the checkpoint folders the command wrote, and prints the smoke line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from skygreen.checkpoint.folders import (
    TEMP_PREFIX,
    commit_and_retain,
    committed_folder_steps,
    folder_files,
    folder_step,
    mark_completed,
    restore_latest,
)
from skygreen.checkpoint.manifest import Manifest, read_manifest
from skygreen.checkpoint.store import Store, join_url
from skygreen.errors import InputError, SkygreenError
from skygreen.exit_codes import BAD_INPUT, FAILED
from skygreen.ledger.records import BUDGET as BUDGET_END
from skygreen.ledger.records import COMPLETED as COMPLETED_END
from skygreen.ledger.records import FAILED as FAILED_END
from skygreen.ledger.records import PREEMPTED as PREEMPTED_END
from skygreen.task.sections import DEFAULT_QUIET_S
from skygreen.task.settings import SMOKE_ENV, SMOKE_FAILED, SMOKE_LINE, RuntimeSettings

if TYPE_CHECKING:
    from skygreen.runtime import RunBook

log = logging.getLogger("skygreen.folder_mode")

RUN_MARKER = ".skygreen-run"
"""The file in the checkpoint folder that names the run its checkpoint folders belong to."""
POLL_S = 1.0
SMOKE_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 30.0
"""How often the ledger segment's time is written between commits."""

Signature = tuple[tuple[str, int, int], ...]
"""What a folder looks like now: (relative path, size, mtime in ns) of each file."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FolderModeConfig:
    """Where the script saves checkpoint folders and when one counts as complete."""

    dir: Path
    run_id: str
    keep: int = 3
    marker: str | None = None
    quiet_s: float = DEFAULT_QUIET_S

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("FolderModeConfig.run_id must not be empty")
        if not self.quiet_s > 0:
            raise ValueError(f"FolderModeConfig.quiet_s must be > 0, got {self.quiet_s!r}")

    @classmethod
    def from_settings(cls, settings: RuntimeSettings, *, workdir: Path) -> FolderModeConfig:
        """The folder mode's part of the run's settings; `dir` resolved against `workdir`."""
        if not settings.checkpoint_dir:
            raise InputError(
                "the folder mode needs the folder the script saves checkpoints into, and SKYGREEN_CHECKPOINT_DIR is not set\n"
                "  fix: set `checkpoint: {dir: FOLDER}` in the task's skygreen section and start it with `skygreen up`"
            )
        folder = Path(settings.checkpoint_dir).expanduser()
        return cls(
            dir=folder if folder.is_absolute() else workdir / folder,
            run_id=settings.run_id,
            keep=settings.checkpoint_keep,
            marker=settings.checkpoint_marker,
            quiet_s=settings.checkpoint_quiet_s or DEFAULT_QUIET_S,
        )


# ---------------------------------------------------------------------------------------
# Looking at the folder


def checkpoint_folders(root: Path) -> dict[int, Path]:
    """Step -> folder for each checkpoint folder directly under `root` (a name ending in a number)."""
    found: dict[int, Path] = {}
    if not root.is_dir():
        return found
    for child in root.iterdir():
        if child.is_dir() and not child.name.startswith(TEMP_PREFIX):
            step = folder_step(child.name)
            if step is not None:
                found[step] = child
    return found


def signature(folder: Path) -> Signature:
    """The folder's files with sizes and modification times; a file vanishing meanwhile is left out."""
    entries = []
    for relative, path in folder_files(folder):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        entries.append((relative, st.st_size, st.st_mtime_ns))
    return tuple(entries)


@dataclass(kw_only=True, slots=True)
class Completeness:
    """Decides when a checkpoint folder is complete, from successive looks at it."""

    marker: str | None
    quiet_s: float
    clock: Callable[[], float] = time.monotonic
    _seen: dict[Path, tuple[Signature, float]] = field(default_factory=dict)

    def complete(self, folder: Path) -> bool:
        """True once the folder holds the marker and looked the same twice in a row, or (no
        marker) once it looked the same for `quiet_s`."""
        now = self.clock()
        current = signature(folder)
        previous = self._seen.get(folder)
        if previous is None or previous[0] != current:
            self._seen[folder] = (current, now)
            return False
        if not current:
            return False
        if self.marker is not None:
            return (folder / self.marker).is_file()
        return now - previous[1] >= self.quiet_s

    def marked(self, folder: Path) -> bool:
        """Whether the folder holds the marker (with no marker, nothing can be told: False)."""
        return self.marker is not None and (folder / self.marker).is_file()


# ---------------------------------------------------------------------------------------
# Before the command


def claim_folder(config: FolderModeConfig) -> None:
    """Make sure the checkpoint folder is this run's (or empty), and mark it as this run's.

    Raises:
        InputError: the folder holds checkpoint folders of another run, or of no run skygreen
            knows: resuming from them would mix two runs.
    """
    config.dir.mkdir(parents=True, exist_ok=True)
    marker = config.dir / RUN_MARKER
    owner = marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
    folders = checkpoint_folders(config.dir)
    if owner != config.run_id and folders:
        whose = f"run {owner}" if owner else "no skygreen run"
        names = ", ".join(sorted(p.name for p in folders.values())[:3])
        raise InputError(
            f"checkpoint.dir {config.dir} already holds checkpoint folders of {whose} ({names}), "
            f"not of this run {config.run_id}\n"
            "  fix: point checkpoint.dir at an empty folder, or move those folders away; "
            "to continue that run, use `skygreen resume` with its run id"
        )
    marker.write_text(config.run_id + "\n", encoding="utf-8")


def restore_into(config: FolderModeConfig, store: Store) -> int | None:
    """Restore the newest verified commit into the folder and remove local checkpoint folders
    the bucket does not hold (partial saves of the life that died); returns the restored step."""
    restored = restore_latest(store, config.dir)
    committed = set(committed_folder_steps(store))
    for step, folder in sorted(checkpoint_folders(config.dir).items()):
        if step not in committed:
            log.info("removing %s: the bucket holds no verified commit of it", folder)
            shutil.rmtree(folder, ignore_errors=True)
    return restored.step if restored else None


# ---------------------------------------------------------------------------------------
# While the command runs


@dataclass(kw_only=True, slots=True)
class Mirror:
    """Commits each new complete checkpoint folder once, oldest first, then applies retention."""

    config: FolderModeConfig
    store: Store
    completeness: Completeness
    committed: set[int] = field(default_factory=set)
    enabled: bool = True
    """False on nodes other than node 0: they restore, and leave the commits to node 0."""
    last: Manifest | None = None
    """The newest commit this wrapper made."""

    def scan(self, ready: Callable[[Path], bool] | None = None, *, limit: int | None = None) -> list[int]:
        """Commit every complete folder not committed yet (at most `limit`); returns the steps
        committed now. `ready` overrides the completeness rule (once the command ended, a folder
        with its marker needs no second look)."""
        ready = ready or self.completeness.complete
        done: list[int] = []
        if not self.enabled:
            return done
        for step, folder in sorted(checkpoint_folders(self.config.dir).items()):
            if limit is not None and len(done) >= limit:
                break
            if step in self.committed or not ready(folder):
                continue
            self.last = commit_and_retain(
                self.store, folder, step=step, keep=self.config.keep, meta={"run_id": self.config.run_id}
            )
            self.committed.add(step)
            done.append(step)
        return done

    def mark_completed(self) -> None:
        """The command finished: its newest commit says so (`meta["state"]`), as the last commit
        of `sg.Run` and of the trainer callbacks does, so `status` reads the run completed as
        `cost` does from the ledger. A failure leaves the commit as it is, with a warning."""
        if not self.enabled or not self.committed:
            return
        step = max(self.committed)
        try:
            manifest = (
                self.last if self.last is not None and self.last.step == step else read_manifest(self.store, step)
            )
            self.last = mark_completed(self.store, manifest)
        except SkygreenError as e:  # the commit stands; only `status` reads it as not yet completed
            log.warning("could not mark the final checkpoint (step %d) completed: %s", step, e)


@dataclass(kw_only=True, slots=True)
class Supervisor:
    """Runs the command as a child, forwarding SIGTERM and SIGINT to it."""

    command: str
    terminated: bool = False
    child: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        """Start the command and catch SIGTERM and SIGINT for it; returns the child."""
        self.child = subprocess.Popen(["bash", "-c", self.command])
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        return self.child

    def _forward(self, signum: int, _frame: object) -> None:
        self.terminated = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def stop(self) -> None:
        """End the child (SIGTERM, then SIGKILL after a grace period)."""
        if self.child is None or self.child.poll() is not None:
            return
        self.child.terminate()
        try:
            self.child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def exit_code(returncode: int) -> int:
    """A child's code as a shell reports it: 128 + N for a child ended by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run(
    command: str,
    config: FolderModeConfig,
    store: Store,
    *,
    poll_s: float = POLL_S,
    book: RunBook | None = None,
    mirrors: bool = True,
) -> int:
    """Restore, run `command` while mirroring its checkpoint folders, commit the last ones;
    returns the command's exit code (0 after a budget stop).

    With a `book` (rank 0 of a `skygreen up` run) this VM's ledger segment is written: wall
    time from the command's start, the step of the newest committed folder, no energy (the
    wrapper cannot meter the script's GPU), and how it ended, so `status`, `cost`, `compare` and
    `report` read the run. Budget alerts go out as for an own-loop run; at the budget the
    command gets SIGTERM (its last complete folder is committed) and the run ends with state
    `budget`.

    Every node restores into its own disk; only a node that `mirrors` (node 0, `node_mirrors`)
    commits folders and applies retention, so the bucket gets one commit per checkpoint."""
    claim_folder(config)
    restored = restore_into(config, store)
    log.info("folder mode: %s", f"resumed from step {restored}" if restored is not None else "no checkpoint yet")
    mirror = Mirror(
        config=config,
        store=store,
        completeness=Completeness(marker=config.marker, quiet_s=config.quiet_s),
        committed=set(committed_folder_steps(store)),
        enabled=mirrors,
    )
    ledger = SegmentLog(book=book, step=restored or 0)
    supervisor = Supervisor(command=command)
    child = supervisor.start()
    ledger.started()
    over_budget = False
    while child.poll() is None:
        ledger.progress(mirror.scan(), mirror.committed)
        if not over_budget and ledger.over_budget():
            over_budget = True
            supervisor.stop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=poll_s)
    code = exit_code(child.returncode)
    # The folder the command saved last, before it ended. Nobody writes now: with a marker, a
    # folder holding it is complete; without one, only a command that succeeded finished its saves.
    mirror.scan(mirror.completeness.marked if config.marker else (lambda _folder: code == 0))
    if over_budget:
        ledger.ended(mirror.committed, BUDGET_END)
        return 0
    if code == 0:
        mirror.mark_completed()
    ledger.ended(
        mirror.committed, COMPLETED_END if code == 0 else PREEMPTED_END if supervisor.terminated else FAILED_END
    )
    return code


@dataclass(kw_only=True, slots=True)
class SegmentLog:
    """This VM's ledger segment as the wrapper sees the run: the command's wall time and the
    newest committed step; nothing when there is no book."""

    book: RunBook | None
    step: int
    progress_every_s: float = PROGRESS_EVERY_S
    _written_at: float = 0.0

    def started(self) -> None:
        """The command started: the segment begins at the restored step, its time counts from now."""
        if self.book is not None:
            self.book.started(step=self.step, samples=0, samples_per_epoch=None, energy_j=0.0)
            self.book.step_started()
            self._written_at = time.monotonic()

    def progress(self, new: list[int], committed: set[int]) -> None:
        """Write progress after a commit, and every `progress_every_s` for the time."""
        if self.book is None:
            return
        if not new and time.monotonic() - self._written_at < self.progress_every_s:
            return
        self.step = max(committed, default=self.step)
        self.book.progress(step=self.step, samples=0, energy_j=0.0)
        self._written_at = time.monotonic()

    def over_budget(self) -> bool:
        """Whether the run's spend reached its budget (alerts due now are sent on the way)."""
        if self.book is None or not self.book.over_budget():
            return False
        log.warning("%s", self.book.stop_message())
        return True

    def ended(self, committed: set[int], end: str) -> None:
        """Close the segment with how the command ended."""
        if self.book is not None:
            self.step = max(committed, default=self.step)
            self.book.progress(step=self.step, samples=0, energy_j=0.0, end=end)


def node_mirrors(environ: Mapping[str, str]) -> bool:
    """Whether this node commits the folders: node 0 of a multi-node run (`SKYPILOT_NODE_RANK`).
    Each node of a multi-node run saves its own copy of the folder; one commit per step is enough."""
    return environ.get("SKYPILOT_NODE_RANK", "0") in ("", "0")


def open_book(settings: RuntimeSettings, store: Store, environ: Mapping[str, str]) -> RunBook | None:
    """The run book of the node that writes the ledger (node 0 of a `skygreen up` run), without
    energy metering; None on other nodes and in the smoke test."""
    if environ.get(SMOKE_ENV) == "1" or not node_mirrors(environ):
        return None
    import skygreen.runtime as sg

    return sg.RunBook(
        store=store,
        settings=settings,
        device_name=None,
        gpu_count=0,
        environ=environ,
        started_at=time.time(),
        metering=False,
    )


def smoke(command: str, config: FolderModeConfig, store: Store, *, poll_s: float = 0.2) -> int:
    """Run the command until its first complete checkpoint folder, round-trip that folder through
    the bucket, stop the command and remove the folders it wrote; prints the smoke line."""
    config.dir.mkdir(parents=True, exist_ok=True)
    before = set(checkpoint_folders(config.dir))
    supervisor = Supervisor(command=command)
    try:
        code, line = _smoke_round_trip(supervisor, config, store, before, poll_s=poll_s)
    finally:
        supervisor.stop()
        for step, folder in checkpoint_folders(config.dir).items():
            if step not in before:
                shutil.rmtree(folder, ignore_errors=True)
    print("\n" + line, flush=True)  # on a line of its own, after the command's last output
    return code


def _smoke_round_trip(
    supervisor: Supervisor, config: FolderModeConfig, store: Store, before: set[int], *, poll_s: float
) -> tuple[int, str]:
    mirror = Mirror(config=config, store=store, completeness=Completeness(marker=config.marker, quiet_s=config.quiet_s))
    mirror.committed.update(before)
    child = supervisor.start()
    started = time.monotonic()
    while not mirror.committed - before:
        if child.poll() is not None:
            mirror.scan(mirror.completeness.marked if config.marker else (lambda _folder: True), limit=1)
            if mirror.committed - before:
                break
            return FAILED, (
                f"{SMOKE_FAILED} checkpoint: the command exited {exit_code(child.returncode)} before saving "
                f"a complete checkpoint folder into {config.dir}\n"
                "  fix: make the script save a checkpoint early when SKYGREEN_TASK_SIZE=small, and check that "
                "checkpoint.dir (and checkpoint.marker) match where and how it saves"
            )
        if time.monotonic() - started > SMOKE_TIMEOUT_S:
            return FAILED, f"{SMOKE_FAILED} checkpoint: no complete checkpoint folder in {config.dir}"
        mirror.scan(limit=1)
        time.sleep(poll_s)
    with tempfile.TemporaryDirectory(prefix="skygreen-smoke-restore-") as scratch:
        restored = restore_latest(store, scratch)
        step = restored.step if restored is not None else min(mirror.committed - before)
        original = checkpoint_folders(config.dir).get(step)
        same = restored is not None and original is not None and _same_files(restored.path, original)
    if not same:
        return FAILED, f"{SMOKE_FAILED} load: checkpoint folder of step {step} did not come back identical"
    return 0, f"{SMOKE_LINE}: folder mode: checkpoint folder of step {step} committed and restored"


def _same_files(a: Path, b: Path) -> bool:
    files_a, files_b = folder_files(a), folder_files(b)
    if [r for r, _ in files_a] != [r for r, _ in files_b]:
        return False
    return all(pa.read_bytes() == pb.read_bytes() for (_, pa), (_, pb) in zip(files_a, files_b, strict=True))


# ---------------------------------------------------------------------------------------
# Entry point


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m skygreen.folder_mode -- COMMAND`: the VM side of the folder mode."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    _show_logs()
    if not args:
        print("usage: python -m skygreen.folder_mode -- 'COMMAND'", file=sys.stderr)
        return BAD_INPUT
    command = args[0] if len(args) == 1 else " ".join(_quote(a) for a in args)
    try:
        settings = RuntimeSettings.from_env()
        config = FolderModeConfig.from_settings(settings, workdir=Path.cwd())
        from skygreen.checkpoint.store_factory import open_store
        from skygreen.checkpoint.traffic import counted

        store = counted(open_store(join_url(settings.bucket, settings.run_id)))
        if os.environ.get(SMOKE_ENV) == "1":
            return smoke(command, config, store)
        return run(
            command, config, store, book=open_book(settings, store, os.environ), mirrors=node_mirrors(os.environ)
        )
    except SkygreenError as e:
        if os.environ.get("SKYGREEN_DEBUG") == "1":
            raise
        print(f"skygreen: {e}", file=sys.stderr)
        return e.exit_code


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _show_logs() -> None:
    logger = logging.getLogger("skygreen")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("skygreen: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


if __name__ == "__main__":
    sys.exit(main())
