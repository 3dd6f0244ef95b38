"""The training runtime's power side for one process: its GPU's cap, the `auto` profile, energy.

The runtime (one process per rank, each with its own GPU) builds one `PowerGovernor`, calls
`start(saved)` before the first step (with the `power` state of the checkpoint it resumed
from, if any), `step_done()` after every optimizer step, `take_j()` whenever it books energy,
and `close()` on every exit path; `state_dict()` goes into each checkpoint.

- A fixed cap (watts or fraction) is clamped and set once, before training.
- `auto` runs the ladder of `LadderProfiler` during the first real training steps (nothing is
  wasted, and nothing numeric changes, so a resume stays bit-identical), then keeps the chosen
  limit. The profile is checkpointed: a run resumed on the same GPU type applies its choice at
  once; on another type it profiles again. A profile interrupted by a preemption goes on from
  the first rung not yet measured.
- No NVML, or no permission: one line, then metering only; with `required` it is an error
  raised by `start()`, before training. `required` checks the permission up front by setting
  the current limit again (the only set that does not change anything).
- Energy: `GpuEnergyMeter` (counter, else sampled power); `method` says which, `none` with a
  `reason` when this process has no GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from skygreen.errors import PowerError, PowerPermissionError, RuntimeSetupError
from skygreen.power.caps import PowerCaps, limits_of
from skygreen.power.meter import GpuEnergyMeter
from skygreen.power.originals import OriginalLimits
from skygreen.power.policy import (
    DEFAULT_ETA,
    MEASURE_STEPS,
    SETTLE_STEPS,
    WARMUP_STEPS,
    CapRequest,
    LadderProfiler,
    Limits,
    PowerProfile,
    ProfilePoint,
    ladder_w,
    needs_set,
    resolve,
)

if TYPE_CHECKING:
    from skygreen.power.nvml import Gpu

log = logging.getLogger("skygreen.power")

Reduce = Callable[[float, float], tuple[float, float]]
"""(energy_j, time_s) of this rank -> (sum of energy, max of time) over all ranks."""


class PowerGovernor:
    """The power side of one training process: the cap on its GPU and the meter of its energy.

    Made with `gpu=None` (this process has no GPU), it sets nothing and reports method `none`
    with `reason`; `start()` then raises only when `required` asks for a cap. No limit is read
    or set until `start()`.
    """

    def __init__(
        self,
        gpu: Gpu | None,
        *,
        request: CapRequest,
        required: bool = False,
        eta: float = DEFAULT_ETA,
        run_id: str | None = None,
        originals: OriginalLimits | None = None,
        gpu_type: str | None = None,
        reason: str | None = None,
        warmup_steps: int = WARMUP_STEPS,
        measure_steps: int = MEASURE_STEPS,
        settle_steps: int = SETTLE_STEPS,
        sync: Callable[[], None] | None = None,
        reduce: Reduce | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Make the governor of one GPU; nothing is read or set before `start()`.

        Args:
            gpu: this process's GPU at the NVML boundary; None when it has none.
            request: the cap: `auto`, `off`, watts or a fraction of the default limit.
            required: stop the run (in `start()`) when the cap cannot be applied, instead of
                training uncapped.
            eta: the `auto` chooser's weight of energy against time (0: time only, 1: energy only).
            run_id: recorded with the original limit, naming the run that set the cap.
            originals: where the GPU's original limit is recorded on disk before the first
                change, so a restart after `kill -9` can put it back; None records nothing.
            gpu_type: the GPU's type for a checkpointed `auto` profile (default: from `gpu.name`).
            reason: why there is no GPU, shown as the method's reason.
            warmup_steps: `auto`: steps at each limit before measuring.
            measure_steps: `auto`: steps measured at each limit.
            settle_steps: `auto`: steps before the first limit.
            sync: called before each profiling reading (a barrier across ranks).
            reduce: combines a profiling reading across ranks (energy summed, time the slowest).
            clock: seconds, monotonic; a test's clock in tests.
        """
        self.gpu = gpu
        self.request = request
        self.required = required
        self.eta = eta
        self.gpu_type = gpu_type or (gpu.name.replace(" (simulated)", "") if gpu else None)
        self.reason = reason
        """Why there is no GPU energy (method `none`)."""
        self.caps = PowerCaps(originals=originals, run_id=run_id)
        self.meter: GpuEnergyMeter | None = None
        self.limits: Limits | None = None
        self.profiler: LadderProfiler | None = None
        self.profile: PowerProfile | None = None
        self.cap_w: float | None = None
        self.capping = False
        """False after a permission failure (or for `off`): metering only."""
        self._warmup, self._measure, self._settle = warmup_steps, measure_steps, settle_steps
        self._sync = sync
        self._reduce = reduce
        self._clock = clock
        self._taken_j = 0.0
        self._closed = False
        self._saved: Mapping[str, Any] | None = None

    # -- start ----------------------------------------------------------------------------

    def start(self, saved: Mapping[str, Any] | None = None) -> None:
        """Restore leftovers, then apply the cap or begin profiling; call before the first step.

        A limit this GPU still carries from a run killed before it could restore it is put
        back first. Without NVML support or permission the run trains uncapped after one
        warning, unless `required`.

        Args:
            saved: a checkpoint's `state_dict()` of an earlier governor (its `auto` profile
                and the original limit); default: the one given to `load_state_dict`, if any.

        Raises:
            RuntimeSetupError: `required` is set and there is no GPU, no permission, or NVML
                refused the cap.
        """
        saved = self._saved if saved is None else saved
        if self.gpu is None:
            if self.required and self.request.mode != "off":
                raise RuntimeSetupError(f"power.required is true but this process has no GPU to cap ({self.reason})\n"
                                        "  fix: run on a GPU, or set power.required: false")  # fmt: skip
            return
        try:
            if self.caps.adopt(self.gpu) is None:
                self._restore_from_checkpoint(saved)
            self.limits = limits_of(self.gpu)
            self.meter = GpuEnergyMeter(self.gpu)
        except PowerError as e:
            self._give_up(e)
            return
        if self.request.mode == "off":
            return
        self.capping = True
        if self.required:
            self._probe_permission()
        if self.request.mode == "auto":
            self._start_auto(saved)
        else:
            decision = resolve(self.request, self._limits())
            if decision.clamp_note:
                log.warning("GPU %d: %s", self.gpu.index, decision.clamp_note)
            self._apply(decision.target_w, why=f"power cap {self.request.describe()}")

    def _restore_from_checkpoint(self, saved: Mapping[str, Any] | None) -> None:
        """Put back the original limit from the checkpoint, the second record of it.

        Used when the machine's record of original limits has no entry (its data folder was
        lost) but this very GPU still carries the cap the checkpointed run set.
        """
        gpu = self._device()
        if not saved or saved.get("uuid") != gpu.uuid:
            return
        original_w, cap_w = saved.get("original_limit_w"), saved.get("cap_w")
        if original_w is None or cap_w is None:
            return
        current_w = gpu.power_limit_w()
        if needs_set(current_w, original_w) and not needs_set(current_w, cap_w):
            gpu.set_power_limit_w(original_w)
            log.warning("GPU %d: restored the original power limit %g W recorded in the checkpoint (found %g W)",
                        gpu.index, original_w, current_w)  # fmt: skip

    def _device(self) -> Gpu:
        assert self.gpu is not None, "only called once a GPU is known"
        return self.gpu

    def _limits(self) -> Limits:
        assert self.limits is not None, "only called after start() read the limits"
        return self.limits

    def _probe_permission(self) -> None:
        gpu = self._device()
        try:
            gpu.set_power_limit_w(gpu.power_limit_w())
        except PowerError as e:
            self.close()
            raise RuntimeSetupError(
                f"power.required is true and the cap cannot be applied: {str(e).splitlines()[0]}\n"
                "  fix: give the container CAP_SYS_ADMIN (docker run --cap-add SYS_ADMIN) or run as root, "
                "or set power.required: false to train uncapped"
            ) from e

    def _start_auto(self, saved: Mapping[str, Any] | None) -> None:
        saved = saved or {}
        same_gpu = saved.get("gpu") == self.gpu_type
        if same_gpu and saved.get("profile"):
            self.profile = PowerProfile.from_dict(saved["profile"])
            self._apply(self.profile.chosen_w, why=f"auto power cap from the saved profile (eta {self.profile.eta:g})")
            return
        if saved.get("gpu") and not same_gpu:
            log.warning("power: resumed on %s (profiled on %s); profiling again", self.gpu_type, saved.get("gpu"))
        points = [ProfilePoint(**p) for p in saved.get("points", [])] if same_gpu else []
        ladder = ladder_w(self._limits())
        self.profiler = LadderProfiler(self.gpu_type or "gpu", ladder, eta=self.eta, warmup_steps=self._warmup,
                                       measure_steps=self._measure, settle_steps=self._settle, points=points)  # fmt: skip
        log.info("power: profiling %d limits (%s W) over the first %d steps, then keeping the best (eta %g)",
                 len(ladder), ", ".join(f"{w:g}" for w in ladder), self._settle + len(ladder) * (self._warmup + self._measure), self.eta)  # fmt: skip
        self._apply(self.profiler.limit_w, why=None)

    # -- steps ----------------------------------------------------------------------------

    def step_done(self) -> None:
        """Count an optimizer step: feed the `auto` profiler while it runs and set its next limit.

        Waits for the GPU to finish the step first (the reading must include its work).

        Raises:
            RuntimeSetupError: `required` is set and NVML refused a limit of the ladder.
        """
        if self.gpu is None:
            return
        self.gpu.synchronize()
        if self.profiler is None or self.profiler.done:
            return
        if self._sync is not None:
            self._sync()
        energy_j, time_s = self.energy_j(), self._clock()
        if self._reduce is not None:
            energy_j, time_s = self._reduce(energy_j, time_s)
        before = self.profiler.limit_w
        self.profiler.step_done(energy_j, time_s)
        if self.profiler.done:
            self.profile = self.profiler.profile
            p = self.profile
            self._apply(p.chosen_w, why=None)
            log.warning("power: auto cap %g W of %g W default (profiled %d limits, eta %g): %.1f%% less energy per step, %+.1f%% time",
                        p.chosen_w, self._limits().default_w, len(p.points), p.eta, 100 * p.saving_vs_uncapped, 100 * p.slowdown_vs_uncapped)  # fmt: skip
        elif self.profiler.limit_w != before:
            self._apply(self.profiler.limit_w, why=None)

    def _apply(self, target_w: float | None, *, why: str | None) -> None:
        if target_w is None or not self.capping:
            return
        gpu = self._device()
        try:
            changed = self.caps.set(gpu, target_w)
        except PowerError as e:
            self._give_up(e)
            return
        self.cap_w = target_w
        if why and changed:
            log.warning(
                "GPU %d: %s: power limit %g W (default %g W)", gpu.index, why, target_w, self._limits().default_w
            )

    def _give_up(self, error: PowerError) -> None:
        """No permission (or no NVML feature): one line, then metering only."""
        if self.required and self.request.mode != "off":
            raise RuntimeSetupError(
                f"power.required is true and the cap cannot be applied: {str(error).splitlines()[0]}"
            ) from error
        self.capping = False
        self.profiler = None
        self.cap_w = None
        if self.caps is not None:
            self.caps.restore()
        why = (
            "no permission to set GPU power limits (needs CAP_SYS_ADMIN or root)"
            if isinstance(error, PowerPermissionError)
            else str(error).splitlines()[0]
        )
        log.warning("power cap %s not applied: %s; metering energy only", self.request.describe(), why)

    # -- energy ---------------------------------------------------------------------------

    @property
    def method(self) -> str:
        """How energy is measured: the meter's method, or `none` while there is no meter.

        There is none before `start()`, without a GPU, or when `start()` met an NVML error
        before it could make one.
        """
        return self.meter.method if self.meter is not None else "none"

    def energy_j(self) -> float:
        """Return the joules this process's GPU used since `start()` made the meter; 0.0 without one."""
        return self.meter.read_j() if self.meter is not None else 0.0

    def take_j(self) -> float:
        """Return the joules this process's GPU used since the last call (never negative).

        The run books energy by difference, so a counter read twice is never counted twice.
        """
        now = self.energy_j()
        used, self._taken_j = now - self._taken_j, now
        return max(used, 0.0)

    # -- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return what a checkpoint keeps: the profile (or its measured rungs), the cap, the original limit and the method."""
        return {
            "gpu": self.gpu_type,
            "profile": self.profile.to_dict() if self.profile else None,
            "points": [vars_of(p) for p in self.profiler.points] if self.profiler and not self.profile else [],
            "cap_w": self.cap_w,
            "default_limit_w": self.limits.default_w if self.limits else None,
            "original_limit_w": self.caps.original_w(self.gpu) if self.caps and self.gpu else None,
            "uuid": self.gpu.uuid if self.gpu else None,
            "method": self.method,
            "reason": self.reason,
            "request": self.request.describe(),
            "saving_vs_uncapped": self.profile.saving_vs_uncapped if self.profile else None,
            "simulated": bool(self.gpu and self.gpu.simulated),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Keep a checkpoint's power state for `start` (nothing is applied here).

        The profile is reused on the same GPU type, and the original limit restored from it
        when this machine lost its own record.

        Args:
            state: a `state_dict()` of an earlier governor.
        """
        self._saved = dict(state)

    def summary(self) -> dict[str, Any]:
        """Return the checkpoint meta's `power`: what `skygreen status` shows without loading weights."""
        state = self.state_dict()
        keep = ("cap_w", "default_limit_w", "method", "reason", "request", "saving_vs_uncapped", "simulated")
        summary = {k: state[k] for k in keep}
        summary["gpu"] = self.gpu_type
        summary["gpus"] = 1 if self.gpu is not None else 0
        return summary

    def close(self) -> None:
        """Restore the GPU's original limit and stop the meter; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if self.caps is not None:
            self.caps.close()
        if self.meter is not None:
            self.meter.close()


def vars_of(point: ProfilePoint) -> dict[str, float]:
    """A profiled rung as the plain dict the checkpoint keeps: limit in W, energy in J, time in s."""
    return {"limit_w": point.limit_w, "energy_j": point.energy_j, "time_s": point.time_s}
