"""What a trainer that owns its loop gets from skygreen: the runtime's parts, around folder checkpoints.

`sg.Run` builds the runtime's parts around the user's own loop. The trainer integrations
(`skygreen.integrations.transformers`, `.lightning`) open the same parts, through the runtime's
public surface (`skygreen.runtime.open_checkpointer`, `open_services`), around a loop the framework
drives, and only ever talk to `TrainerServices`:

- the run's settings (`SKYGREEN_*`, rendered by `skygreen up`), its world and its store in the
  bucket (the checkpointer's, `<bucket>/<run_id>`);
- folder checkpoints (`skygreen.checkpoint.folders`): restore the newest that verifies, commit
  each one the trainer saves, retention by the task's `keep`. The framework writes its own
  checkpoint files, so they are committed as folders, not through `Checkpointer.save_state`;
- the power cap and energy meter (`RunServices.governor`), with energy counted across restarts
  through the commits' meta;
- the run ledger and the budget (`RunServices.book`), so `status`, `cost`, `compare` and
  `report` read a trainer's run as they read an own-loop one;
- the cloud's preemption notice and SIGTERM (`RunServices.preemption`);
- early stopping on evaluation metrics (`RunServices.stopper`);
- the task's `checkpoint.every` (`skygreen.runtime.open_schedule`, the schedule `sg.Run` keeps):
  when it is due, the callback asks the trainer to save, beside the saves the script asks for.

What each framework's callback does with these is the same, so it is decided here: after each
step (`after_step`: save, stop, or exit after SIGTERM), the preempted exit (`exit_preempted`)
and the smoke test's round trip (`smoke_round_trip`); the callbacks only translate.

torch is imported when the parts are opened (`start`), not with this module.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from skygreen.checkpoint.folders import RestoredFolder, commit_and_retain, folder_files, mark_completed, restore_latest
from skygreen.checkpoint.manifest import Manifest, run_meta
from skygreen.checkpoint.store import Store
from skygreen.checkpoint.traffic import committed_bytes
from skygreen.errors import RuntimeSetupError, SkygreenError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.ledger.records import BUDGET, COMPLETED, EARLY_STOPPED, FAILED, PREEMPTED
from skygreen.task.settings import SMOKE_ENV, SMOKE_FAILED, SMOKE_LINE, RuntimeSettings

if TYPE_CHECKING:
    from skygreen.checkpoint.interval import CheckpointSchedule
    from skygreen.runtime import Checkpointer, RunServices, World

log = logging.getLogger("skygreen.integrations")

SMOKE_STEPS = 2
"""The smoke test trains this many optimizer steps, saves, restores, and stops."""
ENERGY_META = "energy_j"
EARLY_STOP_META = "early_stop"

__all__ = [
    "BUDGET",
    "COMPLETED",
    "EARLY_STOPPED",
    "FAILED",
    "PREEMPTED",
    "PREEMPTED_EXIT_CODE",
    "SMOKE_FAILED",
    "SMOKE_LINE",
    "SMOKE_STEPS",
    "StepVerdict",
    "TrainerServices",
    "fail_script",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepVerdict:
    """What a trainer does after an optimizer step, whatever the framework's words for it."""

    save: bool = False
    """Save a checkpoint now (`checkpoint.every` is due, a preemption notice, or any stop below)."""
    stop: bool = False
    """Stop training after that save (budget, early stopping, SIGTERM, the smoke test's bound)."""
    exit_preempted: bool = False
    """SIGTERM: once the save is committed, exit with `PREEMPTED_EXIT_CODE` (`exit_preempted`)."""


@dataclass(kw_only=True)
class TrainerServices:
    """skygreen's parts for one training process whose loop a framework drives."""

    settings: RuntimeSettings
    world: World
    checkpointer: Checkpointer
    smoke: bool = False
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    parts: RunServices | None = None
    """The runtime's parts (`open_services`), opened by `start` once the device is known."""
    energy_base_j: float = 0.0
    frozen_base: Mapping[str, Any] | None = None
    """A PEFT model's frozen base (`skygreen.runtime.frozen_base`), kept in each commit's meta."""
    stop_reason: str | None = None
    """Why training stops early: PREEMPTED, BUDGET or EARLY_STOPPED; None while it goes on."""
    wall_base_s: float = 0.0
    """Training time of earlier lives, from the restored commit's meta."""
    preemptions_base: int = 0
    """Preemptions earlier lives counted, from the restored commit's meta."""
    _stopper_state: dict[str, Any] | None = None
    _first_step: bool = False
    _scratch: tempfile.TemporaryDirectory[str] | None = None
    _started_s: float = field(default_factory=time.monotonic)
    _last_commit: Manifest | None = None
    _last_commit_s: float | None = None
    _interval_s: float | None = None
    schedule: CheckpointSchedule | None = None
    """The task's `checkpoint.every` (`skygreen.runtime.open_schedule`), opened by `start`; None in the smoke test."""
    _scheduled_step: int | None = None

    # -- setup -----------------------------------------------------------------------------

    @classmethod
    def from_env(cls, *, trainer: str, environ: Mapping[str, str] | None = None) -> TrainerServices:
        """The services of a run started by `skygreen up` (or `--local`, or the smoke test).

        Args:
            trainer: the integration asking (`transformers`, `lightning`), checked against the task.
            environ: the process environment (default `os.environ`).

        Returns:
            The services, parts not opened yet: `restore`, then `start` before the first step.

        Raises:
            RuntimeSetupError: the script was not started by skygreen (no run id or bucket), or
                the task says another trainer drives the loop.
        """
        import skygreen.runtime as sg

        environ = dict(os.environ if environ is None else environ)
        settings = RuntimeSettings.from_env(environ)
        if settings.trainer not in (None, trainer):
            raise RuntimeSetupError(
                f"the task says `trainer: {settings.trainer}`, and this script uses skygreen's {trainer} callback\n"
                f"  fix: set `trainer: {trainer}` in the task's skygreen section (or remove checkpoint.dir)"
            )
        world = sg.World.from_env(environ)
        return cls(
            settings=settings,
            world=world,
            checkpointer=sg.open_checkpointer(settings, world=world),
            smoke=environ.get(SMOKE_ENV) == "1",
            environ=environ,
        )

    @property
    def store(self) -> Store:
        """The run's bucket folder, `<bucket>/<run_id>`."""
        return self.checkpointer.store

    @property
    def is_writer(self) -> bool:
        """Rank 0 commits checkpoints and writes the ledger."""
        return self.world.leader

    @property
    def sigterm(self) -> bool:
        """Whether SIGTERM arrived since `start`."""
        return self.parts is not None and self.parts.preemption.sigterm

    def scratch_dir(self) -> Path:
        """A throw-away folder for the smoke test's checkpoints, removed with the services."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="skygreen-smoke-out-")
        return Path(self._scratch.name)

    # -- checkpoints -----------------------------------------------------------------------

    def restore(self, parent: str | Path) -> RestoredFolder | None:
        """Restore the newest verified checkpoint folder under `parent`.

        Its meta seeds the energy count and early stopping.
        """
        restored = self._restore(parent)
        if restored is not None:
            meta = restored.manifest.meta
            self.energy_base_j = float(meta.get(ENERGY_META) or 0.0)
            self.wall_base_s = float(meta.get("wall_s") or 0.0)
            self.preemptions_base = int(meta.get("preemptions") or 0)
            interval_s = meta.get("checkpoint_interval_s")
            self._interval_s = None if interval_s is None else float(interval_s)
            if isinstance(meta.get(EARLY_STOP_META), Mapping):
                self._stopper_state = dict(meta[EARLY_STOP_META])
        return restored

    def _restore(self, parent: str | Path) -> RestoredFolder | None:
        """Restore the newest verified checkpoint folder under `parent`, here or on local rank 0.

        A single process restores; several on a node leave it to local rank 0 where they can
        meet (a process group, or a torchrun launch), else each restores for itself.
        """
        if self.world.size == 1 or self.smoke:
            return restore_latest(self.store, parent)
        from skygreen.integrations.node_restore import launch_token, restore_per_node

        barrier = _group_barrier()
        token = launch_token(self.environ)
        if barrier is None and token is None:
            return restore_latest(self.store, parent)
        return restore_per_node(self.store, parent, local_rank=self.world.local_rank, token=token, barrier=barrier)

    def ranks_saved(self) -> None:
        """Every rank calls this once the framework saved its part of a checkpoint folder.

        With several ranks in a process group they meet here, so the commit (rank 0) holds every
        rank's files (HF's Trainer writes `rng_state_<rank>.pth` on each rank, with no barrier
        before its save callback).
        """
        barrier = _group_barrier() if self.world.size > 1 else None
        if barrier is not None:
            barrier()

    def commit(self, folder: str | Path, *, step: int, samples: int = 0, state: str = "running") -> None:
        """Commit the checkpoint folder the trainer just saved, apply retention, book progress."""
        if not self.is_writer:
            return
        parts = self.parts
        now_s = time.monotonic()
        if self._last_commit_s is not None:  # the cadence as measured, where the schedule counts steps
            self._interval_s = now_s - self._last_commit_s
        if self.schedule is not None and self.schedule.interval_s is not None:
            self._interval_s = self.schedule.interval_s
        meta = run_meta(
            state=state,
            run_id=self.settings.run_id,
            energy_j=self.energy_j(),
            wall_s=self.wall_base_s + (now_s - self._started_s),
            preemptions=self.preemptions_base + int(self.stop_reason == PREEMPTED),
            samples_seen=samples,
            world_size=self.world.size,
            checkpoint_interval_s=self._interval_s,
            **(self.schedule.cost_meta() if self.schedule is not None else {}),
            precision=self.settings.precision,
            power=parts.governor.summary() if parts is not None else None,
        )
        if self.frozen_base:
            from skygreen.runtime.frozen_base import FROZEN_BASE_META

            meta[FROZEN_BASE_META] = dict(self.frozen_base)
        stopper = parts.stopper if parts is not None else None
        if stopper is not None:
            meta[EARLY_STOP_META] = stopper.state_dict()
        self._last_commit = commit_and_retain(
            self.store,
            folder,
            step=step,
            keep=self.settings.checkpoint_keep,
            metric=stopper.best if stopper is not None else None,
            metric_mode=self.settings.early_stop.mode if self.settings.early_stop else "min",
            meta=meta,
        )
        self._last_commit_s = now_s
        if parts is not None and parts.book is not None:
            parts.book.progress(step=step, samples=samples, energy_j=self.energy_j())

    def hold_if_asked(self, step: int) -> None:
        """After the commit of `step`, wait there when a test asks.

        The steps come from `SKYGREEN_TEST_HOLD_AT_STEPS` (`skygreen.runtime.hold`), so whatever
        kills the run never races it.
        """
        from skygreen.runtime.hold import hold, hold_steps

        if step in hold_steps(self.environ):
            hold(step, stopped=lambda: self.sigterm, environ=self.environ)

    # -- the run's life --------------------------------------------------------------------

    def warn_if_not_resumed(self, restored: str | None, *, step: int, argument: str) -> None:
        """Warn when the framework starts at step 0 although a checkpoint was restored.

        The script does not hand the restored checkpoint to the framework (`argument` names how).
        """
        if restored and step == 0:
            log.warning(
                "a checkpoint was restored to %s, and the Trainer starts from step 0: pass %s", restored, argument
            )

    def start(self, *, step: int, samples: int = 0, total_steps: int | None = None, device: Any = None) -> None:
        """Before the first step: open the runtime's parts and start them.

        Opens the parts on `device` (CPU when None), then starts the power cap, the ledger segment
        and the preemption watch. A setup error here ends the script as one at the callback's
        construction does (`fail_script`), not as a traceback out of the framework's `train()` or
        `fit()`: what already started is stopped first (the power limit put back; a ledger segment
        is closed as failed only if it was begun), so nothing is left half-written.

        Args:
            step: the step the framework starts at (the resumed step, or 0).
            samples: samples seen before that step.
            total_steps: where training runs to; None if unknown.
            device: the framework's torch device (CPU when None).

        Raises:
            SystemExit: a setup error: `power.required` and the cap cannot be applied, an
                unknown `SKYGREEN_CLOUD`, a bad runtime variable, an unusable bucket (exit 2 for
                bad input, with the message and its fix; the `SkygreenError` itself, with its
                traceback, when SKYGREEN_DEBUG=1).
        """
        if self.parts is not None:
            return
        try:
            self._start(step=step, samples=samples, total_steps=total_steps, device=device)
        except SkygreenError as e:
            self.close(step=step, samples=samples, end=FAILED)
            fail_script(e, smoke=self.smoke)

    def _start(self, *, step: int, samples: int, total_steps: int | None, device: Any) -> None:
        """`start`'s work, without the handling of its errors.

        The book joins the parts only once its segment is begun, so that a failure before then
        closes no segment that was never written.
        """
        import torch

        import skygreen.runtime as sg

        parts = sg.open_services(
            self.settings,
            device=torch.device(device if device is not None else "cpu"),
            world=self.world,
            environ=self.environ,
            checkpointer=self.checkpointer,
            smoke=self.smoke,
        )
        book, parts.book = parts.book, None
        self.parts = parts
        if parts.stopper is not None and self._stopper_state is not None:
            parts.stopper.load_state_dict(self._stopper_state)
        if not self.smoke:
            self.schedule = sg.open_schedule(
                self.settings, environ=self.environ, start_step=step, start_s=time.monotonic()
            )
        parts.governor.start(None)
        if book is not None:
            book.started(
                step=step, samples=samples, samples_per_epoch=None, energy_j=self.energy_j(), total_steps=total_steps
            )
            parts.book = book
        parts.preemption.start()

    def step_done(self, *, step: int, samples: int = 0) -> None:
        """After each optimizer step: power profile, budget; sets `stop_reason` when it must stop."""
        parts = self.parts
        if parts is None:
            return
        parts.governor.step_done()
        if parts.book is not None:
            if not self._first_step:
                self._first_step = True
                parts.book.step_started()
            if parts.over_budget() and self.stop_reason is None:
                log.warning("%s", parts.book.stop_message())
                self.stop_reason = BUDGET
        if parts.preemption.sigterm and self.stop_reason is None:
            self.stop_reason = PREEMPTED

    def after_step(self, *, step: int, samples: int = 0, start_step: int = 0) -> StepVerdict:
        """After each optimizer step: power and budget (`step_done`), then what the trainer must do.

        Save for a preemption notice; save and stop for a budget, an early stop or the smoke
        test's bound (`SMOKE_STEPS` after `start_step`); save and exit after SIGTERM.
        """
        self.step_done(step=step, samples=samples)
        notice, due = self.notice_pending(), self._due(step)
        if self.world.size > 1 and not self.smoke:  # every rank saves at the same step, or none does
            notice, due = self.world.agree(notice, due and self.world.leader)  # rank 0 measures a save's bytes
        if notice:
            log.warning("preemption notice: saving a checkpoint now")
        smoke_done = self.smoke and step - start_step >= SMOKE_STEPS
        stop = self.stop_reason is not None or smoke_done
        return StepVerdict(save=notice or stop or due, stop=stop, exit_preempted=self.stop_reason == PREEMPTED)

    def _due(self, step: int) -> bool:
        """Whether `checkpoint.every` asks for a save after `step`.

        Asked once per step: Lightning calls its batch hook after every micro-batch, and only the
        first call of a step comes right after the optimizer step.
        """
        if self.schedule is None or step == self._scheduled_step:
            return False
        self._scheduled_step = step
        return self.schedule.due(step, time.monotonic())

    def saved(self, step: int, *, save_cost_s: float | None = None) -> None:
        """Every rank calls this once the framework saved the checkpoint of `step`, whoever asked.

        The schedule counts its interval from there.

        Args:
            step: the step saved.
            save_cost_s: how long training waited for a save the callback asked for (the write
                and the commit), which the auto interval is derived from; None where unknown.
        """
        if self.schedule is not None:
            self.schedule.saved(
                step, time.monotonic(), save_cost_s=save_cost_s, save_bytes=committed_bytes(self.checkpointer.store)
            )

    def exit_preempted(self, *, step: int, samples: int = 0) -> NoReturn:
        """After SIGTERM, once the checkpoint of `step` is committed, end the process.

        Closes the ledger segment as preempted and exits with the code SkyPilot's recovery
        restarts.
        """
        self.stop_reason = PREEMPTED
        self.close(step=step, samples=samples)
        log.warning("SIGTERM: checkpoint of step %d committed; exiting for the restart", step)
        raise SystemExit(PREEMPTED_EXIT_CODE)

    def smoke_round_trip(
        self,
        saved: Mapping[str, Path],
        *,
        step: int,
        line: str,
        loads: Callable[[Path], str | None] | None = None,
    ) -> NoReturn:
        """End the smoke test: check the newest commit restores as the trainer saved it.

        Restores the newest commit into a scratch folder, compares it file by file with what the
        trainer saved, prints the smoke line and exits 0 (1 on a mismatch).

        Args:
            saved: the committed checkpoint's files by their name inside the commit.
            step: the step the checkpoint was saved at; the restored commit must be that one.
            line: what follows the smoke line's prefix, naming the framework and the checkpoint.
            loads: reads the restored folder as the framework would; returns what failed, or None.
        """
        with tempfile.TemporaryDirectory(prefix="skygreen-smoke-restore-") as scratch:
            restored = restore_latest(self.store, scratch)
            failed: str | None = "the checkpoint did not come back identical"
            if restored is not None and restored.step == step:
                back = dict(folder_files(restored.path))
                if back.keys() == saved.keys() and all(back[n].read_bytes() == saved[n].read_bytes() for n in saved):
                    failed = loads(restored.path) if loads is not None else None
        self.close(step=step)
        if failed is not None:
            print(f"{SMOKE_FAILED} load: {failed}", flush=True)
            raise SystemExit(1)
        print(f"{SMOKE_LINE}: {line} committed and restored", flush=True)
        raise SystemExit(0)

    def notice_pending(self) -> bool:
        """A preemption notice arrived since the last look (each notice counts once)."""
        return self.parts is not None and self.parts.preemption.notice() is not None

    def evaluated(self, metrics: Mapping[str, Any], step: int) -> bool:
        """Record evaluation metrics; True when early stopping says stop.

        The task's metric is also found under the framework's own name for it (`val_loss` is
        the HF Trainer's `eval_loss`), and filed under the task's name.
        """
        parts = self.parts
        if parts is None:
            return False
        numbers = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        config = self.settings.early_stop
        if config is not None and config.metric not in numbers:
            value = _metric(numbers, config.metric)
            if value is not None:
                numbers[config.metric] = value
        stop = parts.report(numbers, step=step)
        if stop and self.stop_reason is None and config is not None:
            log.info("early stopping: %s did not improve for %d evaluations", config.metric, config.patience)
            self.stop_reason = EARLY_STOPPED
        return self.stop_reason == EARLY_STOPPED

    def energy_j(self) -> float:
        """Joules used by this run so far, earlier lives included."""
        return self.energy_base_j + (self.parts.governor.energy_j() if self.parts is not None else 0.0)

    def close(self, *, step: int, samples: int = 0, end: str | None = None) -> None:
        """Close the ledger segment with how it ended, put the power limit back, stop watching.

        A second call does nothing more.
        """
        parts = self.parts
        end = end or self.stop_reason or COMPLETED
        last = self._last_commit
        if end in (COMPLETED, EARLY_STOPPED) and last is not None and last.step == step and self.is_writer:
            try:  # the final save came before the end was known
                self._last_commit = mark_completed(self.store, last)
            except SkygreenError as e:  # the commit stands; only `status` reads it as not yet completed
                log.warning("could not mark the final checkpoint (step %d) completed: %s", step, e)
        if parts is not None and parts.book is not None:
            parts.book.progress(step=step, samples=samples, energy_j=self.energy_j(), end=end)
            parts.book = None
        if parts is not None:
            parts.close()
        else:
            self.checkpointer.close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def fail_script(error: SkygreenError, *, smoke: bool, phase: str = "setup") -> NoReturn:
    """Stop the trainer's script with skygreen's message and exit code.

    No traceback unless SKYGREEN_DEBUG=1; under the smoke test the smoke's failure line names the
    phase.
    """
    if os.environ.get("SKYGREEN_DEBUG") == "1":
        raise error
    if smoke:
        print(f"{SMOKE_FAILED} {phase}: {error}", flush=True)
    print(f"skygreen: {error}", file=sys.stderr, flush=True)
    raise SystemExit(error.exit_code)


def _group_barrier() -> Callable[[], object] | None:
    """`torch.distributed.barrier` once a process group of several ranks exists, else None."""
    from skygreen.runtime.ranks import distributed

    if not distributed():
        return None
    import torch.distributed as dist

    return dist.barrier


def _metric(metrics: Mapping[str, Any], name: str) -> float | None:
    """The metric by its task name, also under the Trainer's `eval_` prefix (`loss` -> `eval_loss`)."""
    for key in (name, f"eval_{name}", name.removeprefix("eval_"), name.replace("val_", "eval_", 1)):
        if key in metrics and _is_number(metrics[key]):
            return float(metrics[key])
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
