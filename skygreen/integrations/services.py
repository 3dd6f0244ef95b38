"""What a trainer that owns its loop gets from skygreen, assembled in one place.

`sg.Run` builds the runtime's parts around the user's own loop. The trainer integrations
(`skygreen.integrations.transformers`, `.lightning`) build the same parts around a loop the
framework drives, and only ever talk to `TrainerServices`:

- the run's settings (`SKYGREEN_*`, rendered by `skygreen up`) and its store in the bucket;
- folder checkpoints (`skygreen.checkpoint.folders`): restore the newest that verifies, commit
  each one the trainer saves, retention by the task's `keep`;
- the power cap and energy meter (`skygreen.power.governor.PowerGovernor`), with energy counted
  across restarts through the commits' meta;
- the run ledger and the budget (`skygreen.runtime.ledger.RunBook`), so `status`, `cost`,
  `compare` and `report` read a trainer's run as they read an own-loop one;
- the cloud's preemption notice (`NoticeWatcher`) and SIGTERM (`SigtermLatch`);
- early stopping on evaluation metrics (`EarlyStopper`).

All assembly of runtime parts lives in this module, so that a change of their construction
touches one file. Imports torch only to find the CUDA device for NVML.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skygreen.checkpoint.folders import RestoredFolder, commit_and_retain, restore_latest
from skygreen.checkpoint.store import Store, join_url
from skygreen.errors import RuntimeSetupError
from skygreen.exit_codes import PREEMPTED_EXIT_CODE
from skygreen.ledger.records import BUDGET, COMPLETED, EARLY_STOPPED, FAILED, PREEMPTED
from skygreen.settings import SMOKE_ENV, SMOKE_FAILED, SMOKE_LINE, RuntimeSettings

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
    "TrainerServices",
]


@dataclass(kw_only=True)
class TrainerServices:
    """skygreen's parts for one training process whose loop a framework drives."""

    settings: RuntimeSettings
    store: Store
    rank: int = 0
    smoke: bool = False
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    power: Any = None
    book: Any = None
    notices: Any = None
    latch: Any = None
    stopper: Any = None
    energy_base_j: float = 0.0
    stop_reason: str | None = None
    """Why training stops early: PREEMPTED, BUDGET or EARLY_STOPPED; None while it goes on."""
    _started: bool = False
    _first_step: bool = False
    _scratch: tempfile.TemporaryDirectory[str] | None = None

    # -- setup -----------------------------------------------------------------------------

    @classmethod
    def from_env(cls, *, trainer: str, environ: Mapping[str, str] | None = None, rank: int = 0) -> TrainerServices:
        """The services of a run started by `skygreen up` (or `--local`, or the smoke test).

        Raises:
            RuntimeSetupError: the script was not started by skygreen (no run id or bucket), or
                the task says another trainer drives the loop.
        """
        environ = dict(os.environ if environ is None else environ)
        settings = RuntimeSettings.from_env(environ)
        if settings.trainer not in (None, trainer):
            raise RuntimeSetupError(
                f"the task says `trainer: {settings.trainer}`, and this script uses skygreen's {trainer} callback\n"
                f"  fix: set `trainer: {trainer}` in the task's skygreen section (or remove checkpoint.dir)"
            )
        from skygreen.checkpoint.stores import open_store

        store = open_store(join_url(settings.bucket, settings.run_id))
        return cls(settings=settings, store=store, rank=rank, smoke=environ.get(SMOKE_ENV) == "1", environ=environ)

    @property
    def is_writer(self) -> bool:
        """Rank 0 commits checkpoints and writes the ledger."""
        return self.rank == 0

    def scratch_dir(self) -> Path:
        """A throw-away folder for the smoke test's checkpoints, removed with the services."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="skygreen-smoke-out-")
        return Path(self._scratch.name)

    # -- checkpoints -----------------------------------------------------------------------

    def restore(self, parent: str | Path) -> RestoredFolder | None:
        """The newest verified checkpoint folder restored under `parent`; its meta seeds the
        energy count and early stopping."""
        restored = restore_latest(self.store, parent)
        if restored is not None:
            meta = restored.manifest.meta
            self.energy_base_j = float(meta.get(ENERGY_META) or 0.0)
            if self.stopper is not None and isinstance(meta.get(EARLY_STOP_META), Mapping):
                self.stopper.load_state_dict(dict(meta[EARLY_STOP_META]))
        return restored

    def commit(self, folder: str | Path, *, step: int, samples: int = 0, state: str = "running") -> None:
        """Commit the checkpoint folder the trainer just saved, apply retention, book progress."""
        if not self.is_writer:
            return
        meta: dict[str, Any] = {
            "state": state,
            "run_id": self.settings.run_id,
            ENERGY_META: self.energy_j(),
            "samples_seen": samples,
            "power": self.power.summary() if self.power is not None else None,
        }
        metric = None
        if self.stopper is not None:
            meta[EARLY_STOP_META] = self.stopper.state_dict()
            metric = self.stopper.best
        commit_and_retain(
            self.store,
            folder,
            step=step,
            keep=self.settings.checkpoint_keep,
            metric=metric,
            metric_mode=self.stopper.config.mode if self.stopper is not None else "min",
            meta=meta,
        )
        if self.book is not None:
            self.book.progress(step=step, samples=samples, energy_j=self.energy_j())

    def hold_if_asked(self, step: int) -> None:
        """After the commit of `step`: wait there when a test asks (`SKYGREEN_TEST_HOLD_AT_STEPS`,
        `skygreen.runtime.hold`), so whatever kills the run never races it."""
        from skygreen.runtime.hold import hold, hold_steps

        if step in hold_steps(self.environ):
            hold(step, stopped=lambda: self.latch is not None and self.latch.fired, environ=self.environ)

    # -- the run's life --------------------------------------------------------------------

    def start(self, *, step: int, samples: int = 0, total_steps: int | None = None, device: Any = None) -> None:
        """Before the first step: power cap, ledger segment, notice watcher, SIGTERM latch."""
        if self._started:
            return
        self._started = True
        from skygreen.runtime.early_stop import EarlyStopper

        if self.settings.early_stop is not None and self.stopper is None:
            self.stopper = EarlyStopper(self.settings.early_stop)
        self.power = self._governor(device)
        self.power.start(None)
        if self.is_writer and not self.smoke:
            self.book = self._book(device)
            self.book.started(
                step=step, samples=samples, samples_per_epoch=None, energy_j=self.energy_j(), total_steps=total_steps
            )
        self.latch = self._latch()
        self.notices = self._notices()

    def step_done(self, *, step: int, samples: int = 0) -> None:
        """After each optimizer step: power profile, budget; sets `stop_reason` when it must stop."""
        if self.power is not None:
            self.power.step_done()
        if self.book is not None:
            if not self._first_step:
                self._first_step = True
                self.book.step_started()
            if self.book.over_budget() and self.stop_reason is None:
                log.warning("%s", self.book.stop_message())
                self.stop_reason = BUDGET
        if self.latch is not None and self.latch.fired and self.stop_reason is None:
            self.stop_reason = PREEMPTED

    def notice_pending(self) -> bool:
        """A preemption notice arrived since the last look (each notice counts once)."""
        return self.notices is not None and self.notices.pending() is not None

    def evaluated(self, metrics: Mapping[str, float], step: int) -> bool:
        """Record evaluation metrics; True when early stopping says stop."""
        if self.book is not None:
            self.book.reported({k: float(v) for k, v in metrics.items() if _is_number(v)}, step)
        if self.stopper is None:
            return False
        name = self.settings.early_stop.metric if self.settings.early_stop else ""
        value = _metric(metrics, name)
        if value is None:
            return False
        if self.stopper.update(value) and self.stop_reason is None:
            log.info("early stopping: %s did not improve for %d evaluations", name, self.stopper.config.patience)
            self.stop_reason = EARLY_STOPPED
        return self.stop_reason == EARLY_STOPPED

    def energy_j(self) -> float:
        """Joules used by this run so far, earlier lives included."""
        return self.energy_base_j + (self.power.energy_j() if self.power is not None else 0.0)

    def close(self, *, step: int, samples: int = 0, end: str | None = None) -> None:
        """Close the ledger segment with how it ended, put the power limit back, stop watching."""
        if self.book is not None:
            self.book.progress(
                step=step, samples=samples, energy_j=self.energy_j(), end=end or self.stop_reason or COMPLETED
            )
            self.book = None
        if self.power is not None:
            self.power.close()
        if self.notices is not None:
            self.notices.stop()
            self.notices = None
        if self.latch is not None:
            self.latch.uninstall()
            self.latch = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    # -- parts -----------------------------------------------------------------------------

    def _governor(self, device: Any) -> Any:
        from skygreen.power.entry import open_gpu
        from skygreen.power.governor import PowerGovernor
        from skygreen.power.ledger import Ledger
        from skygreen.power.policy import DEFAULT_ETA, CapRequest

        gpu: Any
        reason: str | None
        if self.smoke:
            gpu, reason = None, "smoke test on CPU"
        else:
            local_rank = int(self.environ.get("LOCAL_RANK", 0) or 0)
            gpu, reason = open_gpu(cuda_uuid=_cuda_uuid(device), local_rank=local_rank, environ=self.environ)
        try:
            request = CapRequest.parse(self.settings.power_cap)
        except ValueError as e:
            raise RuntimeSetupError(f"SKYGREEN_POWER_CAP: {e}") from None
        eta = DEFAULT_ETA if self.settings.power_eta is None else self.settings.power_eta
        return PowerGovernor(
            gpu,
            request=request,
            required=self.settings.power_required,
            eta=eta,
            run_id=self.settings.run_id,
            ledger=Ledger.default(self.environ),
            reason=reason,
        )

    def _book(self, device: Any) -> Any:
        from skygreen.runtime.ledger import RunBook

        name = _cuda_name(device)
        return RunBook(
            store=self.store,
            settings=self.settings,
            device_name=name,
            gpu_count=int(self.environ.get("LOCAL_WORLD_SIZE", 1) or 1) if name else 0,
            environ=self.environ,
            started_at=time.time(),
            metering=self.power is not None and self.power.gpu is not None,
        )

    def _latch(self) -> Any:
        from skygreen.runtime.preemption import SigtermLatch

        return SigtermLatch.from_env(exit_code=PREEMPTED_EXIT_CODE, environ=self.environ).install()

    def _notices(self) -> Any:
        from skygreen.runtime.preemption import NoticeWatcher, landed_cloud

        cloud = None if self.smoke else landed_cloud(self.settings.cloud, self.environ)
        if cloud is None or cloud == "local":
            return None
        try:
            return NoticeWatcher.from_env(cloud, self.environ).start()
        except RuntimeSetupError as e:
            log.warning("preemption notices: %s", e)
            return None


def _metric(metrics: Mapping[str, Any], name: str) -> float | None:
    """The metric by its task name, also under the Trainer's `eval_` prefix (`loss` -> `eval_loss`)."""
    for key in (name, f"eval_{name}", name.removeprefix("eval_"), name.replace("val_", "eval_", 1)):
        if key in metrics and _is_number(metrics[key]):
            return float(metrics[key])
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cuda_uuid(device: Any) -> str | None:
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    import torch

    return str(torch.cuda.get_device_properties(device).uuid)


def _cuda_name(device: Any) -> str | None:
    if device is None or getattr(device, "type", None) != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(device)
