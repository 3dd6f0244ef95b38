"""The run book: this VM's segment of the run ledger and the run's budget, on rank 0.

A trainer calls it at a handful of points (started, first step, metrics reported, checkpoint
saved, budget check at step boundaries, ended); it exists on rank 0 only, and not in the smoke
test (`RunBook.open` returns None there). Energy comes from the runtime's meter
(`counters["energy_j"]`, cumulative across restarts); `energy_j` stays None on CPU where
nothing is metered. No torch here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skygreen.checkpoint.bucket_set import stated_regions
from skygreen.checkpoint.store import Store
from skygreen.ledger.budget import (
    DEFAULT_ALERT_FRACTIONS,
    BudgetPolicy,
    BudgetTracker,
    StoredCheckpoints,
    send,
    stop_message,
)
from skygreen.ledger.changeover import read_setup
from skygreen.ledger.io import LedgerWriter
from skygreen.ledger.place import current_place, gpu_catalog_name
from skygreen.ledger.records import KILLED, PREEMPTED
from skygreen.runtime.state import TrainingState
from skygreen.task.settings import RuntimeSettings

if TYPE_CHECKING:
    from skygreen.runtime.ranks import World  # torch; the book needs none

log = logging.getLogger("skygreen.runtime")

BUDGET_CHECK_EVERY_S = 1.0
"""Spend grows with time, not steps: checking once a second is plenty and costs nothing."""


HEARTBEAT_S = 30.0
"""Seconds between ledger heartbeats (`RunBook.tick`): one small write to the bucket each;
`RuntimeSettings.ledger_heartbeat_s` (`SKYGREEN_LEDGER_HEARTBEAT_S`) changes it."""


def vm_setup(environ: Mapping[str, str], *, run_id: str, now_s: float) -> tuple[float, dict[str, float]]:
    """When this VM began, and its setup's figures for the segment.

    Both come from one read of setup's stamps (`skygreen.ledger.changeover.read_setup`, under
    `$HOME`). On a SkyPilot cluster the VM is paid from setup's first line (`setup.sh.tmpl`; setup
    and restore are paid time too), else from now. Stamps from the future or from another life
    are ignored.
    """
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    setup = read_setup(run_id, home=home, process_started_at=now_s)
    on_cluster = bool(environ.get("SKYPILOT_CLUSTER_INFO"))
    return (setup.get("setup_started_at", now_s) if on_cluster else now_s), setup


def vm_started_at(environ: Mapping[str, str], *, run_id: str, now_s: float) -> float:
    """When this VM began (`vm_setup`'s first half)."""
    return vm_setup(environ, run_id=run_id, now_s=now_s)[0]


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
        started_at: epoch seconds this VM's time counts from (`vm_setup`).
        metering: whether energy is measured; else the segment's energy is None.
        setup: this VM's setup figures (`vm_setup`), written with the segment's start.
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
        setup: Mapping[str, float] | None = None,
    ) -> None:
        """Price this VM's place and set the budget policy; nothing is written to the ledger yet."""
        gpu = gpu_catalog_name(device_name) if device_name and device_name != "cpu" else None
        self.place = current_place(environ, gpu=gpu, gpu_count=gpu_count if gpu else 0)
        planned = settings.memory_planned_gb
        self.writer = LedgerWriter(
            store, run_id=settings.run_id, place=self.place, started_at=started_at, user=settings.user,
            memory_planned_gb=None if planned is None else planned.to_json(),
        )  # fmt: skip
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
        self.bucket_region = stated_regions(settings.bucket) or settings.checkpoint_region
        self._last_check_s = 0.0
        self.heartbeat_s = settings.ledger_heartbeat_s or HEARTBEAT_S
        self._last_beat_s: float | None = None
        self._beats = _BackgroundWrites(self.writer)
        self.metering = metering
        """Whether energy is measured (a GPU's counter or a simulated board): else energy_j is None."""
        self.setup = dict(setup or {})
        """`setup_started_at` and `setup_s` of this VM, read once when the book opened."""

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
        started_at, setup = vm_setup(environ, run_id=settings.run_id, now_s=time.time())
        return cls(
            store=store,
            settings=settings,
            device_name=device_name,
            gpu_count=_int_env(environ, "LOCAL_WORLD_SIZE", 1) if device_name else 0,
            environ=environ,
            started_at=started_at,
            metering=metering,
            setup=setup,
        )

    def started_from(
        self,
        training: TrainingState,
        *,
        samples_per_epoch: int | None,
        total_steps: int | None,
        restored: Mapping[str, float | int] | None = None,
    ) -> None:
        """After the resume: note where the run continues from and this VM's changeover so far.

        Notes the step, samples and energy the run continues from, and the changeover: the setup
        script's stamps (read when the book opened, `vm_setup`) and `restored`, the restore the
        run timed (`skygreen.ledger.changeover.restore_figures`; None when it started fresh).

        Args:
            training: the training state as restored (step, samples, cumulative energy).
            samples_per_epoch: the dataset's length; None if unknown.
            total_steps: where the loop runs to (progress's denominator); None if unknown.
            restored: the restore's figures, or None on a fresh start.
        """
        self.started(
            step=training.step,
            samples=training.samples_seen,
            samples_per_epoch=samples_per_epoch,
            energy_j=training.counters["energy_j"],
            total_steps=total_steps,
            changeover={**self.setup, **(restored or {})},
        )

    def progress_of(self, training: TrainingState, end: str = "running") -> None:
        """Write the run's step, samples and energy so far.

        `end` other than `running` closes the segment with that ending (completed, preempted,
        budget, ...).

        Args:
            training: the training state now.
            end: `running`, or how the segment ended.
        """
        self.progress(
            step=training.step, samples=training.samples_seen, energy_j=training.counters["energy_j"], end=end
        )

    def exited(self, training: TrainingState, exc_type: type[BaseException]) -> None:
        """The training loop left with an exception: close the segment cancelled or failed.

        Ctrl-C is cancelled, anything else failed. SystemExit is the runtime's own exit
        (preempted, budget), already written.

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
                bucket_region=self.bucket_region,
            )
            if self.place.price_usd_per_hour is None and self.place.cloud != "local":
                log.warning(
                    "budget: no price known for %s (not among the plan's offers); this VM's time is not counted",
                    self.place.label,
                )
        log.info("ledger: segment %s on %s", self.writer.segment.key, self.place.label)

    def preemptions_before(self) -> int:
        """VMs of this run lost before this one, from the ledger.

        Counts segments that ended preempted and segments that never wrote their end (killed or
        vanished, which no runtime could count). The same count `skygreen cost` shows, so
        `status` agrees with it.
        """
        return sum(1 for s in self.writer.earlier if s.end in (PREEMPTED, KILLED))

    def step_started(self) -> None:
        """Training begins now: its time counts from here (only the first call stamps it)."""
        self.writer.first_step()

    def memory_peak(self, peak_gb: float, *, measure: str) -> None:
        """Record the run's measured peak memory per GPU beside the plan's estimate.

        It is written soon, off the training thread, so even a life lost before its next
        checkpoint keeps it.

        Args:
            peak_gb: the largest rank's peak, in GB (1e9 bytes).
            measure: how it was measured (`skygreen.runtime.peak_memory`).
        """
        self.writer.memory_peak(peak_gb, measure=measure)
        self._beats.poke()

    def reported(self, metrics: Mapping[str, float], step: int) -> None:
        """Add metric values reported at `step` to the segment; they are written with the next progress.

        Args:
            metrics: metric name -> value.
            step: the optimizer steps done.
        """
        for name, value in metrics.items():
            self.writer.report(name, step, value)

    def progress(self, *, step: int, samples: int, energy_j: float, end: str = "running") -> None:
        """Write the segment's progress: train time and energy so far.

        Train time is in seconds since the first step (0 before it), energy in joules since the
        segment began (None when not metering). `end` other than `running` closes the segment.

        Args:
            step: the optimizer steps done.
            samples: samples seen.
            energy_j: the meter's cumulative joules, in J.
            end: `running`, or how the segment ended.
        """
        seg = self.writer.segment
        train_s = max(0.0, time.time() - seg.first_step_at) if seg.first_step_at is not None else 0.0
        self.writer.update(step=step, samples=samples, train_s=train_s, energy_j_total=self._energy(energy_j), end=end)

    def committed(self) -> None:
        """Write the segment again after a save that was waited for.

        The write at the save went before its upload; this one carries the bytes that save
        uploaded and the size it committed.
        """
        self.writer.flush()

    def tick(self, step: int) -> None:
        """After each step: beat the ledger every `SKYGREEN_LEDGER_HEARTBEAT_S` (30 s).

        The beats fall between checkpoints, so time and steps a VM spends after its last
        checkpoint are on the record.

        The step reached is noted here; the write goes to the bucket on a thread of its own, so a
        slow bucket never holds a training step (beats that come while a write is slow are folded
        into the next write).

        Args:
            step: the optimizer steps done.
        """
        now = time.monotonic()
        if self._last_beat_s is not None and now - self._last_beat_s < self.heartbeat_s:
            return
        if self._last_beat_s is not None:
            self.writer.heartbeat(step=step, write=False)
            self._beats.poke()
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
        alerts, stop = self.tracker.check(self.writer.counted(), now)  # with the bytes moved so far
        for alert in alerts:
            send(alert, self.policy.webhook_url)
        return stop

    def stop_message(self) -> str:
        """The warning for a run stopped by its budget.

        It gives the spend so far, the budget, and the command that resumes it with a higher one.
        Only after `over_budget` returned True with a budget set.
        """
        assert self.tracker is not None and self.policy.budget_usd is not None
        spent = self.tracker.spent_usd(self.writer.counted(), time.time())
        return stop_message(self.writer.segment.run_id, spent, self.policy.budget_usd)

    def _energy(self, energy_j: float) -> float | None:
        return energy_j if self.metering else None


class _BackgroundWrites:
    """A daemon thread that writes the ledger segment whenever poked.

    It is the heartbeat's write, off the training thread. Pokes while a write is under way fold
    into one more write.
    """

    def __init__(self, writer: LedgerWriter) -> None:
        self.writer = writer
        self._due = threading.Event()
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Write the segment soon (starts the thread on the first poke)."""
        self._due.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="skygreen-ledger-heartbeat", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            try:
                self.writer.flush()  # a bucket's errors are a warning there: the ledger never stops training
            except Exception as e:  # anything else must not end the thread unseen either
                log.warning("ledger heartbeat not written: %s", e)
