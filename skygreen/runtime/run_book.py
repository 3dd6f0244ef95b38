"""The run book: this VM's segment of the run ledger and the run's budget, on rank 0.

A trainer calls it at a handful of points (started, first step, metrics reported, checkpoint
saved, budget check at step boundaries, ended); it exists on rank 0 only, and not in the smoke
test (`RunBook.open` returns None there). Energy comes from the runtime's meter
(`counters["energy_j"]`, cumulative across restarts); `energy_j` stays None on CPU where
nothing is metered. No torch here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skygreen.checkpoint.store import Store
from skygreen.ledger.budget import (
    DEFAULT_ALERT_FRACTIONS,
    BudgetPolicy,
    BudgetTracker,
    StoredCheckpoints,
    send,
    stop_message,
)
from skygreen.ledger.changeover import read_setup, stamp_paths
from skygreen.ledger.io import LedgerWriter
from skygreen.ledger.place import current_place, gpu_catalog_name
from skygreen.ledger.records import KILLED, PREEMPTED
from skygreen.runtime.state import TrainingState
from skygreen.settings import RuntimeSettings

if TYPE_CHECKING:
    from skygreen.runtime.ranks import World  # torch; the book needs none

log = logging.getLogger("skygreen.runtime")

BUDGET_CHECK_EVERY_S = 1.0
"""Spend grows with time, not steps: checking once a second is plenty and costs nothing."""


HEARTBEAT_ENV = "SKYGREEN_LEDGER_HEARTBEAT_S"
HEARTBEAT_S = 30.0
"""Seconds between ledger heartbeats (`RunBook.tick`): one small write to the bucket each."""


VM_STARTED_MAX_AGE_S = 6 * 3600.0
"""A note older than this is another life's (a reused image); the process start is used then."""


def vm_started_at(environ: Mapping[str, str], *, run_id: str, now_s: float) -> float:
    """When this VM began: the run's setup stamp on a SkyPilot cluster (`setup.sh.tmpl`'s first
    line, `skygreen.ledger.changeover.stamp_paths`; setup and restore are paid time too), else
    now. A stamp from the future or older than `VM_STARTED_MAX_AGE_S` is ignored."""
    if not environ.get("SKYPILOT_CLUSTER_INFO") or not environ.get("HOME"):
        return now_s
    try:
        noted = float(stamp_paths(run_id, Path(environ["HOME"]))[0].read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return now_s
    return noted if 0.0 <= now_s - noted <= VM_STARTED_MAX_AGE_S else now_s


def _float_env(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


def _int_env(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(environ.get(name, "") or default)
    except ValueError:
        return default


class RunBook:
    """Rank 0's ledger writer and budget tracker for one process.

    Args:
        store: the run's checkpoint store (the ledger lives beside the checkpoints).
        settings: the run's settings (run id, budget, alerts, webhook variable's name).
        device_name: the GPU's name (None or "cpu" on CPU), priced from the plan's offers.
        gpu_count: GPUs on this node.
        environ: where the place (cloud, region, offers) and the webhook URL are read.
        started_at: epoch seconds this process started.
        metering: whether energy is measured; else the segment's energy is None.
    """

    def __init__(
        self,
        *,
        store: Store,
        settings: RuntimeSettings,
        device_name: str | None,
        gpu_count: int,
        environ: Mapping[str, str],
        started_at: float,
        metering: bool = False,
    ) -> None:
        gpu = gpu_catalog_name(device_name) if device_name and device_name != "cpu" else None
        self.place = current_place(environ, gpu=gpu, gpu_count=gpu_count if gpu else 0)
        self.writer = LedgerWriter(
            store, run_id=settings.run_id, place=self.place, started_at=started_at, user=settings.user
        )
        webhook_env = settings.budget_webhook_env
        self.policy = BudgetPolicy(
            budget_usd=settings.budget_usd,
            alert_fractions=settings.budget_alerts or DEFAULT_ALERT_FRACTIONS,
            burn_usd_per_hour=settings.burn_alert_usd_per_hour,
            webhook_url=environ.get(webhook_env) if webhook_env else None,
        )
        if webhook_env and not self.policy.webhook_url:
            log.warning("budget alert webhook: $%s is not set; alerts go to the log only", webhook_env)
        self.tracker: BudgetTracker | None = None
        self._last_check_s = 0.0
        self.heartbeat_s = _float_env(environ, HEARTBEAT_ENV, HEARTBEAT_S)
        self._last_beat_s: float | None = None
        self.metering = metering
        """Whether energy is measured (a GPU's counter or a simulated board): else energy_j is None."""

    @classmethod
    def open(
        cls,
        settings: RuntimeSettings,
        *,
        store: Store,
        world: World,
        device_name: str | None,
        environ: Mapping[str, str],
        metering: bool,
        smoke: bool = False,
    ) -> RunBook | None:
        """The run book of this process: on rank 0 outside the smoke test, else None.

        Args:
            settings: the run's settings.
            store: the run's checkpoint store.
            world: this process's rank; GPUs per node are torchrun's LOCAL_WORLD_SIZE (SkyPilot's
                count wins in the place).
            device_name: the GPU's name, None on CPU.
            environ: where the place and the webhook URL are read.
            metering: whether energy is measured.
            smoke: the CPU smoke test (no book).

        Returns:
            The book, or None on ranks other than 0 and in the smoke test.
        """
        if not world.leader or smoke:
            return None
        return cls(
            store=store,
            settings=settings,
            device_name=device_name,
            gpu_count=_int_env(environ, "LOCAL_WORLD_SIZE", 1) if device_name else 0,
            environ=environ,
            started_at=vm_started_at(environ, run_id=settings.run_id, now_s=time.time()),
            metering=metering,
        )

    def started_from(
        self,
        training: TrainingState,
        *,
        samples_per_epoch: int | None,
        total_steps: int | None,
        restored: Mapping[str, float | int] | None = None,
    ) -> None:
        """After the resume: the step, samples and energy the run continues from, and this VM's
        changeover so far: the setup script's stamps (read here) and `restored`, the restore the
        run timed (`skygreen.ledger.changeover.restore_figures`; None when it started fresh).

        Args:
            training: the training state as restored (step, samples, cumulative energy).
            samples_per_epoch: the dataset's length; None if unknown.
            total_steps: where the loop runs to (progress's denominator); None if unknown.
            restored: the restore's figures, or None on a fresh start.
        """
        # the segment itself starts at setup's stamp on a cloud VM (`vm_started_at`): stamps
        # are read against now, which is after setup ended and this process started
        setup = read_setup(self.writer.segment.run_id, home=Path.home(), process_started_at=time.time())
        self.started(
            step=training.step,
            samples=training.samples_seen,
            samples_per_epoch=samples_per_epoch,
            energy_j=training.counters["energy_j"],
            total_steps=total_steps,
            changeover={**setup, **(restored or {})},
        )

    def progress_of(self, training: TrainingState, end: str = "running") -> None:
        """Write the run's step, samples and energy so far; `end` other than `running` closes the
        segment with that ending (completed, preempted, budget, ...).

        Args:
            training: the training state now.
            end: `running`, or how the segment ended.
        """
        self.progress(
            step=training.step, samples=training.samples_seen, energy_j=training.counters["energy_j"], end=end
        )

    def exited(self, training: TrainingState, exc_type: type[BaseException]) -> None:
        """The training loop left with an exception: cancelled (Ctrl-C) or failed. SystemExit
        is the runtime's own exit (preempted, budget), already written.

        Args:
            training: the training state at the exception.
            exc_type: the exception's type; KeyboardInterrupt writes `cancelled`, others `failed`.
        """
        if not issubclass(exc_type, SystemExit):
            self.progress_of(training, "cancelled" if issubclass(exc_type, KeyboardInterrupt) else "failed")

    def started(
        self,
        *,
        step: int,
        samples: int,
        samples_per_epoch: int | None,
        energy_j: float,
        total_steps: int | None = None,
        changeover: Mapping[str, Any] | None = None,
    ) -> None:
        """Write this VM's segment at its resume point, after reading the earlier ones.

        `energy_j` is the meter's cumulative joules, the base this segment's energy is counted
        from; `total_steps` is where the loop runs to (progress's denominator). With a budget or
        a burn alert set, spend tracking starts here; a VM whose price is unknown gets a warning
        and its time is not counted.

        Args:
            step: the step the run resumes at.
            samples: samples seen at that step.
            samples_per_epoch: the dataset's length; None if unknown.
            energy_j: the meter's cumulative joules, in J.
            total_steps: where the loop runs to; None if unknown.
            changeover: this VM's setup and restore figures, if measured.
        """
        self.writer.begin(
            step=step,
            samples=samples,
            samples_per_epoch=samples_per_epoch,
            energy_j_total=self._energy(energy_j),
            total_steps=total_steps,
            changeover=changeover,
        )
        if self.policy.active:
            self.tracker = BudgetTracker(
                self.policy,
                earlier=self.writer.earlier,
                managed=self.place.cloud != "local",
                storage=StoredCheckpoints(self.writer.store),
            )
            if self.place.price_usd_per_hour is None and self.place.cloud != "local":
                log.warning(
                    "budget: no price known for %s (not among the plan's offers); this VM's time is not counted",
                    self.place.label,
                )
        log.info("ledger: segment %s on %s", self.writer.segment.key, self.place.label)

    def preemptions_before(self) -> int:
        """VMs of this run lost before this one, from the ledger: segments that ended preempted
        and segments that never wrote their end (killed or vanished, which no runtime could
        count). The same count `skygreen cost` shows, so `status` agrees with it."""
        return sum(1 for s in self.writer.earlier if s.end in (PREEMPTED, KILLED))

    def step_started(self) -> None:
        """Training begins now: its time counts from here (only the first call stamps it)."""
        self.writer.first_step()

    def reported(self, metrics: Mapping[str, float], step: int) -> None:
        """Add metric values reported at `step` to the segment; they are written with the next progress.

        Args:
            metrics: metric name -> value.
            step: the optimizer steps done.
        """
        for name, value in metrics.items():
            self.writer.report(name, step, value)

    def progress(self, *, step: int, samples: int, energy_j: float, end: str = "running") -> None:
        """Write the segment's progress: train time in seconds since the first step (0 before it) and
        energy in joules since the segment began (None when not metering). `end` other than
        `running` closes the segment.

        Args:
            step: the optimizer steps done.
            samples: samples seen.
            energy_j: the meter's cumulative joules, in J.
            end: `running`, or how the segment ended.
        """
        seg = self.writer.segment
        train_s = max(0.0, time.time() - seg.first_step_at) if seg.first_step_at is not None else 0.0
        self.writer.update(step=step, samples=samples, train_s=train_s, energy_j_total=self._energy(energy_j), end=end)

    def tick(self, step: int) -> None:
        """After each step: a ledger heartbeat every `SKYGREEN_LEDGER_HEARTBEAT_S` (30 s) between
        checkpoints, so time and steps a VM spends after its last checkpoint are on the record.

        Args:
            step: the optimizer steps done.
        """
        now = time.monotonic()
        if self._last_beat_s is not None and now - self._last_beat_s < self.heartbeat_s:
            return
        if self._last_beat_s is not None:
            self.writer.heartbeat(step=step)
        self._last_beat_s = now

    def over_budget(self) -> bool:
        """Check the spend against the budget; alerts due now are sent (log and webhook).

        Spend grows with time, so it is checked at most once a second (`BUDGET_CHECK_EVERY_S`):
        calls in between return False, as do all calls before `started` set up a budget.

        Returns:
            True when the spend reached the budget.
        """
        if self.tracker is None:
            return False
        now = time.time()
        if now - self._last_check_s < BUDGET_CHECK_EVERY_S:
            return False
        self._last_check_s = now
        alerts, stop = self.tracker.check(self.writer.segment, now)
        for alert in alerts:
            send(alert, self.policy.webhook_url)
        return stop

    def stop_message(self) -> str:
        """The warning for a run stopped by its budget: spend so far, the budget, and the command that
        resumes it with a higher one. Only after `over_budget` returned True with a budget set.
        """
        assert self.tracker is not None and self.policy.budget_usd is not None
        spent = self.tracker.spent_usd(self.writer.segment, time.time())
        return stop_message(self.writer.segment.run_id, spent, self.policy.budget_usd)

    def _energy(self, energy_j: float) -> float | None:
        return energy_j if self.metering else None
