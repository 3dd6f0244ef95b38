"""A field of the task file declared once: its type, default, bounds, unit and meaning.

A section of the task file is a `Record` (a frozen `msgspec.Struct`) whose attributes carry
everything about each key in their annotation:

    class RecoverySpec(Record, frozen=True, kw_only=True):
        max_restarts_on_errors: Annotated[int, meaning("Relaunches ...", ge=0, le=100)] = 3

A field without `meaning` is not a key of the file (`ModelSpec.shape`); a value that is more
than its type (a bucket URL, a duration) names its own reader with `ReadWith`. From the one
declaration come the reader (a record reads each field as it is built, from a task file by
`read_record` or in code; errors name the field path, the value, the allowed values, a near-miss
and a fix), the reference page's rows (`skygreen.task.reference`), each field's JSON Schema
(`field_schema`) and the runtime settings (`skygreen.task.settings.task_field`). Rules across
one section's fields are its `rules()`.

Why msgspec and not pydantic: declaring the records in pydantic and validating one task added
about 0.3 s to every `skygreen plan` (1.9x; the import alone about 0.13 s), msgspec about 0.01 s
(1.0x): `benchmarks/bench_plan.py --libraries`, figures in benchmarks/RESULTS.md. Both give JSON
Schema.
"""

from __future__ import annotations

import functools
import math
import operator
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import msgspec

from skygreen.errors import SpecError
from skygreen.task.readers import (
    check_keys,
    read_bool,
    read_choice,
    read_int,
    read_list,
    read_mapping,
    read_number,
    read_str,
)


def meaning(
    text: str,
    *,
    unit: str = "",
    allowed: str = "",
    example: str = "",
    auto: bool = False,
    choices: tuple[str, ...] = (),
    keys: tuple[str, ...] = (),
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    default: str = "",
    off: bool = False,
) -> msgspec.Meta:
    """A field's declaration, for `Annotated[type, meaning(...)]`: `text` says what the key does
    (the reference page and the schema show it); `unit`, `allowed` and the bounds `ge`, `gt`, `le`
    what it takes; `choices` the names a `str` allows (any case), `keys` those a mapping's keys
    take; `example` the fix line's value when a required key is missing; `auto` lets `auto` stand
    for None (decided at run time), `off` lets `false` stand for None (a section turned off);
    `default` the default as the page says it, where the value alone would mislead."""
    given = dict(unit=unit, allowed=allowed, example=example, auto=auto, choices=choices, keys=keys, off=off,
                 default_text=default)  # fmt: skip
    extra = {k: v for k, v in given.items() if v}
    bounds = {name: bound for name, bound in (("ge", ge), ("gt", gt), ("le", le)) if bound is not None}
    return msgspec.Meta(description=text, extra=extra or None, **bounds)  # type: ignore[call-overload]  # a dict of bounds matches no single overload


@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed as itself: its schema is a dict
class ReadWith:
    """A field read by a function of its own: `Annotated[str, meaning(...), ReadWith(read_bucket)]`.

    `read(value, path)` returns the value or raises a `SpecError` naming `path`; it must take
    back what it returns, since a copy (`msgspec.structs.replace`) reads its values again. Name a
    module-level function: `typing.get_type_hints` would not find a module's names from a lambda."""

    read: Callable[[Any, str], Any]
    type: str = ""
    """What a user writes, as the reference page names it; empty: from the field's type."""
    schema: Mapping[str, Any] | None = None
    """The value's JSON Schema; None: from the field's type."""


class FieldProblem(ValueError):
    """A record's field is wrong: raised by `Record.rules` and the construction check, turned
    into a `SpecError` naming the field's full path when the record is read from a task file."""

    def __init__(
        self, field: str, problem: str, *, value: Any = None, allowed: str | None = None, hint: str | None = None
    ):
        self.field, self.problem, self.value, self.allowed, self.hint = field, problem, value, allowed, hint
        super().__init__(f"{field}: {problem}" + (f", got {value!r}" if value is not None else ""))


class Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A section of the task file declared once. Built from a task file by `read_record`, or in
    code; either way each field is read by its declaration (`a100` is kept as `A100`), then its
    `rules()` run."""

    SECTION: ClassVar[str] = ""
    """Its path in the task file (`skygreen.recovery`), for the reference page and errors."""

    def __post_init__(self) -> None:
        for field in declared(type(self)):
            value = getattr(self, field.name)
            if value is not None or field.required:
                try:
                    msgspec.structs.force_setattr(self, field.name, _read(field, value, field.name))
                except SpecError as e:  # its field is the path under this record (`names[0]`)
                    raise FieldProblem(e.field, e.problem, value=e.value, allowed=e.allowed, hint=e.hint) from None
        self.rules()

    def rules(self) -> None:
        """Checks that relate several fields of this section; raise `FieldProblem`."""


@dataclass(frozen=True, slots=True)
class Field:
    """One declared field: its name, type (without `None`), declaration and default."""

    name: str
    hint: Any
    meta: msgspec.Meta | None
    default: Any
    required: bool
    reader: ReadWith | None = None

    @property
    def extra(self) -> Mapping[str, Any]:
        """What `meaning` keeps beside the bounds: unit, allowed text, example, auto."""
        return (self.meta.extra or {}) if self.meta is not None else {}


@functools.cache
def fields_of(record: type) -> tuple[Field, ...]:
    """The fields of `record`, in order; `meta` is None for one without `meaning`."""
    hints = typing.get_type_hints(record, include_extras=True)
    out = []
    for info in msgspec.structs.fields(record):
        name, made = info.name, info.default_factory
        default = made() if made is not msgspec.NODEFAULT else info.default
        hint, meta, reader = without_none(hints[name]), None, None
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
            hint = without_none(hint)  # `Annotated[int | None, ...]`
            meta = next((m for m in extras if isinstance(m, msgspec.Meta)), None)
            reader = next((m for m in extras if isinstance(m, ReadWith)), None)
        out.append(Field(name, hint, meta, default, info.required, reader))
    return tuple(out)


def declared(record: type) -> tuple[Field, ...]:
    """The fields of `record` declared with `meaning`: read, listed and checked from it."""
    return tuple(f for f in fields_of(record) if f.meta is not None and f.meta.description)


def without_none(hint: Any) -> Any:
    """`X | None` -> X (a record's None is its default, never a value to read)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else functools.reduce(operator.or_, args)
    return hint


def is_record(hint: Any) -> bool:
    """A section read whole from its declaration."""
    return isinstance(hint, type) and issubclass(hint, Record)


def read_record(record: type, raw: Any, path: str, also: Mapping[str, Any] | None = None) -> Any:
    """A `record` read from the task file's `raw` mapping at `path`, with the undeclared fields
    in `also` that the caller sets itself; a `SpecError` naming the field, the value, what is
    allowed and a fix otherwise. A record with a `SHORTHAND` field also reads a bare value as
    that field alone (`recovery: FAILOVER`)."""
    shorthand = getattr(record, "SHORTHAND", None)
    if shorthand and not isinstance(raw, Mapping):
        raw = {shorthand: raw}
    raw = read_mapping(raw, path)
    check_keys(raw, [f.name for f in declared(record)], path)
    values: dict[str, Any] = {}
    for field in declared(record):  # the values given; each is read as the record is built
        if field.extra.get("off") and raw.get(field.name) is False:
            values[field.name] = None  # `early_stopping: false`: the section is off
        elif raw.get(field.name) is not None and not (raw[field.name] == "auto" and field.extra.get("auto")):
            values[field.name] = raw[field.name]
        elif field.required:
            example = field.extra.get("example")
            hint = f"add e.g. {field.name}: {example}" if example else f"add {field.name}:" + _doc_clause(field)
            raise SpecError(f"{path}.{field.name}", "is required", hint=hint)
    try:
        return record(**values, **(also or {}))
    except FieldProblem as e:
        raise SpecError(f"{path}.{e.field}", e.problem, value=e.value, allowed=e.allowed, hint=e.hint) from None


def _read(field: Field, value: Any, path: str) -> Any:
    """One field's value, read by its own function (`ReadWith`) or by its type."""
    if field.reader is not None:
        return field.reader.read(value, path)
    return read_value(field.hint, value, path, field.meta)


def _doc_clause(field: Field) -> str:
    doc = field.meta.description if field.meta else None
    return f" ({doc[0].lower()}{doc[1:].rstrip('.')})" if doc else ""


def read_value(hint: Any, value: Any, path: str, meta: msgspec.Meta | None = None) -> Any:
    """One value of type `hint` within `meta`'s bounds, read as the typed readers read it."""
    hint, meta = _unwrap(hint, meta)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return read_choice(value, path, typing.get_args(hint))
    if hint is bool:
        return read_bool(value, path)
    ge, gt, le = (None if meta is None else getattr(meta, bound) for bound in ("ge", "gt", "le"))
    if hint is int:
        low = math.ceil(ge) if ge is not None else None if gt is None else math.floor(gt) + 1
        return read_int(value, path, minimum=low, maximum=None if le is None else math.floor(le))
    if hint is float:  # an exclusive bound other than 0 is read as inclusive
        return read_number(value, path, minimum=ge if ge is not None or gt == 0 else gt, maximum=le, positive=gt == 0)
    if hint is str:
        choices = (meta.extra or {}).get("choices") if meta is not None else None
        return read_choice(value, path, choices) if choices else read_str(value, path)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        items = read_list(value, path)
        return tuple(dict.fromkeys(read_value(item, v, f"{path}[{i}]", meta) for i, v in enumerate(items)))
    if origin in (Mapping, dict):
        key_hint, item = typing.get_args(hint)
        mapping = read_mapping(value, path)
        names = (meta.extra or {}).get("keys") if meta is not None else None
        keys = {
            k: read_choice(k, f"{path}.{k}", names) if names else read_value(key_hint, k, f"{path}.{k}")
            for k in mapping
        }
        return {keys[k]: read_value(item, v, f"{path}.{k}", meta) for k, v in mapping.items()}
    if is_record(hint):
        return value if isinstance(value, hint) else read_record(hint, value, path)
    raise TypeError(f"{path}: no reader for the declared type {hint!r}")


def _unwrap(hint: Any, meta: msgspec.Meta | None) -> tuple[Any, msgspec.Meta | None]:
    """`Annotated[X, Meta(...)]` -> (X, that Meta), else (hint, meta) as given."""
    if typing.get_origin(hint) is typing.Annotated:
        hint, *extras = typing.get_args(hint)
        meta = next((m for m in extras if isinstance(m, msgspec.Meta)), meta)
    return hint, meta


# ---------------------------------------------------------------- the reference and the schema


def type_text(hint: Any) -> str:
    """What a user writes, as the reference page names it."""
    hint = _unwrap(hint, None)[0]
    if typing.get_origin(hint) is Literal or hint is str:
        return "string"
    if typing.get_origin(hint) in (Mapping, dict):
        return f"mapping of name to {type_text(typing.get_args(hint)[1])}"
    if getattr(hint, "SHORTHAND", None):
        return f"mapping or {hint.SHORTHAND} name"
    if typing.get_origin(hint) is tuple:  # one item alone stands for a one-item list
        item = type_text(typing.get_args(hint)[0])
        return f"{item} or list of {item}s"
    return {bool: "boolean", int: "integer", float: "number"}.get(hint, "mapping")


def allowed_text(field: Field) -> str:
    """Allowed values, bounds and unit, as the reference page lists them."""
    meta, parts, hint = field.meta, [], field.hint
    if field.extra.get("keys"):
        parts.append("keys: " + " | ".join(field.extra["keys"]))
    if typing.get_origin(hint) in (Mapping, dict, tuple):  # the bounds are the items'
        meta = _unwrap(typing.get_args(hint)[-1 if typing.get_origin(hint) is not tuple else 0], None)[1] or meta
    if typing.get_origin(hint) is tuple and typing.get_origin(typing.get_args(hint)[0]) is Literal:
        hint = typing.get_args(hint)[0]  # a list of names: the names
    if typing.get_origin(hint) is Literal or field.extra.get("choices"):
        parts.append(" | ".join(typing.get_args(hint) or field.extra["choices"]))
    elif meta is not None:
        low, above, high = getattr(meta, "ge", None), getattr(meta, "gt", None), getattr(meta, "le", None)
        if above is not None:
            parts.append(f"above {_num(above)}" + (f", at most {_num(high)}" if high is not None else ""))
        elif low is not None and high is not None:
            parts.append(f"{_num(low)} to {_num(high)}")
        elif low is not None:
            parts.append(f"{_num(low)} or more")
        elif high is not None:
            parts.append(f"at most {_num(high)}")
    extra = field.extra
    if extra.get("unit"):
        parts[-1:] = [f"{parts[-1]} {extra['unit']}" if parts else extra["unit"]]
    if extra.get("allowed"):
        parts.append(extra["allowed"])
    if extra.get("auto"):
        parts.append("or auto")
    return "; ".join(parts)


def _num(value: float) -> str:
    return f"{value:g}" if value < 1e5 else f"{value:,.0f}"


def field_schema(record: type, name: str) -> dict[str, Any]:
    """The JSON Schema of one declared field of `record`, from msgspec, with its default; a
    record's is an object, whose keys' schemas are nested from their own rows."""
    field = next(f for f in fields_of(record) if f.name == name)
    if field.reader is not None and field.reader.schema is not None:
        schema = dict(field.reader.schema)
    elif is_record(field.hint):
        schema = {"type": "object"}
    else:
        built = msgspec.json.schema(typing.Annotated[field.hint, field.meta])
        schema = {k: v for k, v in built.items() if k not in ("$defs", "description")}
        if schema.get("type") == "array":  # one item alone stands for a one-item list (`regions: us-east-1`)
            schema = {"anyOf": [schema["items"], schema]}
        if field.extra.get("choices"):
            schema = {"enum": list(field.extra["choices"]), **{k: v for k, v in schema.items() if k != "type"}}
        if field.extra.get("keys"):
            schema["propertyNames"] = {"enum": list(field.extra["keys"])}
    others: list[dict[str, Any]] = [{"type": "string"}] if getattr(field.hint, "SHORTHAND", None) else []
    others += [{"const": word} for word, key in (("auto", "auto"), (False, "off")) if field.extra.get(key)]
    if others:
        schema = {"anyOf": [schema, *others]}
    if not field.required and field.default is not None and isinstance(field.default, (bool, int, float, str)):
        schema["default"] = field.default
    return {"description": field.meta.description if field.meta else "", **schema}
