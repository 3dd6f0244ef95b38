"""The task file's hardware fields: which GPUs and clouds may run the job, how big the job is
(`work:`), and relative speeds: their records, declared field by field
(`skygreen.task.declare`), and the readers of the values that are more than a type (a GPU
name in any case, one name for a list, the old `work.on:`)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from skygreen.errors import SpecError, suggestion
from skygreen.gpus import GPU_NAMES, canonical_gpu_name
from skygreen.task.declare import ReadWith, Record, meaning, read_record
from skygreen.task.readers import read_list, read_mapping, read_number, read_str

Cloud = Literal["aws", "gcp", "azure"]
CLOUDS: tuple[str, ...] = typing.get_args(Cloud)
_GPUS = ", ".join(GPU_NAMES)
_GPU_FIX = "use one of the allowed names, or a constraint such as {min_memory_gb: 24}"
_GPU_NAMES_SCHEMA: Mapping[str, Any] = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
}


def gpu_name(value: Any, path: str) -> str:
    """A GPU model as skygreen names it (`a100` -> `A100`), or a `SpecError` with the near miss."""
    name = read_str(value, path)
    base, _, count = name.partition(":")
    canonical = canonical_gpu_name(base.strip())
    if canonical is None:
        raise SpecError(
            path, f"unknown GPU {name!r}", allowed=", ".join(GPU_NAMES), hint=suggestion(base, GPU_NAMES) or _GPU_FIX
        )
    if count:
        raise SpecError(
            path,
            "give the GPU count in gpu_count, not in the name",
            value=name,
            hint=f"write {canonical!r} and gpu_count: {count}",
        )
    return canonical


def gpu_names(raw: Any, path: str) -> tuple[str, ...]:
    """A GPU name or a list of them, canonical, repeats dropped."""
    names = [gpu_name(v, f"{path}[{i}]") for i, v in enumerate(read_list(raw, path))]
    return tuple(dict.fromkeys(names))


class GpuChoice(Record, frozen=True, kw_only=True):
    """Which GPUs may run the job: named models, a memory floor, or both (all must hold)."""

    names: Annotated[
        tuple[str, ...] | None,
        meaning(
            "Candidate GPU models, in the mapping form of `gpus`.", allowed=_GPUS, default="every GPU skygreen knows"
        ),
        ReadWith(gpu_names, "list of GPU names", _GPU_NAMES_SCHEMA),
    ] = None
    min_memory_gb: Annotated[
        float | None, meaning("Keep only GPUs with at least this much memory each.", gt=0, unit="GB per GPU")
    ] = None


def parse_gpus(raw: Any, path: str) -> GpuChoice:
    """`gpus:` as a GPU name or a list of them, or as a mapping with `names` and/or `min_memory_gb`."""
    if isinstance(raw, GpuChoice):
        return raw
    if isinstance(raw, Mapping):
        return typing.cast(GpuChoice, read_record(GpuChoice, raw, path))
    return GpuChoice(names=gpu_names(raw, path))


def parse_speed(raw: Any, path: str) -> dict[str, float]:
    """`speed:` as GPU name -> speed relative to one A100, keyed by the canonical name; each speed
    above 0 and at most 1000."""
    raw = read_mapping(raw, path)
    return {
        gpu_name(name, f"{path}.{name}"): read_number(speed, f"{path}.{name}", positive=True, maximum=1000)
        for name, speed in raw.items()
    }


class Work(Record, frozen=True, kw_only=True):
    """The size of the job: `gpu_hours` of training on one `gpu`."""

    gpu_hours: Annotated[
        float,
        meaning(
            "Hours the whole job takes on one reference GPU; `plan` warns above 100,000.",
            gt=0,
            le=1e7,
            unit="hours on ONE `gpu`",
        ),
    ] = 1.0
    gpu: Annotated[
        str,
        meaning("The reference GPU that `gpu_hours` is measured on.", allowed=_GPUS),
        ReadWith(gpu_name, "GPU name"),
    ] = "A100"


# ---------------------------------------------------------------- work

_WORK_OLD_KEY = "on"
"""The reference GPU's key until 0.1: `on` is a boolean in YAML 1.1, which PyYAML and
SkyPilot's own loader speak, so any tool that loads and re-dumps the task file with PyYAML
turns `on:` into `true:`. Still read, with a notice; so is that `true` key, when it stands
alone (nothing else in `work:` can have produced it)."""


def parse_work(raw: Any, path: str) -> Work:
    """`work:` as `gpu_hours` (above 0, at most 1e7) on the reference `gpu`; either may be left out
    for `Work`'s default. The old keys `on:` and a lone `true:` are read as `gpu:`
    (`work_notices` says so), and an error in the GPU names the key as the file spells it."""
    if isinstance(raw, Work):
        return raw
    key = _gpu_key(raw, path) if isinstance(raw, Mapping) else "gpu"
    if key != "gpu":
        raw = {"gpu" if (k is True if key is True else k == key) else k: v for k, v in raw.items()}
    try:
        return typing.cast(Work, read_record(Work, raw, path))
    except SpecError as e:
        if e.field != f"{path}.gpu" or key == "gpu":
            raise
        where = f"{path}.{str(key).lower()}"
        raise SpecError(where, e.problem, value=e.value, allowed=e.allowed, hint=e.hint) from None


def _gpu_key(raw: Mapping[Any, Any], path: str) -> str | bool:
    """The key `work:` names its reference GPU by: `gpu`, the old `on`, or True (what a YAML 1.1
    tool makes of `on`, read only alone); two of them are an error."""
    if any(k is True for k in raw):
        if "gpu" in raw or _WORK_OLD_KEY in raw:
            raise SpecError(f"{path}.true", "a key `true` beside the GPU's key", value=raw[True],
                            hint="keep only `gpu: NAME` (`true:` is what YAML 1.1 tools make of the old `on:`)")  # fmt: skip
        return True
    if _WORK_OLD_KEY in raw and "gpu" in raw:
        raise SpecError(f"{path}.on", "both `on` and `gpu` name the reference GPU", value=raw["on"],
                        hint="keep only `gpu`")  # fmt: skip
    return _WORK_OLD_KEY if _WORK_OLD_KEY in raw else "gpu"


PLAUSIBLE_GPU_HOURS = 100_000.0
"""Above this `work.gpu_hours` (over 11 GPU-years on one GPU) the plan warns: a unit mixed up is
likelier than a job that size."""


def work_notices(raw: Any, work: Work) -> tuple[str, ...]:
    """Say when `work:` names its GPU with an old key, or a job size beyond plausibility."""
    if work.gpu_hours > PLAUSIBLE_GPU_HOURS:
        notice = (
            f"skygreen.work.gpu_hours: {work.gpu_hours:g} GPU-hours is {work.gpu_hours / 8766:,.0f} years "
            f"on one {work.gpu}, above the plausible {PLAUSIBLE_GPU_HOURS:,.0f}; check the number and its unit "
            "(hours of training on ONE gpu)"
        )
        return (notice,)
    if isinstance(raw, Mapping) and any(key is True for key in raw):
        notice = (
            f"skygreen.work: read `true: {work.gpu}` as `gpu: {work.gpu}` (a YAML 1.1 tool turned the old key `on:` "
            f"into `true:`); write gpu: {work.gpu}"
        )
        return (notice,)
    if isinstance(raw, Mapping) and _WORK_OLD_KEY in raw:
        return (f"skygreen.work.on is deprecated (YAML 1.1 tools read `on` as true): write gpu: {work.gpu}",)
    return ()
