"""The runtime settings contract between `skygreen up` (laptop) and `skygreen.runtime` (container).

`RuntimeSettings` validates itself once, in `__post_init__`, whoever builds it: `from_spec` on
the laptop, `from_env` on the VM, or code. One codec, driven by the field types, carries it:
one `SKYGREEN_<FIELD>` variable per field (a nested record such as `early_stop` is spread into
`SKYGREEN_EARLY_STOP_<FIELD>`; one with a text form, `CapRequest`, travels as that text), read
by the same `decode` that the runtime's other variables use, so the VM has no second parser.

Why one variable per field and not one JSON variable: users override one setting at launch
(`sky jobs launch --env SKYGREEN_BUDGET_USD=40`, or a cluster's defaults), the docs name such
variables, and a task's `envs:` is checked against these names; one JSON blob would make every
such override rewrite the whole blob. Code that constructs the runtime passes its own values,
which win over the environment.

A cluster may set `SKYGREEN_DEFAULT_PRECISION` for everybody: it stands in for `auto` unless the
training code names a precision itself (applied in `skygreen.runtime.run`, where that is known).
Credentials are never part of these settings: buckets are reached with the cloud's own
credential chain (instance roles, SkyPilot `secrets`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skygreen.errors import RuntimeSetupError, SpecError
from skygreen.memory.planned import PlannedMemory
from skygreen.power.policy import CapRequest
from skygreen.task.declare import Field, Record, fields_of, without_none
from skygreen.task.spec import EarlyStopConfig, GreenSpec

DEFAULT_PRECISION_ENV = "SKYGREEN_DEFAULT_PRECISION"
SMOKE_ENV = "SKYGREEN_SMOKE"
"""Set to 1 by the CPU smoke test (`skygreen.launch.smoke`): the runtime trains two tiny steps."""
SMOKE_LINE = "skygreen smoke: ok"
"""The runtime's line on a passed smoke test; the laptop side looks for it in the output."""
SMOKE_FAILED = "skygreen smoke: failed at"
"""The runtime's line on a failed smoke test, followed by the phase and the error."""
TASK_SIZE_ENV = "SKYGREEN_TASK_SIZE"
"""`full` or `small`: the one variable a task script reads to shrink its model and data (the
shipped tasks do). The smoke test sets `small` unless it is already set; users set it too, e.g.
to try a task on a laptop."""


def task_field(path: str, convert: Callable[[Any], Any] = lambda value: value) -> Any:
    """A setting that carries the task file's field at `path`, with that field's declared default.

    `RuntimeSettings.from_spec` reads it from the `skygreen:` section's records (`checkpoint.keep`),
    through `convert`; the declaration (`skygreen.task.declare`) says the default once.
    """
    declared = _declared(GreenSpec, path.split("."))
    default = convert(declared.default if declared is not None else None)
    return field(default=default, metadata={"task": path, "convert": convert})


def _declared(record: type, path: list[str]) -> Field | None:
    """The declaration of the field at `path` under `record`.

    None for a value a record derives (`checkpoint.every_steps`) rather than declares.
    """
    found = {f.name: f for f in fields_of(record)}.get(path[0])
    return found if found is None or len(path) == 1 else _declared(found.hint, path[1:])


def _choices(setting: dataclasses.Field[Any]) -> tuple[str, ...]:
    """The names a setting that carries a task file field allows, as the field declares them."""
    declared = _declared(GreenSpec, setting.metadata["task"].split(".")) if "task" in setting.metadata else None
    return declared.extra.get("choices", ()) if declared is not None else ()


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeSettings:
    """Everything the in-container runtime needs to know about its run, validated on construction.

    A field declared `task_field("checkpoint.keep")` carries that task file field: its meaning,
    default and bounds are the declaration's (`skygreen.task.sections`, `skygreen.task.records`).

    Raises:
        RuntimeSetupError: a field out of range, naming its variable, the value and the fix.
    """

    run_id: str
    bucket: str
    """Base checkpoint URL; the run's checkpoints live under `<bucket>/<run_id>/`."""
    precision: str = task_field("precision")
    effective_batch: int | None = task_field("batch.effective")
    micro_batch: int | None = task_field("batch.micro")
    """None means auto: probe the largest micro-batch that fits."""
    checkpoint_every_steps: int | None = task_field("checkpoint.every_steps")
    checkpoint_every_s: float | None = task_field("checkpoint.every_s")
    checkpoint_keep: int = task_field("checkpoint.keep")
    checkpoint_half_precision: str | None = task_field("checkpoint.half_precision")
    checkpoint_dir: str | None = task_field("checkpoint.dir")
    checkpoint_marker: str | None = task_field("checkpoint.marker")
    checkpoint_quiet_s: float | None = task_field("checkpoint.quiet_s")
    checkpoint_region: str | None = task_field("checkpoint.region")
    trainer: str | None = task_field("trainer", lambda name: None if name == "runtime" else name)
    """What owns the loop (`skygreen.task.spec.TRAINERS`) where it is not `sg.Run` (None); the smoke
    test and the integrations read it."""
    power_cap: CapRequest = task_field("power.cap")
    """auto | off | <watts> | <fraction of the default limit>; travels as that text (`0.6`)."""
    power_required: bool = task_field("power.required")
    power_eta: float | None = task_field("power.eta")
    early_stop: EarlyStopConfig | None = task_field("early_stopping")
    """Travels as `SKYGREEN_EARLY_STOP_METRIC`, `_MODE`, `_PATIENCE`, `_MIN_DELTA`, `_GRACE`."""
    preemptions_per_hour: float | None = None
    """A fixed spot preemption rate for the `auto` checkpoint interval; when set it wins over
    the per-cloud table (a cluster's own measurement, a test)."""
    preemptions_per_hour_by_cloud: Mapping[str, float] | None = None
    """The plan's spot preemption rates per cloud (`aws=0.47,gcp=0.24`): a managed job's fallbacks
    span clouds, so the runtime picks its row once it knows where it landed."""
    cloud: str | None = None
    budget_usd: float | None = task_field("budget_usd")
    budget_alerts: tuple[float, ...] | None = task_field("budget_alerts.at", lambda at: tuple(at) or None)
    """Fractions of the budget that raise an alert, sorted, each once (None: 0.5, 0.8, 1)."""
    budget_webhook_env: str | None = task_field("budget_alerts.webhook_env")
    burn_alert_usd_per_hour: float | None = task_field("budget_alerts.burn_usd_per_hour")
    offers: str | None = None
    """The plan's offers with prices (`skygreen.ledger.place.offers_env`), for the ledger."""
    user: str | None = None
    """Who launched the run (`registry.launching_user`); the ledger records it for `cost --all --by user`."""
    launch: int | None = None
    """This life's launch number (1 for `up`, one more per `resume` or relaunch), for the writer
    lease (`skygreen.checkpoint.lease`); None outside skygreen's launchers: no lease is taken."""
    ledger_heartbeat_s: float | None = None
    """Seconds between ledger heartbeats (`skygreen.runtime.run_book`); None: every 30 s."""
    memory_planned_gb: PlannedMemory | None = None
    """The plan's per-GPU memory estimate, which the ledger records beside the measured peak."""

    def __post_init__(self) -> None:
        for name in ("run_id", "bucket"):
            if not getattr(self, name):
                _bad(name, getattr(self, name), "must not be empty", "start the script with `skygreen up`")
        for f in dataclasses.fields(self):
            value, hint, choices = getattr(self, f.name), without_none(_HINTS[f.name]), _CHOICES[f.name]
            if value is None:
                continue
            if choices and value not in choices:
                _bad(f.name, value, f"must be one of {', '.join(choices)}", f"one of {', '.join(choices)}")
            if hint is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                _bad(f.name, value, "must be an integer >= 1", "set a whole number such as 4")
            if hint is float and f.name not in _ABOVE_ZERO and not _non_negative(value):
                _bad(f.name, value, "must be a finite number >= 0", "set a number such as 0.5")
        # A budget of 0 would stop before the first step; the ledger's BudgetPolicy refuses it too,
        # but only later, deep in the run's start, so it is refused here with the variable's name.
        if self.budget_usd is not None and not (_non_negative(self.budget_usd) and self.budget_usd > 0):
            _bad("budget_usd", self.budget_usd, "must be a number of dollars > 0",
                 "set a budget such as 40, or unset it for no budget")  # fmt: skip
        if not isinstance(self.power_cap, CapRequest):
            _bad("power_cap", self.power_cap, "must be a CapRequest", "CapRequest.parse('0.6')")
        if self.preemptions_per_hour_by_cloud is not None:
            rates = {str(k).strip().lower(): v for k, v in self.preemptions_per_hour_by_cloud.items()}
            if not rates or any(not k or not _non_negative(v) for k, v in rates.items()):
                _bad("preemptions_per_hour_by_cloud", self.preemptions_per_hour_by_cloud,
                     "needs CLOUD=RATE pairs, each rate a number >= 0", "aws=0.47,gcp=0.24")  # fmt: skip
            object.__setattr__(self, "preemptions_per_hour_by_cloud", rates)
        if self.budget_alerts is not None:
            alerts = tuple(sorted(set(self.budget_alerts)))
            if not alerts or any(not (_non_negative(v) and 0 < v <= 1) for v in alerts):
                _bad("budget_alerts", self.budget_alerts, "every fraction must be in (0, 1]", "0.5,0.8,1")
            object.__setattr__(self, "budget_alerts", alerts)
        if self.ledger_heartbeat_s is not None and not (
            _non_negative(self.ledger_heartbeat_s) and self.ledger_heartbeat_s > 0
        ):
            _bad("ledger_heartbeat_s", self.ledger_heartbeat_s, "must be a number of seconds > 0", "30, or unset it")

    def preemption_rate_on(self, cloud: str | None) -> float | None:
        """The preemption rate to assume on `cloud`.

        The fixed rate, else the cloud's row of the table, else (cloud unknown) the highest row,
        since too many checkpoints cost less than a lost interval; None when nothing is known.

        Args:
            cloud: where the run landed (`aws`, `gcp`, `azure`), or None when unknown.

        Returns:
            Preemptions per node-hour, or None.
        """
        if self.preemptions_per_hour is not None:
            return self.preemptions_per_hour
        table = self.preemptions_per_hour_by_cloud or {}
        if cloud is not None and cloud in table:
            return table[cloud]
        return max(table.values()) if table else None

    @classmethod
    def from_spec(cls, spec: GreenSpec, *, run_id: str, bucket: str, **run: Any) -> RuntimeSettings:
        """The settings of a run of a task, as `skygreen up` builds them before `to_env`.

        Each `task_field` comes from `spec`, the rest from what the launch knows (`**run`:
        `cloud`, `offers`, `user`, the preemption rates; None leaves a field unset).
        """
        from_task = {
            f.name: f.metadata["convert"](_get(spec, tuple(f.metadata["task"].split("."))))
            for f in dataclasses.fields(cls)
            if "task" in f.metadata
        }
        return cls(run_id=run_id, bucket=bucket, **from_task, **run)

    def to_env(self) -> dict[str, str]:
        """The `SKYGREEN_*` variables for SkyPilot `envs`, one per field; unset fields are left out."""
        env: dict[str, str] = {}
        for path, hint in _flat_fields():
            value = _get(self, path)
            if value is not None:
                env[_env_name(path)] = encode(value, hint)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RuntimeSettings:
        """The settings from the `SKYGREEN_*` variables of `environ` (default `os.environ`).

        `overrides` from code win (None is ignored).

        Raises:
            RuntimeSetupError: a malformed, out-of-range or missing variable, named.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for path, hint in _flat_fields():
            name = _env_name(path)
            raw = environ.get(name, "")
            if raw == "":
                continue
            if len(path) == 1:
                values[path[0]] = decode(raw, hint, name)
            else:
                nested.setdefault(path[0], {})[path[1]] = decode(raw, hint, name)
        for outer, inner in nested.items():
            values[outer] = _build_record(outer, inner)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for required in ("run_id", "bucket"):
            if required not in values:
                raise RuntimeSetupError(
                    f"{_env_name((required,))} is not set\n"
                    "  fix: start the script with `skygreen up` (or `--local`), or pass "
                    f"{required}= to the runtime"
                )
        try:
            return cls(**values)
        except TypeError as e:
            raise RuntimeSetupError(f"bad runtime settings: {e}") from e


# -- the codec ------------------------------------------------------------------------------


def encode(value: Any, hint: Any) -> str:
    """One setting's value as the text of its variable.

    Floats as `%g`, booleans as `true`/`false`, tuples comma-separated, mappings as `key=value`
    pairs, a record with a text form (`to_text`) as that text.
    """
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if hasattr(value, "to_text"):
        return str(value.to_text())
    if isinstance(value, Mapping):
        return ",".join(f"{k}={encode(v, None)}" for k, v in sorted(value.items()))
    if isinstance(value, (tuple, list, frozenset)):
        return ",".join(encode(v, None) for v in value)
    return str(value)


def decode(raw: str, hint: Any, name: str) -> Any:
    """The text of variable `name` read as `hint`: the one parser of runtime variables.

    `hint` is int, float, bool, str, `tuple[X, ...]`, `Mapping[str, X]`, a record with a `parse`
    classmethod, or one of those `| None`.

    Raises:
        RuntimeSetupError: the text is not a `hint`, naming the variable.
    """
    hint = without_none(hint)
    origin = typing.get_origin(hint)
    try:
        if origin is tuple:
            item = typing.get_args(hint)[0]
            return tuple(decode(part.strip(), item, name) for part in raw.split(",") if part.strip())
        if origin in (Mapping, dict):
            item = typing.get_args(hint)[1]
            pairs = {}
            for part in raw.split(","):
                key, sep, value = part.strip().partition("=")
                if not sep or not key.strip():
                    raise SpecError(name, "expected KEY=VALUE pairs separated by commas", value=raw,
                                    allowed="aws=0.47,gcp=0.24")  # fmt: skip
                pairs[key.strip().lower()] = decode(value.strip(), item, f"{name} ({key.strip()})")
            return pairs
        if hint is bool:
            if raw.strip().lower() not in ("true", "false", "1", "0"):
                raise SpecError(name, "expected true or false", value=raw)
            return raw.strip().lower() in ("true", "1")
        if hint in (int, float):
            try:
                return hint(raw)
            except ValueError:
                raise SpecError(name, "expected " + ("an integer" if hint is int else "a number"), value=raw) from None
        if hasattr(hint, "parse"):
            try:
                return hint.parse(raw)
            except ValueError as e:
                raise SpecError(name, str(e), value=raw) from None
    except SpecError as e:
        raise RuntimeSetupError(str(e)) from None
    return raw


def _is_spread(hint: Any) -> bool:
    """A nested record whose fields travel as variables of their own (not one with a text form)."""
    hint = without_none(hint)
    return isinstance(hint, type) and issubclass(hint, Record) and not hasattr(hint, "parse")


def _flat_fields() -> list[tuple[tuple[str, ...], Any]]:
    """Every setting as it travels, with its type: a spread record's fields under its name."""
    out: list[tuple[tuple[str, ...], Any]] = []
    for f in dataclasses.fields(RuntimeSettings):
        hint = _HINTS[f.name]
        if _is_spread(hint):
            out.extend(((f.name, inner.name), inner.hint) for inner in fields_of(without_none(hint)))
        else:
            out.append(((f.name,), hint))
    return out


def _build_record(outer: str, values: dict[str, Any]) -> Any:
    """A spread record from the variables given; one missing a required field names it."""
    record = without_none(_HINTS[outer])
    required = [f.name for f in fields_of(record) if f.required]
    missing = [name for name in required if name not in values]
    given = ", ".join(_env_name((outer, name)) for name in values)
    if missing:
        raise RuntimeSetupError(
            f"{given} set but {_env_name((outer, missing[0]))} is not\n"
            f"  fix: set {_env_name((outer, missing[0]))} too, or unset {given}"
        )
    try:
        return record(**values)
    except ValueError as e:
        raise RuntimeSetupError(f"{given}: {e}") from None


def _get(record: Any, path: tuple[str, ...]) -> Any:
    """The value at the dotted `path` under `record`; None where a part on the way is None."""
    value: Any = record
    for part in path:
        value = getattr(value, part)
        if value is None:
            return None
    return value


def field_from_env(name: str, environ: Mapping[str, str]) -> Any:
    """One setting read from its variable, checked as the settings check it; None when unset.

    For code that needs it alone (a `Checkpointer` built by hand reads `launch`).
    """
    variable = _env_name((name,))
    raw = environ.get(variable, "")
    if raw.strip() == "":
        return None
    value = decode(raw, _HINTS[name], variable)
    RuntimeSettings(run_id="-", bucket="-", **{name: value})  # the field's own checks
    return value


def env_names() -> frozenset[str]:
    """The `SKYGREEN_*` variables skygreen owns in every run's environment (a task's `envs:` may not set them)."""
    return frozenset(_env_name(path) for path, _ in _flat_fields())


def _env_name(path: tuple[str, ...]) -> str:
    return "SKYGREEN_" + "_".join(path).upper()


def _non_negative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _bad(name: str, value: Any, problem: str, fix: str) -> None:
    raise RuntimeSetupError(f"{_env_name((name,))} ({name}): {problem}, got {value!r}\n  fix: {fix}")


_HINTS = typing.get_type_hints(RuntimeSettings)
_CHOICES = {f.name: _choices(f) for f in dataclasses.fields(RuntimeSettings)}
"""The names each setting allows, from its task field's declaration (empty: any), read once."""
_ABOVE_ZERO = ("budget_usd", "ledger_heartbeat_s")
"""Numbers checked on their own above 0, with their unit, where the others may be 0."""
