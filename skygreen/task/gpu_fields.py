"""The task file's hardware fields: which GPUs and clouds may run the job, how big the job is
(`work:`), and relative speeds. Read by `skygreen.task.spec` into the records of `skygreen.task.records`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skygreen.errors import SpecError, suggestion
from skygreen.gpus import GPU_NAMES, canonical_gpu_name
from skygreen.task.declare import read_fields
from skygreen.task.readers import check_keys, read_choice, read_list, read_mapping, read_number, read_str
from skygreen.task.records import CLOUDS, GpuChoice, Work


def gpu_name(value: Any, path: str) -> str:
    """A GPU model as skygreen names it (`a100` -> `A100`), or a `SpecError` with the near miss."""
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


def parse_gpus(raw: Any, path: str) -> GpuChoice:
    """`gpus:` as a GPU name or a list of them, or as a mapping with `names` and/or `min_memory_gb`.
    Names are made canonical (`a100` -> `A100`) and repeats dropped; a `SpecError` on an unknown
    name or key."""
    if isinstance(raw, Mapping):
        raw = read_mapping(raw, path)
        check_keys(raw, ("names", "min_memory_gb"), path)
        names = None
        if raw.get("names") is not None:
            names = _gpu_names(raw["names"], f"{path}.names")
        return GpuChoice(names=names, **read_fields(GpuChoice, raw, path))
    return GpuChoice(names=_gpu_names(raw, path))


def _gpu_names(raw: Any, path: str) -> tuple[str, ...]:
    names = [gpu_name(v, f"{path}[{i}]") for i, v in enumerate(read_list(raw, path))]
    return tuple(dict.fromkeys(names))


def parse_clouds(raw: Any, path: str) -> tuple[str, ...]:
    """`clouds:` as one cloud or a list of them, each one of `CLOUDS` in any case, repeats dropped."""
    clouds = [read_choice(v, f"{path}[{i}]", CLOUDS) for i, v in enumerate(read_list(raw, path))]
    return tuple(dict.fromkeys(clouds))


def parse_speed(raw: Any, path: str) -> dict[str, float]:
    """`speed:` as GPU name -> speed relative to one A100, keyed by the canonical name; each speed
    above 0 and at most 1000."""
    raw = read_mapping(raw, path)
    return {
        gpu_name(name, f"{path}.{name}"): read_number(speed, f"{path}.{name}", positive=True, maximum=1000)
        for name, speed in raw.items()
    }


# ---------------------------------------------------------------- work

WORK_KEYS: tuple[str, ...] = ("gpu_hours", "gpu")
_WORK_OLD_KEY = "on"
"""The reference GPU's key until 0.1: `on` is a boolean in YAML 1.1, which PyYAML and
SkyPilot's own loader speak, so any tool that loads and re-dumps the task file with PyYAML
turns `on:` into `true:`. Still read, with a notice; so is that `true` key, when it stands
alone (nothing else in `work:` can have produced it)."""


def parse_work(raw: Any, path: str) -> Work:
    """`work:` as `gpu_hours` (above 0, at most 1e7) on the reference `gpu`; either may be left out
    for `Work`'s default. The old keys `on:` and a lone `true:` are read as `gpu:`
    (`work_notices` says so), and an error in the GPU names the key as the file spells it."""
    written_as = (
        _WORK_OLD_KEY
        if isinstance(raw, Mapping) and _WORK_OLD_KEY in raw
        else "true"
        if isinstance(raw, Mapping) and any(k is True for k in raw)
        else "gpu"
    )
    raw = _work_with_gpu_key(raw, path)
    check_keys(raw, WORK_KEYS, path)
    values = read_fields(Work, raw, path)  # gpu_hours; the GPU below, named as the file spells it
    if raw.get("gpu") is not None:  # errors name the key as the file spells it
        values["gpu"] = gpu_name(raw["gpu"], f"{path}.{written_as}")
    return Work(**values)


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
