"""Numbers as people read them: significant digits for small amounts, minutes for short runs.

A small job (a smoke-sized task, a fine-tune of minutes) used to print `$0.00` and `0.0 h`,
which reads as "free and instant" and hides the differences the ranking is made of. Amounts
below one unit keep two significant digits (`0.0042`), durations under an hour are minutes or
seconds. Pure functions, shared by the plan table, its reasons and the status views.
"""

from __future__ import annotations

import math


def significant(value: float, digits: int = 2) -> str:
    """`value` with at least `digits` significant digits, never in scientific notation."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    return f"{value:,.{decimals}f}"


def usd(value: float) -> str:
    """Dollars: cents from $1 up, whole dollars from $1,000, two significant digits below $1."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.2f}"
    return significant(value, 2)


def usd_per_hour(value: float) -> str:
    """A price per hour: to a tenth of a cent, as catalogs list them; two significant digits below $0.01."""
    return f"{value:,.3f}" if abs(value) >= 0.01 else significant(value, 2)


def amount(value: float) -> str:
    """kWh, kg and the like: whole from 100, one decimal from 1, two significant digits below 1."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.1f}"
    return significant(value, 2)


def duration_h(hours: float) -> str:
    """`40 s`, `3 min`, `2.5 h`, `120 h`: the unit a person would say."""
    seconds = hours * 3600.0
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s" if seconds >= 1 or seconds == 0 else f"{significant(seconds, 1)} s"
    if round(seconds / 60) < 60:
        minutes = seconds / 60
        return f"{minutes:.0f} min" if minutes >= 10 else f"{minutes:.1f} min".replace(".0 min", " min")
    return f"{hours:,.1f} h" if hours < 100 else f"{hours:,.0f} h"


def money(value_usd: float) -> str:
    """Dollars with their sign, `usd`'s digits: `$1,234`, `$12.50`, `$0.0026` (never `$0.00` for a small sum)."""
    return f"{'-' if value_usd < 0 else ''}${usd(abs(value_usd))}"
