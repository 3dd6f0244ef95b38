"""The power and speed model of a GPU under a power cap: the simulated GPU's and the planner's.

Fractions of the board's default limit throughout. A compute-bound
training step at relative clock f takes 1/f of its uncapped time; a capped board draws its cap;
uncapped it draws D of its default limit. Board power falls with the clock as
P = s + (D - s) f^k (s: the floor that does not scale with the clock: memory, leakage, fans).
Calibrated to the MIT Lincoln Lab study (arXiv 2205.09646; V100, 150 W of 250 W = 0.6 of the
default limit: -13.7% energy, +6.8% time):
    D = 0.6 x 1.068 / 0.863 = 0.743      (the uncapped draw those two figures imply)
    s = 0.2                               (chosen; k follows from the time figure)
    k = ln((0.6 - s) / (D - s)) / ln(1 / 1.068) = 4.6
so the model reproduces exactly -13.7% energy and +6.8% time at 0.6, and below about half the
default limit the slowdown grows faster than the power falls (Zeus's profiles show the same
turn).

The planner uses it as a prior for the energy of a capped run (`planned_energy_ratio`);
the runtime replaces it with what the board measures (`auto` profiles the real GPU).
"""

from __future__ import annotations

import math
from functools import lru_cache

MIN_LIMIT_FRACTION = 0.4
"""The simulated boards' lowest limit (real boards: A100 25%, H100 29%, V100-SXM2 50%, L4 56%)."""
STUDY_CAP_FRACTION = 0.6
STUDY_ENERGY_RATIO = 1 - 0.137
STUDY_TIME_RATIO = 1 + 0.068
UNCAPPED_DRAW_FRACTION = STUDY_CAP_FRACTION * STUDY_TIME_RATIO / STUDY_ENERGY_RATIO
FLOOR_FRACTION = 0.2
CLOCK_EXPONENT = math.log((STUDY_CAP_FRACTION - FLOOR_FRACTION) / (UNCAPPED_DRAW_FRACTION - FLOOR_FRACTION)) / math.log(
    1 / STUDY_TIME_RATIO
)


def model_clock(cap_fraction: float) -> float:
    """Relative clock (1.0 = uncapped) of a compute-bound board capped at `cap_fraction` of its default limit."""
    if cap_fraction >= UNCAPPED_DRAW_FRACTION:
        return 1.0
    headroom = max(cap_fraction - FLOOR_FRACTION, 1e-6) / (UNCAPPED_DRAW_FRACTION - FLOOR_FRACTION)
    return headroom ** (1 / CLOCK_EXPONENT)


def model_time_ratio(cap_fraction: float) -> float:
    """Step time against the uncapped step time."""
    return 1.0 / model_clock(cap_fraction)


def model_draw_fraction(cap_fraction: float) -> float:
    """Average board power under training load, as a fraction of the default limit."""
    return min(cap_fraction, UNCAPPED_DRAW_FRACTION)


def model_energy_ratio(cap_fraction: float) -> float:
    """Energy per step against the uncapped energy per step."""
    return model_draw_fraction(cap_fraction) * model_time_ratio(cap_fraction) / UNCAPPED_DRAW_FRACTION


@lru_cache(maxsize=256)
def planned_energy_ratio(mode: str, value: float | None, *, tdp_w: float, eta: float = 0.5) -> float:
    """Energy of a run under the task's cap against the same run uncapped, by the model.

    `watts` and `fraction` caps are clamped to the model board's range; `auto` is the limit the
    Zeus-style chooser would keep on the model's ladder for `eta`; `off` is 1.
    """
    if mode == "off":
        return 1.0
    if mode == "auto":
        from skygreen.power.policy import Limits, ProfilePoint, choose, ladder_w

        low_w = round(tdp_w * MIN_LIMIT_FRACTION)
        points = [
            ProfilePoint(
                limit_w=w,
                energy_j=model_draw_fraction(w / tdp_w) * tdp_w * model_time_ratio(w / tdp_w),
                time_s=model_time_ratio(w / tdp_w),
            )
            for w in ladder_w(Limits(default_w=tdp_w, min_w=low_w, max_w=tdp_w))
        ]
        return model_energy_ratio(choose(points, eta=eta).limit_w / tdp_w)
    fraction = (value or 0.0) / tdp_w if mode == "watts" else (value or 1.0)
    return model_energy_ratio(min(max(fraction, MIN_LIMIT_FRACTION), 1.0))
