"""Typed readers for user-written values, each failing with a `SpecError` that names the field.

YAML hands us whatever the user typed: strings for numbers, `yes` for booleans, dates, NaN.
These readers accept exactly one shape per field and say what was expected otherwise, so the
spec parser stays a flat list of `field = read_x(...)` lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from skygreen.errors import SpecError, suggestion


def type_name(value: Any) -> str:
    """The YAML-ish name of a value's type, for messages."""
    kinds = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
             (Mapping, "mapping"), ((list, tuple), "list"))  # fmt: skip
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _key(path: str) -> str:
    """The key a path ends in (`keep` for `skygreen.checkpoint.keep`, `gpus` for `skygreen.gpus[0]`),
    for a fix line's example."""
    return path.rpartition(".")[2].partition("[")[0]


def read_mapping(value: Any, path: str) -> Mapping[str, Any]:
    """A mapping whose keys are all strings."""
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected a mapping, got a {type_name(value)}", value=value,
                        hint=f"write its keys on lines of their own, indented under {_key(path)}:")  # fmt: skip
    for key in value:
        if not isinstance(key, str):
            raise SpecError(f"{path}.{key}", f"keys must be strings, got a {type_name(key)}", value=key,
                            hint=f'quote the key: "{key}"')  # fmt: skip
    return value


def check_keys(mapping: Mapping[str, Any], allowed: Iterable[str], path: str) -> None:
    """Reject keys outside `allowed`, suggesting the nearest allowed key."""
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            raise SpecError(
                f"{path}.{key}" if path else key,
                "unknown key",
                allowed=", ".join(allowed),
                hint=suggestion(key, allowed) or "remove it",
            )


def read_bool(value: Any, path: str) -> bool:
    """A YAML boolean; a string such as `"true"` or a 0/1 is refused."""
    if not isinstance(value, bool):
        raise SpecError(path, f"expected true or false, got a {type_name(value)}", value=value,
                        hint=f"write {_key(path)}: true or {_key(path)}: false, without quotes (YAML 1.2 reads "
                        "yes, no, on and off as strings)")  # fmt: skip
    return value


def read_int(value: Any, path: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (not a boolean, not a float with a fraction) within bounds."""
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        example = _integer_example(value, minimum)
        raise SpecError(
            path,
            f"expected an integer, got a {type_name(value)}",
            value=value,
            hint=f"write a whole number without quotes, e.g. {_key(path)}: {example}",
        )
    _check_range(value, path, minimum, maximum)
    return value


_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _integer_example(value: Any, minimum: int | None) -> int:
    """The integer a wrong value most likely meant ("two", "8", 2.5), for the fix line."""
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _NUMBER_WORDS:
            return _NUMBER_WORDS.index(word)
        if word.isdecimal():  # what int() reads ("²" is a digit it refuses)
            return int(word)
    if isinstance(value, float) and math.isfinite(value):
        return max(round(value), minimum or 0)
    return minimum if minimum is not None else 1


def read_number(
    value: Any, path: str, *, minimum: float | None = None, maximum: float | None = None, positive: bool = False
) -> float:
    """A finite number within bounds; `positive` excludes zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, f"expected a number, got a {type_name(value)}", value=value,
                        hint=f"write a number without quotes, e.g. {_key(path)}: {1 if minimum is None else minimum:g}")  # fmt: skip
    value = float(value)
    if not math.isfinite(value):
        raise SpecError(path, "expected a finite number", value=value, hint="write a number, not inf or nan")
    if positive and value <= 0:
        raise SpecError(path, "must be greater than 0", value=value, hint="use a positive number")
    _check_range(value, path, minimum, maximum)
    return value


def _check_range(value: float, path: str, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise SpecError(path, f"must be at least {minimum}", value=value, hint=f"use {minimum} or more")
    if maximum is not None and value > maximum:
        raise SpecError(path, f"must be at most {maximum}", value=value, hint=f"use {maximum} or less")


def read_str(value: Any, path: str, *, nonempty: bool = True) -> str:
    """A string, returned as written; with `nonempty` one that is not blank."""
    if not isinstance(value, str):
        raise SpecError(path, f"expected a string, got a {type_name(value)}", value=value,
                        hint=f"write text, in quotes where YAML would read it otherwise: {_key(path)}: \"...\"")  # fmt: skip
    if nonempty and not value.strip():
        raise SpecError(path, "must not be empty", value=value, hint=f"give {_key(path)} a value, or remove the key")
    return value


def read_choice(value: Any, path: str, choices: Iterable[str], *, case_sensitive: bool = False) -> str:
    """One of `choices`, returned in the spelling of `choices`."""
    choices = list(choices)
    if not isinstance(value, str):
        raise SpecError(path, f"expected one of the names below, got a {type_name(value)}", value=value,
                        allowed=", ".join(choices), hint=f"write one of them, e.g. {_key(path)}: {choices[0]}")  # fmt: skip
    for choice in choices:
        if value == choice or (not case_sensitive and value.lower() == choice.lower()):
            return choice
    hint = suggestion(value, choices) or f"use one of the allowed names, e.g. {_key(path)}: {choices[0]}"
    raise SpecError(path, f"unknown value {value!r}", allowed=", ".join(choices), hint=hint)


def read_list(value: Any, path: str, *, nonempty: bool = True) -> list[Any]:
    """A list; a single scalar is accepted as a one-item list, as users often write `gpus: A100`.
    A tuple is a value a record built in code holds, read already: taken as it is."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise SpecError(path, f"expected a list, got a {type_name(value)}", value=value,
                        hint=f"write one value, or a list such as {_key(path)}: [a, b]")  # fmt: skip
    if nonempty and not value:
        raise SpecError(path, "must not be empty", value=value, hint=f"give at least one item, or remove {_key(path)}")
    return value


DURATION_UNITS_S: Mapping[str, float] = {
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}
"""The units every duration skygreen reads accepts: `every: 5m` in a task file, `--older-than 90d`."""
_DURATION = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(" + "|".join(DURATION_UNITS_S) + r")\s*$")
"""A number, signed or with an exponent, and a unit: a negative or huge one parses, so the range
check after it, not the syntax check, says what is wrong with it."""


def parse_duration_s(text: str) -> float | None:
    """`90s`, `5m`, `12h`, `90d`, `2w` -> seconds; None when `text` is not a duration."""
    match = _DURATION.match(str(text))
    return float(match.group(1)) * DURATION_UNITS_S[match.group(2)] if match else None


def read_duration_s(value: Any, path: str) -> float:
    """A positive duration with a unit (s, m, h, d, w), in seconds."""
    seconds = parse_duration_s(value) if isinstance(value, str) else None
    if seconds is None:
        raise SpecError(path, "expected a duration such as 90s, 5m, 12h, 90d or 2w", value=value,
                        hint="write a number and a unit (s, m, h, d, w), e.g. 90d")  # fmt: skip
    if seconds <= 0:
        raise SpecError(
            path, "the duration must be greater than 0", value=value, hint="give a positive duration, e.g. 90d"
        )
    return seconds


def read_duration_h(raw: Any, path: str) -> float:
    """A duration in hours: a number of hours (`36`, `1.5`) or a string with a unit (`36h`,
    `90m`, `45min`, `3600s`, read by `parse_duration_s`); used for deadlines and by
    `skygreen simulate`."""

    def refuse(problem: str, hint: str) -> SpecError:
        return SpecError(path, problem, value=raw, allowed="36h | 90m | 1.5 (hours)", hint=hint)

    seconds = parse_duration_s(raw) if isinstance(raw, str) else None
    if seconds is not None:
        hours = seconds / 3600.0
    elif isinstance(raw, str):
        try:
            hours = float(raw)  # hours without a unit
        except ValueError:
            raise refuse("expected a duration", "write hours with h or minutes with m, e.g. 36h") from None
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        hours = float(raw)
    else:
        raise refuse(f"expected a duration, got a {type_name(raw)}", "e.g. 36h")
    if not hours > 0:
        raise refuse("the duration must be greater than 0", "give a positive duration, e.g. 36h")
    if not hours < MAX_DURATION_H:
        raise refuse(f"the duration must be less than {MAX_DURATION_H:.0f} h", "a shorter duration, e.g. 36h")
    return hours


MAX_DURATION_H = 1e6
"""Longer than any run (114 years): a value past it is a typo."""
