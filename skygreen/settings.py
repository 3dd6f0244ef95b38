"""The runtime settings contract between `skygreen up` (laptop) and `skygreen.runtime` (container).

`skygreen up` renders these as `envs` of the SkyPilot task (and `--local` sets the same
variables for its subprocess); the runtime reads them back with `RuntimeSettings.from_env`.
Code that constructs the runtime can pass its own values, which win over the environment.

One variable a cluster can set for everybody: `SKYGREEN_DEFAULT_PRECISION`, which stands in for
`auto` (the default) unless the training code names a precision itself, so nobody forgets the
cheapest switch. The runtime applies it (`skygreen.runtime.run`), where the code's choice is known.

Credentials are never part of these settings: buckets are reached with the cloud's own
credential chain (instance roles, SkyPilot `secrets`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skygreen.errors import RuntimeSetupError, SpecError
from skygreen.fields import read_choice, read_int, read_number
from skygreen.spec import EARLY_STOP_MODES, HALF_PRECISIONS, PRECISIONS, TRAINERS, EarlyStopConfig, GreenSpec

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


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeSettings:
    """Everything the in-container runtime needs to know about its run."""

    run_id: str
    bucket: str
    """Base checkpoint URL; the run's checkpoints live under `<bucket>/<run_id>/`."""
    precision: str = "auto"
    effective_batch: int | None = None
    micro_batch: int | None = None
    """None means auto: probe the largest micro-batch that fits."""
    checkpoint_every_steps: int | None = None
    checkpoint_every_s: float | None = None
    checkpoint_keep: int = 3
    checkpoint_half_precision: str | None = None
    checkpoint_dir: str | None = None
    """Folder mode: the folder the script saves checkpoint folders into (`skygreen.folder_mode`)."""
    checkpoint_marker: str | None = None
    checkpoint_quiet_s: float | None = None
    trainer: str | None = None
    """What owns the loop (`skygreen.spec.TRAINERS`) where it is not `sg.Run` (None); the smoke
    test and the integrations read it."""
    power_cap: str = "auto"
    """auto | off | <watts> | <fraction of the default limit>, as written in the task file."""
    power_required: bool = False
    """True: stop before training when the cap cannot be applied."""
    power_eta: float | None = None
    """The `auto` chooser's energy weight; None: `skygreen.power.policy.DEFAULT_ETA`."""
    early_stop: EarlyStopConfig | None = None
    """Travels as `SKYGREEN_EARLY_STOP_METRIC`, `_MODE`, `_PATIENCE`, `_MIN_DELTA`, `_GRACE`."""
    preemptions_per_hour: float | None = None
    """A fixed spot preemption rate for the `auto` checkpoint interval; when set it wins over
    the per-cloud table (a cluster's own measurement, a test)."""
    preemptions_per_hour_by_cloud: Mapping[str, float] | None = None
    """Assumed spot preemption rate per node-hour on each cloud the run may land on (the
    planner's table, with the task's `preemption.rate_per_hour`). A managed job's fallbacks
    span clouds, so `up` cannot know the rate; the runtime picks its cloud's row once it
    knows where it landed (`SKYPILOT_CLUSTER_INFO`). Rendered as `aws=0.47,gcp=0.24`."""
    cloud: str | None = None
    budget_usd: float | None = None
    """Stop cleanly (checkpoint, state `budget`) when the run's spend reaches it."""
    budget_alerts: str | None = None
    """Comma-separated fractions of the budget that raise an alert (default 0.5,0.8,1)."""
    budget_webhook_env: str | None = None
    """Name of the environment variable holding the alert webhook URL (the URL is a secret)."""
    burn_alert_usd_per_hour: float | None = None
    offers: str | None = None
    """The plan's offers with prices (`skygreen.ledger.place.offers_env`), for the ledger."""

    def preemption_rate_on(self, cloud: str | None) -> float | None:
        """The rate to assume on `cloud`: the fixed rate, else the cloud's row of the table,
        else (cloud unknown) the highest row, since too many checkpoints cost less than a
        lost interval; None when nothing is known."""
        if self.preemptions_per_hour is not None:
            return self.preemptions_per_hour
        table = self.preemptions_per_hour_by_cloud or {}
        if cloud is not None and cloud in table:
            return table[cloud]
        return max(table.values()) if table else None

    @classmethod
    def from_spec(
        cls,
        spec: GreenSpec,
        *,
        run_id: str,
        bucket: str,
        cloud: str | None = None,
        preemptions_per_hour: float | None = None,
        offers: str | None = None,
        preemptions_per_hour_by_cloud: Mapping[str, float] | None = None,
    ) -> RuntimeSettings:
        """Settings for a run of a task; `bucket` is the resolved base URL."""
        power = spec.power
        cap_value = {"watts": power.cap_w, "fraction": power.cap_fraction}.get(power.mode)
        cap = power.mode if cap_value is None else f"{cap_value:g}"
        return cls(
            run_id=run_id,
            bucket=bucket,
            precision=spec.precision,
            effective_batch=spec.batch.effective,
            micro_batch=spec.batch.micro,
            checkpoint_every_steps=spec.checkpoint.every_steps,
            checkpoint_every_s=spec.checkpoint.every_s,
            checkpoint_keep=spec.checkpoint.keep,
            checkpoint_half_precision=spec.checkpoint.half_precision,
            checkpoint_dir=spec.checkpoint.dir,
            checkpoint_marker=spec.checkpoint.marker,
            checkpoint_quiet_s=spec.checkpoint.quiet_s,
            trainer=None if spec.trainer == "runtime" else spec.trainer,
            power_cap=cap,
            power_required=power.required,
            power_eta=power.eta,
            early_stop=spec.early_stopping,
            preemptions_per_hour=preemptions_per_hour,
            preemptions_per_hour_by_cloud=dict(preemptions_per_hour_by_cloud)
            if preemptions_per_hour_by_cloud
            else None,
            cloud=cloud,
            budget_usd=spec.budget_usd,
            budget_alerts=",".join(f"{f:g}" for f in spec.budget_alerts.at) if spec.budget_alerts.at else None,
            budget_webhook_env=spec.budget_alerts.webhook_env,
            burn_alert_usd_per_hour=spec.budget_alerts.burn_usd_per_hour,
            offers=offers,
        )

    def to_env(self) -> dict[str, str]:
        """The `SKYGREEN_*` variables for SkyPilot `envs`; unset fields are left out."""
        flat: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        stop = flat.pop("early_stop")
        if stop is not None:
            flat.update({f"early_stop_{f.name}": getattr(stop, f.name) for f in dataclasses.fields(stop)})
        for name, value in flat.items():
            if isinstance(value, Mapping):  # `aws=0.47,gcp=0.24`; an empty table is left out
                flat[name] = ",".join(f"{k}={v:g}" for k, v in sorted(value.items())) or None
        return {_env_name(name): _env_value(value) for name, value in flat.items() if value is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> RuntimeSettings:
        """Settings from the environment, with `overrides` (from code) winning.

        A malformed variable is a `RuntimeSetupError` naming the variable.
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field_name in _flat_field_names():
            name = _env_name(field_name)
            if name in environ and environ[name] != "":
                values[field_name] = _parse_env(field_name, environ[name], name)
        stop = {k.removeprefix("early_stop_"): values.pop(k) for k in list(values) if k.startswith("early_stop_")}
        if stop.get("metric"):
            values["early_stop"] = EarlyStopConfig(**stop)
        values.update({k: v for k, v in overrides.items() if v is not None})
        for required in ("run_id", "bucket"):
            if required not in values:
                raise RuntimeSetupError(
                    f"{_env_name(required)} is not set\n"
                    "  fix: start the script with `skygreen up` (or `--local`), or pass "
                    f"{required}= to the runtime"
                )
        try:
            return cls(**values)
        except TypeError as e:
            raise RuntimeSetupError(f"bad runtime settings: {e}") from e


def _flat_field_names() -> list[str]:
    """Every setting as it travels: the fields, with `early_stop` spread into its own."""
    names = [f.name for f in dataclasses.fields(RuntimeSettings) if f.name != "early_stop"]
    return names + [f"early_stop_{f.name}" for f in dataclasses.fields(EarlyStopConfig)]


def env_names() -> frozenset[str]:
    """The `SKYGREEN_*` variables skygreen owns in every run's environment (a task's own
    `envs:` may not set them)."""
    return frozenset(_env_name(name) for name in _flat_field_names())


def _env_name(field_name: str) -> str:
    return "SKYGREEN_" + field_name.upper()


def _env_value(value: Any) -> str:
    """Floats as `%g`, booleans as `true`/`false`, the rest as `str`."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


_INTS = {
    "effective_batch",
    "micro_batch",
    "checkpoint_every_steps",
    "checkpoint_keep",
    "early_stop_patience",
    "early_stop_grace",
}
_FLOATS = {
    "checkpoint_every_s",
    "checkpoint_quiet_s",
    "early_stop_min_delta",
    "preemptions_per_hour",
    "budget_usd",
    "burn_alert_usd_per_hour",
    "power_eta",
}
_BOOLS = {"power_required"}
_CHOICES = {
    "trainer": TRAINERS,
    "precision": PRECISIONS,
    "checkpoint_half_precision": HALF_PRECISIONS,
    "early_stop_mode": EARLY_STOP_MODES,
}


def _parse_rates(raw: str, env_name: str) -> dict[str, float]:
    """`aws=0.47,gcp=0.24` -> {"aws": 0.47, "gcp": 0.24}."""
    rates = {}
    for item in raw.split(","):
        cloud, sep, rate = item.strip().partition("=")
        try:
            value = float(rate)
        except ValueError:
            value = None
        if not sep or not cloud.strip() or value is None:
            raise SpecError(
                env_name, "expected CLOUD=RATE pairs separated by commas", value=raw, allowed="aws=0.47,gcp=0.24"
            )
        rates[cloud.strip().lower()] = read_number(value, f"{env_name} ({cloud.strip()})", minimum=0.0)
    return rates


def _parse_env(field_name: str, raw: str, env_name: str) -> Any:
    try:
        if field_name == "preemptions_per_hour_by_cloud":
            return _parse_rates(raw, env_name)
        if field_name in _INTS:
            try:
                number = int(raw)
            except ValueError:
                raise SpecError(env_name, "expected an integer", value=raw) from None
            return read_int(number, env_name, minimum=0 if field_name == "early_stop_grace" else 1)
        if field_name in _FLOATS:
            try:
                real = float(raw)
            except ValueError:
                raise SpecError(env_name, "expected a number", value=raw) from None
            return read_number(real, env_name, minimum=0.0)
        if field_name in _BOOLS:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise SpecError(env_name, "expected true or false", value=raw)
            return raw.lower() in ("true", "1")
        if field_name in _CHOICES:
            return read_choice(raw, env_name, _CHOICES[field_name])
    except SpecError as e:
        raise RuntimeSetupError(str(e)) from None
    return raw
