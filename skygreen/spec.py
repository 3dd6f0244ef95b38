"""The task file: a SkyPilot task YAML with one extra top-level section, `skygreen:`.

Everything SkyPilot knows stays SkyPilot's (`TaskSpec.sky`); skygreen reads its own section
into typed, frozen records with the defaults a user would expect, and rejects anything else
with a `SpecError` naming the field, the value, what is allowed and the likely intended name.

Example:

    name: bert-mlm
    skygreen:
      gpus: [A100, H100, L4, A10G]     # or {min_memory_gb: 24}
      gpu_count: 1
      clouds: [aws, gcp, azure]
      spot: true
      objective: cost                  # cost | time | energy | carbon
      work: {gpu_hours: 12, gpu: A100} # job size, in hours on one `gpu`
      max_price_per_hour: 4.0
      budget_usd: 60
      precision: auto                  # auto | bf16 | fp16 | fp32
      batch: {effective: 64, micro: auto}
      checkpoint: {bucket: s3://my-bucket/runs, every: auto, keep: 3}
      power: {cap: auto}               # auto | off | watts | fraction of the default limit
      early_stopping: {metric: val_loss, patience: 3, min_delta: 0.0}
      deadline: 36h                    # finish by then: spot with on-demand fallback
    run: python train.py
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skygreen.errors import InputError, SpecError, suggestion
from skygreen.fields import (
    DURATION_RE as _DURATION,
)
from skygreen.fields import (
    DURATION_S as _DURATION_S,
)
from skygreen.fields import (
    check_keys,
    read_bool,
    read_choice,
    read_duration_h,
    read_int,
    read_list,
    read_mapping,
    read_number,
    read_str,
    type_name,
)
from skygreen.gpus import GPU_NAMES, canonical_gpu_name

CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
OBJECTIVES: tuple[str, ...] = ("cost", "time", "energy", "carbon")
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
HALF_PRECISIONS: tuple[str, ...] = ("fp16", "bf16")
EARLY_STOP_MODES: tuple[str, ...] = ("min", "max")
RECOVERY_STRATEGIES: tuple[str, ...] = ("EAGER_NEXT_REGION", "FAILOVER")
BUCKET_SCHEMES: tuple[str, ...] = ("s3", "gs", "file")

# Top-level keys of a SkyPilot 0.14.1 task (sky/utils/schemas.py::get_task_schema), so that a
# misspelt key (`skygren:`, `rn:`) is caught here with a suggestion, before SkyPilot sees it.
SKYPILOT_TASK_KEYS: tuple[str, ...] = (
    "name", "workdir", "event_callback", "num_nodes", "resources", "file_mounts", "service",
    "pool", "setup", "run", "envs", "secrets", "managed_secrets", "inputs", "outputs",
    "file_mounts_mapping", "volumes", "volume_mounts", "api_server_access", "config", "_metadata",
)  # fmt: skip

SECTION = "skygreen"


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuChoice:
    """Which GPUs may run the job: named models, a memory floor, or both (all must hold)."""

    names: tuple[str, ...] | None = None
    """None means every GPU skygreen knows (`skygreen.gpus.GPUS`)."""
    min_memory_gb: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
    """The size of the job: `gpu_hours` of training on one `gpu`."""

    gpu_hours: float = 1.0
    gpu: str = "A100"


@dataclass(frozen=True, kw_only=True, slots=True)
class Batch:
    effective: int | None = None
    """Samples per optimizer step across all ranks; None keeps the training script's own."""
    micro: int | None = None
    """Samples per forward pass per rank; None means `auto` (probe the largest that fits)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    bucket: str | None = None
    """s3://, gs://, file:// or a local path; None means the local default bucket."""
    every_steps: int | None = None
    every_s: float | None = None
    """With neither set, the interval is `auto` (Young/Daly from the measured save cost)."""
    keep: int = 3
    half_precision: str | None = None
    """Store weights as fp16 or bf16 (smaller, not bit-exact); None stores them as trained."""

    @property
    def every_auto(self) -> bool:
        return self.every_steps is None and self.every_s is None


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerSpec:
    mode: str = "auto"
    """auto | off | watts | fraction."""
    cap_w: float | None = None
    cap_fraction: float | None = None
    required: bool = False
    """True: an error before training when the cap cannot be applied (no permission, no GPU)."""
    eta: float | None = None
    """The `auto` chooser's energy weight (0 = time only, 1 = energy only); None: skygreen.power's default."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EarlyStoppingSpec:
    metric: str
    mode: str = "min"
    patience: int = 3
    min_delta: float = 0.0
    grace: int = 0
    """Evaluations at the start that never count against patience (curricula, warm-up)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoverySpec:
    strategy: str = "EAGER_NEXT_REGION"
    max_restarts_on_errors: int = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class PreemptionSpec:
    """Overrides of the planner's spot model; None keeps the built-in assumption."""

    rate_per_hour: Mapping[str, float] = field(default_factory=dict)
    restart_minutes: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BudgetAlertSpec:
    """When the runtime warns about spend (`budget_usd` itself stops the run at 100%)."""

    at: tuple[float, ...] = ()
    """Fractions of budget_usd; empty means the default 0.5, 0.8, 1.0."""
    webhook_env: str | None = None
    """An environment variable (declare it in `secrets:`) holding the webhook URL to POST alerts to."""
    burn_usd_per_hour: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class GreenSpec:
    """The `skygreen:` section, validated, with defaults filled in."""

    gpus: GpuChoice = GpuChoice()
    gpu_count: int = 1
    clouds: tuple[str, ...] = CLOUDS
    regions: tuple[str, ...] | None = None
    spot: bool = True
    on_demand_fallback: bool = False
    objective: str = "cost"
    work: Work = Work()
    max_price_per_hour: float | None = None
    budget_usd: float | None = None
    budget_alerts: BudgetAlertSpec = BudgetAlertSpec()
    speed: Mapping[str, float] = field(default_factory=dict)
    """Relative training speed overrides, GPU name -> speed relative to one A100."""
    preemption: PreemptionSpec = PreemptionSpec()
    max_candidates: int = 8
    precision: str = "auto"
    batch: Batch = Batch()
    checkpoint: CheckpointSpec = CheckpointSpec()
    power: PowerSpec = PowerSpec()
    early_stopping: EarlyStoppingSpec | None = None
    recovery: RecoverySpec = RecoverySpec()
    deadline: float | None = None
    """Hours from launch by which the run must be done (`deadline: 36h`); None: no deadline."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskSpec:
    name: str | None
    green: GreenSpec
    sky: Mapping[str, Any]
    """The task file without its `skygreen:` section: SkyPilot's own keys, untouched."""
    num_nodes: int = 1
    source: str | None = None
    work_given: bool = False
    """The task says how big the job is (`skygreen.work`); without it estimates are for 1 GPU-hour."""
    notices: tuple[str, ...] = ()
    """One-line remarks for the user about the task file itself (a deprecated key)."""


# ---------------------------------------------------------------- loading


def load_spec(path: str | Path) -> TaskSpec:
    """Read and validate a task file; every problem is an `InputError` (exit code 2)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(
            f"task file not found: {path}\n  fix: check the path, e.g. `skygreen plan tasks/tiny.yaml`"
        ) from None
    except IsADirectoryError:
        raise InputError(f"task file is a directory: {path}\n  fix: name the YAML file inside it") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read task file {path}: {e}") from e
    try:
        return parse_spec_text(text, source=str(path))
    except SpecError as e:
        from skygreen.yaml12 import line_of

        line = None if e.field == "(file)" or e.field.startswith("line ") else line_of(text, e.field)
        raise e.with_source(str(path), line=line) from None


def parse_spec_text(text: str, *, source: str | None = None) -> TaskSpec:
    """Parse YAML 1.2 text into a `TaskSpec` (see `skygreen.yaml12` for why 1.2 and how)."""
    from skygreen.yaml12 import load_yaml12

    return parse_spec(load_yaml12(text), source=source)


def parse_spec(data: Any, *, source: str | None = None) -> TaskSpec:
    """Validate an already-parsed task mapping."""
    if data is None:
        raise SpecError("(file)", "the task file is empty", hint="write a SkyPilot task with a `skygreen:` section")
    if not isinstance(data, Mapping):
        raise SpecError(
            "(file)",
            f"a task file must be a mapping of keys to values, got a {type_name(data)}",
            hint="start with `name: ...`, `skygreen: ...`, `run: ...`",
        )
    data = read_mapping(data, "(file)")
    check_keys(data, (SECTION, *SKYPILOT_TASK_KEYS), "")
    name = None if data.get("name") is None else read_str(data["name"], "name")
    num_nodes = 1 if data.get("num_nodes") is None else read_int(data["num_nodes"], "num_nodes", minimum=1)
    green = _parse_green(data.get(SECTION) or {}, SECTION)
    sky = {k: v for k, v in data.items() if k != SECTION}
    section = data.get(SECTION) or {}
    work_given = isinstance(section, Mapping) and section.get("work") is not None
    notices = _work_notices(section["work"], green.work) if work_given else ()
    return TaskSpec(
        name=name, green=green, sky=sky, num_nodes=num_nodes, source=source, work_given=work_given, notices=notices
    )


# ---------------------------------------------------------------- sections


def _parse_green(raw: Any, path: str) -> GreenSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, GreenSpec.__dataclass_fields__, path)
    get = _getter(raw, path)
    values: dict[str, Any] = {}
    get(values, "gpus", _parse_gpus)
    get(values, "gpu_count", lambda v, p: read_int(v, p, minimum=1, maximum=64))
    get(values, "clouds", _parse_clouds)
    get(values, "regions", lambda v, p: tuple(read_str(r, f"{p}[{i}]") for i, r in enumerate(read_list(v, p))))
    get(values, "spot", read_bool)
    get(values, "on_demand_fallback", read_bool)
    get(values, "objective", lambda v, p: read_choice(v, p, OBJECTIVES))
    get(values, "work", _parse_work)
    get(values, "max_price_per_hour", lambda v, p: read_number(v, p, positive=True))
    get(values, "budget_usd", lambda v, p: read_number(v, p, positive=True))
    get(values, "budget_alerts", _parse_budget_alerts)
    get(values, "speed", _parse_speed)
    get(values, "preemption", _parse_preemption)
    get(values, "max_candidates", lambda v, p: read_int(v, p, minimum=1, maximum=64))
    get(values, "precision", lambda v, p: read_choice(v, p, PRECISIONS))
    get(values, "batch", _parse_batch)
    get(values, "checkpoint", _parse_checkpoint)
    get(values, "power", _parse_power)
    get(values, "early_stopping", _parse_early_stopping)
    get(values, "recovery", _parse_recovery)
    get(values, "deadline", read_duration_h)
    spec = GreenSpec(**values)
    if not spec.spot and spec.on_demand_fallback:
        raise SpecError(
            f"{path}.on_demand_fallback",
            "only means something with spot: true",
            value=True,
            hint="remove on_demand_fallback, or set spot: true",
        )
    return spec


def _getter(raw: Mapping[str, Any], path: str):
    """`get(values, key, reader)` stores reader(raw[key]) when the key is present and not null."""

    def get(values: dict[str, Any], key: str, reader) -> None:
        if raw.get(key) is not None:
            values[key] = reader(raw[key], f"{path}.{key}")

    return get


def _gpu_name(value: Any, path: str) -> str:
    name = read_str(value, path)
    base, _, count = name.partition(":")
    canonical = canonical_gpu_name(base.strip())
    if canonical is None:
        raise SpecError(
            path,
            f"unknown GPU {name!r}",
            allowed=", ".join(GPU_NAMES),
            hint=_gpu_hint(base),
        )
    if count:
        raise SpecError(
            path,
            "give the GPU count in gpu_count, not in the name",
            value=name,
            hint=f"write {canonical!r} and gpu_count: {count}",
        )
    return canonical


def _gpu_hint(name: str) -> str:
    return suggestion(name, GPU_NAMES) or "use one of the allowed names, or a constraint such as {min_memory_gb: 24}"


def _parse_gpus(raw: Any, path: str) -> GpuChoice:
    if isinstance(raw, Mapping):
        raw = read_mapping(raw, path)
        check_keys(raw, ("names", "min_memory_gb"), path)
        names = None
        if raw.get("names") is not None:
            names = _gpu_names(raw["names"], f"{path}.names")
        floor = None
        if raw.get("min_memory_gb") is not None:
            floor = read_number(raw["min_memory_gb"], f"{path}.min_memory_gb", positive=True)
        return GpuChoice(names=names, min_memory_gb=floor)
    return GpuChoice(names=_gpu_names(raw, path))


def _gpu_names(raw: Any, path: str) -> tuple[str, ...]:
    names = [_gpu_name(v, f"{path}[{i}]") for i, v in enumerate(read_list(raw, path))]
    return tuple(dict.fromkeys(names))


def _parse_clouds(raw: Any, path: str) -> tuple[str, ...]:
    clouds = [read_choice(v, f"{path}[{i}]", CLOUDS) for i, v in enumerate(read_list(raw, path))]
    return tuple(dict.fromkeys(clouds))


WORK_KEYS: tuple[str, ...] = ("gpu_hours", "gpu")
_WORK_OLD_KEY = "on"
"""The reference GPU's key until 0.1: `on` is a boolean in YAML 1.1, which PyYAML and
SkyPilot's own loader speak, so any tool that loads and re-dumps the task file with PyYAML
turns `on:` into `true:`. Still read, with a notice; so is that `true` key, when it stands
alone (nothing else in `work:` can have produced it)."""


def _parse_work(raw: Any, path: str) -> Work:
    written_as = (
        _WORK_OLD_KEY
        if isinstance(raw, Mapping) and _WORK_OLD_KEY in raw
        else "true"
        if isinstance(raw, Mapping) and any(k is True for k in raw)
        else "gpu"
    )
    raw = _work_with_gpu_key(raw, path)
    check_keys(raw, WORK_KEYS, path)
    values: dict[str, Any] = {}
    get = _getter(raw, path)
    get(values, "gpu_hours", lambda v, p: read_number(v, p, positive=True, maximum=1e7))
    if raw.get("gpu") is not None:  # errors name the key as the file spells it
        values["gpu"] = _gpu_name(raw["gpu"], f"{path}.{written_as}")
    return Work(**values)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _parse_budget_alerts(raw: Any, path: str) -> BudgetAlertSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, BudgetAlertSpec.__dataclass_fields__, path)
    values: dict[str, Any] = {}
    if raw.get("at") is not None:
        fractions = [
            read_number(v, f"{path}.at[{i}]", positive=True) for i, v in enumerate(read_list(raw["at"], f"{path}.at"))
        ]
        for i, f in enumerate(fractions):
            if f > 1:
                raise SpecError(
                    f"{path}.at[{i}]",
                    "is a fraction of budget_usd and must be at most 1",
                    value=f,
                    hint=f"write {f / 100:g} for {f:g}%" if f <= 100 else "use a number in (0, 1]",
                )
        values["at"] = tuple(sorted(set(fractions)))
    if raw.get("webhook_env") is not None:
        name = read_str(raw["webhook_env"], f"{path}.webhook_env")
        if not _ENV_NAME.match(name):
            hint = "name the environment variable that holds the URL (e.g. BUDGET_WEBHOOK, declared in secrets:), not the URL itself"
            raise SpecError(
                f"{path}.webhook_env",
                "is not an environment variable name",
                value=name if "://" not in name else "<a URL>",
                hint=hint,
            )
        values["webhook_env"] = name
    if raw.get("burn_usd_per_hour") is not None:
        values["burn_usd_per_hour"] = read_number(raw["burn_usd_per_hour"], f"{path}.burn_usd_per_hour", positive=True)
    return BudgetAlertSpec(**values)


def _work_with_gpu_key(raw: Any, path: str) -> Mapping[str, Any]:
    """`work:` with its reference GPU under `gpu`, whichever of the old spellings it used."""
    if isinstance(raw, Mapping) and any(key is True for key in raw):
        rest = {k: v for k, v in raw.items() if k is not True}
        if "gpu" in rest or _WORK_OLD_KEY in rest:
            raise SpecError(
                f"{path}.true",
                "a key `true` beside the GPU's key",
                value=raw[True],
                hint="keep only `gpu: NAME` (`true:` is what YAML 1.1 tools make of the old `on:`)",
            )
        raw = {**rest, "gpu": raw[True]}
    raw = read_mapping(raw, path)
    if _WORK_OLD_KEY in raw:
        if "gpu" in raw:
            raise SpecError(
                f"{path}.on", "both `on` and `gpu` name the reference GPU", value=raw["on"], hint="keep only `gpu`"
            )
        raw = {("gpu" if k == _WORK_OLD_KEY else k): v for k, v in raw.items()}
    return raw


def _work_notices(raw: Any, work: Work) -> tuple[str, ...]:
    """Say when `work:` names its GPU with an old key."""
    if isinstance(raw, Mapping) and any(key is True for key in raw):
        notice = (
            f"skygreen.work: read `true: {work.gpu}` as `gpu: {work.gpu}` (a YAML 1.1 tool turned the old key `on:` "
            f"into `true:`); write gpu: {work.gpu}"
        )
        return (notice,)
    if isinstance(raw, Mapping) and _WORK_OLD_KEY in raw:
        return (f"skygreen.work.on is deprecated (YAML 1.1 tools read `on` as true): write gpu: {work.gpu}",)
    return ()


def _parse_speed(raw: Any, path: str) -> dict[str, float]:
    raw = read_mapping(raw, path)
    return {
        _gpu_name(name, f"{path}.{name}"): read_number(speed, f"{path}.{name}", positive=True, maximum=1000)
        for name, speed in raw.items()
    }


def _parse_preemption(raw: Any, path: str) -> PreemptionSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, ("rate_per_hour", "restart_minutes"), path)
    rates: dict[str, float] = {}
    if raw.get("rate_per_hour") is not None:
        rate_path = f"{path}.rate_per_hour"
        for cloud, rate in read_mapping(raw["rate_per_hour"], rate_path).items():
            cloud_name = read_choice(cloud, f"{rate_path}.{cloud}", CLOUDS)
            rates[cloud_name] = read_number(rate, f"{rate_path}.{cloud}", minimum=0.0, maximum=60.0)
    restart = None
    if raw.get("restart_minutes") is not None:
        restart = read_number(raw["restart_minutes"], f"{path}.restart_minutes", minimum=0.0, maximum=1440.0)
    return PreemptionSpec(rate_per_hour=rates, restart_minutes=restart)


def _parse_batch(raw: Any, path: str) -> Batch:
    raw = read_mapping(raw, path)
    check_keys(raw, ("effective", "micro"), path)
    effective = None
    if raw.get("effective") is not None:
        effective = read_int(raw["effective"], f"{path}.effective", minimum=1)
    micro = None
    if raw.get("micro") is not None and raw["micro"] != "auto":
        micro = read_int(raw["micro"], f"{path}.micro", minimum=1)
    if effective is not None and micro is not None and micro > effective:
        raise SpecError(
            f"{path}.micro",
            f"is larger than the effective batch {effective}",
            value=micro,
            hint="set micro to at most the effective batch, or to auto",
        )
    return Batch(effective=effective, micro=micro)


def with_deadline(spec: TaskSpec, raw: Any, path: str) -> TaskSpec:
    """The task with its deadline set from a flag (`plan --deadline 36h`)."""
    green = dataclasses.replace(spec.green, deadline=read_duration_h(raw, path))
    return dataclasses.replace(spec, green=green)


def _parse_every(raw: Any, path: str) -> tuple[int | None, float | None]:
    """`auto`, an integer number of steps, or a duration such as `90s`, `5m`, `1h`."""
    if raw == "auto":
        return None, None
    if isinstance(raw, str):
        match = _DURATION.match(raw)
        if not match:
            raise SpecError(
                path, "expected auto, a number of steps, or a duration", value=raw, allowed="auto | 500 | 90s | 5m | 1h"
            )
        seconds = float(match.group(1)) * _DURATION_S[match.group(2)]
        if seconds <= 0:
            raise SpecError(path, "the interval must be greater than 0", value=raw)
        return None, seconds
    return read_int(raw, path, minimum=1), None


def _parse_checkpoint(raw: Any, path: str) -> CheckpointSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, ("bucket", "every", "keep", "half_precision"), path)
    values: dict[str, Any] = {}
    if raw.get("bucket") is not None:
        values["bucket"] = _parse_bucket(raw["bucket"], f"{path}.bucket")
    if raw.get("every") is not None:
        values["every_steps"], values["every_s"] = _parse_every(raw["every"], f"{path}.every")
    if raw.get("keep") is not None:
        values["keep"] = read_int(raw["keep"], f"{path}.keep", minimum=2, maximum=1000)
    if raw.get("half_precision") not in (None, False):
        values["half_precision"] = read_choice(raw["half_precision"], f"{path}.half_precision", HALF_PRECISIONS)
    return CheckpointSpec(**values)


def _parse_bucket(raw: Any, path: str) -> str:
    url = read_str(raw, path).strip()
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url  # a local path
    if scheme.lower() not in BUCKET_SCHEMES:
        raise SpecError(
            path,
            f"unsupported bucket scheme {scheme!r}",
            value=url,
            allowed="s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, file:///PATH or a local path",
        )
    if not rest.strip("/"):
        raise SpecError(path, "the bucket URL names no bucket", value=url, hint=f"write {scheme}://BUCKET/PREFIX")
    return f"{scheme.lower()}://{rest}"


def _parse_power(raw: Any, path: str) -> PowerSpec:
    raw = read_mapping(raw, path)
    check_keys(raw, ("cap", "required", "eta"), path)
    extra: dict[str, Any] = {}
    if "required" in raw:
        extra["required"] = read_bool(raw["required"], f"{path}.required")
    if raw.get("eta") is not None:
        extra["eta"] = read_number(raw["eta"], f"{path}.eta", minimum=0.0, maximum=1.0)
    cap = raw.get("cap", "auto")
    cap_path = f"{path}.cap"
    if cap is False or cap == "off":
        return PowerSpec(mode="off", **extra)
    if cap is None or cap == "auto":
        return PowerSpec(mode="auto", **extra)
    value = read_number(cap, cap_path, positive=True)
    if value <= 1.0:
        if value < 0.3:
            raise SpecError(
                cap_path,
                "a power cap below 30% of the default limit stalls training",
                value=cap,
                hint="use a fraction between 0.3 and 1.0, or watts",
            )
        return PowerSpec(mode="fraction", cap_fraction=value, **extra)
    if value < 50 or value > 1500:
        raise SpecError(
            cap_path,
            "watts must be between 50 and 1500",
            value=cap,
            allowed="auto | off | watts (50-1500) | fraction (0.3-1.0)",
        )
    return PowerSpec(mode="watts", cap_w=value, **extra)


def _parse_early_stopping(raw: Any, path: str) -> EarlyStoppingSpec | None:
    if raw is False:
        return None
    raw = read_mapping(raw, path)
    check_keys(raw, EarlyStoppingSpec.__dataclass_fields__, path)
    if raw.get("metric") is None:
        raise SpecError(
            f"{path}.metric", "is required", hint="name the metric your script reports, e.g. metric: val_loss"
        )
    values: dict[str, Any] = {"metric": read_str(raw["metric"], f"{path}.metric")}
    get = _getter(raw, path)
    get(values, "mode", lambda v, p: read_choice(v, p, EARLY_STOP_MODES))
    get(values, "patience", lambda v, p: read_int(v, p, minimum=1))
    get(values, "min_delta", lambda v, p: read_number(v, p, minimum=0.0))
    get(values, "grace", lambda v, p: read_int(v, p, minimum=0))
    return EarlyStoppingSpec(**values)


def _parse_recovery(raw: Any, path: str) -> RecoverySpec:
    if isinstance(raw, str):
        raw = {"strategy": raw}
    raw = read_mapping(raw, path)
    check_keys(raw, ("strategy", "max_restarts_on_errors"), path)
    values: dict[str, Any] = {}
    get = _getter(raw, path)
    get(values, "strategy", lambda v, p: read_choice(v, p, RECOVERY_STRATEGIES))
    get(values, "max_restarts_on_errors", lambda v, p: read_int(v, p, minimum=0, maximum=100))
    return RecoverySpec(**values)
