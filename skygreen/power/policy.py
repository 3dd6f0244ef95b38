"""Power-cap decisions, pure: what limit to ask for, and which limit `auto` picks from a profile.

Caps are written as watts (`150`), a fraction of the GPU's default limit (`0.6`), `auto` or
`off` (the task file's `power.cap`; `skygreen.task.spec` validates it). A wanted limit outside the
board's range is clamped to it, with one line saying so; a limit equal to the current one is
not set again (every set is a privileged NVML call, and Zeus's PR #143 shows what an
out-of-range one does).

`auto` follows Zeus's GlobalPowerLimitOptimizer: run a ladder of limits from the board's max
down to its min during the first training steps (one warm-up step per limit, then measured
steps), then keep the limit that minimises

    cost = eta x energy_per_step + (1 - eta) x max_power x time_per_step

(`ZeusCost`; max_power is the highest limit profiled). eta = 1 minimises energy alone, eta = 0
time alone. skygreen's default, `DEFAULT_ETA = 0.5` (Zeus's own default), means: lower the cap
only while one more second of step time saves at least one max-power second of energy
(d energy / d time <= -max_power at the optimum). On a rented GPU time is money, and the study
skygreen calibrates against (arXiv 2205.09646: -13.7% energy for +6.8% time at 0.6 of a V100's
limit) sits on the energy side of that line: 0.5 picks a cap that saves energy without giving
away more time than it saves in max-power terms, and it keeps profiles comparable with Zeus's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_ETA = 0.5
"""The `auto` chooser's default weight of energy against time (Zeus's eta): half and half."""
LADDER_STEP_W = 25.0
"""Zeus's `pl_step`."""
MAX_RUNGS = 8
"""More rungs than this (an H100 has 21 of 25 W) spread evenly instead: profiling stays short."""
WARMUP_STEPS = 1
MEASURE_STEPS = 4
SETTLE_STEPS = 5
"""Steps before the first rung is measured, in each process: data loaders start, allocators
and kernels warm up, `micro: auto` probes; measured there, the first limit would look slow."""
UNCHANGED_TOLERANCE_W = 0.5
CAP_MODES = ("auto", "off", "watts", "fraction")


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """A board's power limits, in watts."""

    default_w: float
    min_w: float
    max_w: float


@dataclass(frozen=True, kw_only=True, slots=True)
class CapRequest:
    """What the task asks for: mode `auto`, `off`, `watts` or `fraction`, and its value.

    A request, not a limit: a board's range is known only on the GPU, where `resolve` turns it
    into watts and clamps it.

    Attributes:
        mode: `auto` (profile, then keep the best limit), `off`, `watts` or `fraction`.
        value: watts, or the fraction of the default limit; None for `auto` and `off`.

    Raises:
        ValueError: an unknown mode, or `watts`/`fraction` without a positive finite value.
    """

    mode: str = "auto"
    value: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in CAP_MODES:
            raise ValueError(f"power cap mode must be one of {CAP_MODES}, got {self.mode!r}")
        if self.mode in ("watts", "fraction") and not (self.value and self.value > 0 and math.isfinite(self.value)):
            raise ValueError(f"a {self.mode} power cap needs a positive value, got {self.value!r}")

    @classmethod
    def parse(cls, text: str | float) -> CapRequest:
        """Read a cap as a task file or `cap()` writes it.

        Args:
            text: `auto`, `off`, watts (a number above 1, `150`) or a fraction of the default
                limit (at most 1, `0.6`); case and surrounding spaces do not matter.

        Returns:
            The request.

        Raises:
            ValueError: `text` is none of those, or a number that is not positive and finite.
        """
        raw = str(text).strip().lower()
        if raw in ("auto", "off"):
            return cls(mode=raw)
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(
                f"power cap must be auto, off, watts or a fraction of the default limit, got {text!r}"
            ) from None
        return cls(mode="fraction" if value <= 1.0 else "watts", value=value)

    def to_text(self) -> str:
        """Return the request as `parse` reads it (and a task file writes it): `auto`, `off`, `150`, `0.6`."""
        return self.mode if self.value is None else f"{self.value:g}"

    def describe(self) -> str:
        """Return the request in words for logs and checkpoints: `150 W`, `0.6 of the default limit`, `auto` or `off`."""
        if self.mode == "watts":
            return f"{self.value:g} W"
        if self.mode == "fraction":
            return f"{self.value:g} of the default limit"
        return self.mode


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolved:
    """The limit to set (None: leave the board alone) and the clamping line, if any."""

    target_w: float | None
    clamp_note: str | None = None


def clamp_w(want_w: float, limits: Limits) -> tuple[float, str | None]:
    """`want_w` inside the board's range, and one line when it had to move."""
    got = min(max(want_w, limits.min_w), limits.max_w)
    if got == want_w:
        return got, None
    side = "minimum" if want_w < limits.min_w else "maximum"
    return (
        got,
        f"power cap {want_w:g} W is outside this GPU's range {limits.min_w:g}-{limits.max_w:g} W; using its {side}, {got:g} W",
    )


def resolve(request: CapRequest, limits: Limits) -> Resolved:
    """The fixed limit for `watts` and `fraction` caps; `off` and `auto` set nothing here."""
    if request.mode == "watts":
        target, note = clamp_w(float(request.value or 0), limits)
        return Resolved(target_w=target, clamp_note=note)
    if request.mode == "fraction":
        target, note = clamp_w(round(limits.default_w * float(request.value or 0), 3), limits)
        return Resolved(target_w=target, clamp_note=note)
    return Resolved(target_w=None)


def needs_set(current_w: float, target_w: float) -> bool:
    """Only a real change is worth a privileged NVML call."""
    return abs(current_w - target_w) > UNCHANGED_TOLERANCE_W


def ladder_w(limits: Limits, *, step_w: float = LADDER_STEP_W, max_rungs: int = MAX_RUNGS) -> tuple[float, ...]:
    """Limits to profile, from the max down to the min (both included)."""
    span = limits.max_w - limits.min_w
    if span <= 0:
        return (limits.max_w,)
    values = [limits.max_w - i * step_w for i in range(int(span // step_w) + 1)]
    if values[-1] - limits.min_w > 1e-6:
        values.append(limits.min_w)
    if len(values) > max_rungs:
        values = [limits.max_w - i * span / (max_rungs - 1) for i in range(max_rungs)]
    return tuple(float(round(v)) for v in values)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfilePoint:
    """One rung of the ladder: mean energy and time of a measured step at `limit_w`."""

    limit_w: float
    energy_j: float
    time_s: float

    @property
    def power_w(self) -> float:
        """Mean power over the measured steps, in watts; 0.0 when their time is not positive."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


def zeus_cost(point: ProfilePoint, *, eta: float, max_power_w: float) -> float:
    """Zeus's cost of one step at this rung, in joules: eta x energy + (1 - eta) x max power x time."""
    return eta * point.energy_j + (1 - eta) * max_power_w * point.time_s


def choose(points: Sequence[ProfilePoint], *, eta: float = DEFAULT_ETA) -> ProfilePoint:
    """The profiled limit with the lowest Zeus cost (ties: the higher limit, the faster)."""
    if not points:
        raise ValueError("no profile points to choose from")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be between 0 and 1, got {eta}")
    max_power_w = max(p.limit_w for p in points)
    return min(points, key=lambda p: (zeus_cost(p, eta=eta, max_power_w=max_power_w), -p.limit_w))


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerProfile:
    """A finished profile: saved with the run, so a resume on the same GPU type skips profiling."""

    gpu: str
    eta: float
    points: tuple[ProfilePoint, ...]
    chosen_w: float

    @classmethod
    def from_points(cls, gpu: str, points: Sequence[ProfilePoint], *, eta: float) -> PowerProfile:
        """The profile of these measured rungs, with the limit `choose()` picks at `eta`.

        Raises `ValueError` when there are no points or `eta` is outside 0..1.
        """
        return cls(gpu=gpu, eta=eta, points=tuple(points), chosen_w=choose(points, eta=eta).limit_w)

    def point(self, limit_w: float) -> ProfilePoint | None:
        """Return the rung profiled at exactly `limit_w`; None when there is none.

        None for a profile read back from a checkpoint edited by hand: its `chosen_w` still
        sets the cap, but nothing was measured there.
        """
        return next((p for p in self.points if p.limit_w == limit_w), None)

    @property
    def uncapped(self) -> ProfilePoint:
        """The rung at the highest limit profiled: the baseline the savings are measured against."""
        return max(self.points, key=lambda p: p.limit_w)

    @property
    def saving_vs_uncapped(self) -> float | None:
        """Energy per step saved by the chosen limit against the highest one profiled (0.137 = 13.7%).

        None when the chosen limit was not profiled (not measured, so no claim).
        """
        chosen, base = self.point(self.chosen_w), self.uncapped.energy_j
        if chosen is None:
            return None
        return 0.0 if base <= 0 else 1.0 - chosen.energy_j / base

    @property
    def slowdown_vs_uncapped(self) -> float | None:
        """Time per step the chosen limit adds against the highest one profiled (0.068 = 6.8% slower).

        None when the chosen limit was not profiled.
        """
        chosen, base = self.point(self.chosen_w), self.uncapped.time_s
        if chosen is None:
            return None
        return 0.0 if base <= 0 else chosen.time_s / base - 1.0

    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON values, as the checkpoint keeps it; `from_dict()` reads it back."""
        return {"gpu": self.gpu, "eta": self.eta, "chosen_w": self.chosen_w, "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> PowerProfile:
        """The profile `to_dict()` wrote, its numbers as floats."""
        points = tuple(ProfilePoint(**{k: float(v) for k, v in p.items()}) for p in raw["points"])
        return cls(gpu=str(raw["gpu"]), eta=float(raw["eta"]), points=points, chosen_w=float(raw["chosen_w"]))


class LadderProfiler:
    """The profiling state machine, fed one reading per finished training step.

    Each rung: `warmup_steps` steps (the limit settles; the first includes the change), then
    `measure_steps` measured ones, from (energy, time) readings at step ends; the first rung
    of a process waits `settle_steps` more. `limit_w` is the
    limit the next step should run at; None once done (then `profile` holds the result).
    Rungs already measured (from a checkpoint) are not measured again.
    """

    def __init__(self, gpu: str, ladder: Sequence[float], *, eta: float = DEFAULT_ETA, warmup_steps: int = WARMUP_STEPS,
                 measure_steps: int = MEASURE_STEPS, settle_steps: int = SETTLE_STEPS,
                 points: Sequence[ProfilePoint] = ()) -> None:  # fmt: skip
        """Start at the first rung not yet measured.

        Args:
            gpu: the GPU's type, recorded in the profile.
            ladder: the limits to profile, in watts.
            eta: the chooser's weight of energy against time.
            warmup_steps: steps at each limit before measuring.
            measure_steps: steps measured at each limit.
            settle_steps: steps before the first limit.
            points: rungs already measured (from a checkpoint); those off the ladder are dropped.

        Raises:
            ValueError: fewer than one warm-up or measured step per limit.
        """
        if warmup_steps < 1 or measure_steps < 1:
            raise ValueError("profiling needs at least one warm-up and one measured step per limit")
        self.gpu = gpu
        self.ladder = tuple(ladder)
        self.eta = eta
        self.warmup_steps = warmup_steps
        self.measure_steps = measure_steps
        self.points: list[ProfilePoint] = [p for p in points if p.limit_w in self.ladder]
        self._steps_on_rung = -max(settle_steps, 0)
        self._mark: tuple[float, float] | None = None
        self.profile: PowerProfile | None = None
        self._finish_if_done()

    @property
    def done(self) -> bool:
        """Whether every rung of the ladder is measured; `profile` then holds the result."""
        return self.profile is not None

    @property
    def limit_w(self) -> float | None:
        """The limit the next step should run at, in watts; None once done."""
        return None if self.done else self.ladder[len(self.points)]

    def step_done(self, energy_j: float, time_s: float) -> None:
        """A training step ended at this (cumulative energy, monotonic time) reading."""
        if self.done:
            return
        self._steps_on_rung += 1
        if self._steps_on_rung == self.warmup_steps:
            self._mark = (energy_j, time_s)
        elif self._steps_on_rung == self.warmup_steps + self.measure_steps and self._mark is not None:
            e0, t0 = self._mark
            n = self.measure_steps
            self.points.append(
                ProfilePoint(
                    limit_w=self.ladder[len(self.points)], energy_j=(energy_j - e0) / n, time_s=(time_s - t0) / n
                )
            )
            self._steps_on_rung, self._mark = 0, None
            self._finish_if_done()

    def _finish_if_done(self) -> None:
        if len(self.points) >= len(self.ladder):
            self.profile = PowerProfile.from_points(self.gpu, self.points, eta=self.eta)
