"""The task file's records: the typed, frozen values `skygreen.task.spec` reads a task into.

Kept apart from the reading (`skygreen.task.spec`) so the two stay under one screenful each; the
sections' own records are in `skygreen.task.sections`, `model_fields` and `gpu_fields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from skygreen.gpus import GPU_NAMES
from skygreen.task.declare import FieldProblem, ReadWith, Record, meaning
from skygreen.task.gpu_fields import CLOUDS, Cloud, GpuChoice, Work, parse_gpus, parse_speed, parse_work
from skygreen.task.model_fields import ModelSpec, parse_model
from skygreen.task.readers import read_duration_h
from skygreen.task.sections import Batch, BudgetAlertSpec, CheckpointSpec, EarlyStopConfig, PowerSpec, RecoverySpec

OBJECTIVES: tuple[str, ...] = ("cost", "time", "energy", "carbon")
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
TRAINERS: tuple[str, ...] = ("runtime", "transformers", "lightning", "folder")
"""What owns the training loop (`GreenSpec.trainer`)."""

# Top-level keys of a SkyPilot 0.14.1 task (sky/utils/schemas.py::get_task_schema), so that a
# misspelt key (`skygren:`, `rn:`) is caught here with a suggestion, before SkyPilot sees it.
SKYPILOT_TASK_KEYS: tuple[str, ...] = (
    "name", "workdir", "event_callback", "num_nodes", "resources", "file_mounts", "service",
    "pool", "setup", "run", "envs", "secrets", "managed_secrets", "inputs", "outputs",
    "file_mounts_mapping", "volumes", "volume_mounts", "api_server_access", "config", "_metadata",
)  # fmt: skip

SECTION = "skygreen"


class PreemptionSpec(Record, frozen=True, kw_only=True):
    """Overrides of the planner's spot model; None keeps the built-in assumption."""

    rate_per_hour: Annotated[
        Mapping[str, Annotated[float, msgspec.Meta(ge=0, le=60)]],
        meaning(
            "Expected preemptions per hour of a spot VM, per cloud.",
            keys=CLOUDS,
            unit="preemptions per hour",
            default="the built-in rates",
        ),
    ] = msgspec.field(default_factory=dict)
    restart_minutes: Annotated[
        float | None,
        meaning(
            "Minutes lost per preemption: a new VM, setup and the restore.",
            ge=0,
            le=1440,
            unit="minutes",
            default="the built-in restart time",
        ),
    ] = None


class GreenSpec(Record, frozen=True, kw_only=True):
    """The `skygreen:` section, validated, with defaults filled in."""

    gpus: Annotated[
        GpuChoice,
        meaning(
            "The GPUs that may run the job. A list names candidates; the mapping form sets `names` and/or "
            "`min_memory_gb`, and a GPU must meet both. Give the count in `gpu_count`, not in the name.",
            allowed=f"{', '.join(GPU_NAMES)}; any case (`a100`)",
            default="every GPU skygreen knows",
        ),
        ReadWith(
            parse_gpus,
            "GPU name, list of GPU names, or mapping",
            {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "object"}]},
        ),
    ] = msgspec.field(default_factory=GpuChoice)
    gpu_count: Annotated[
        int,
        meaning("GPUs per node. Without it, a task with `model` may get any count that holds the model.", ge=1, le=64),
    ] = 1
    gpu_count_given: bool = False
    """The task names `gpu_count`; without it a task with a `model` may get any count that holds it."""
    clouds: Annotated[tuple[Cloud, ...], meaning("The clouds whose offers the plan ranks.")] = CLOUDS  # type: ignore[assignment]  # CLOUDS holds Cloud's names
    regions: Annotated[
        tuple[str, ...] | None,
        meaning(
            "Keep only offers in these regions (cloud region names such as `us-east-1`). With two or "
            "more and a deadline, the watcher moves the run between them (docs/multi-region.md).",
            default="every region",
        ),
    ] = None
    spot: Annotated[
        bool,
        meaning(
            "true: rank spot offers (checkpoints and exact resume carry a run through preemptions); false: on-demand only."
        ),
    ] = True
    on_demand_fallback: Annotated[
        bool, meaning("Also rank on-demand offers, as fallbacks behind the spot ones. Only with `spot: true`.")
    ] = False
    objective: Annotated[
        str, meaning("What the plan minimises: the run's cost, its time, its energy, or its CO2e.", choices=OBJECTIVES)
    ] = "cost"
    work: Annotated[
        Work,
        meaning(
            "The size of the job: `gpu_hours` of training on one `gpu`. Every estimate (hours, cost, energy) scales "
            "from it. The old key `on:` (and the `true:` a YAML 1.1 tool makes of it) is still read as `gpu:`, with "
            "a note.",
            default="1 GPU-hour on one A100 (plan says so)",
        ),
        ReadWith(parse_work, "mapping", {"type": "object"}),
    ] = msgspec.field(default_factory=Work)
    max_price_per_hour: Annotated[
        float | None, meaning("Drop offers that cost more per node-hour.", gt=0, unit="USD per node-hour")
    ] = None
    budget_usd: Annotated[
        float | None,
        meaning(
            "The run's budget. The plan drops offers whose estimated run cost exceeds it, and the runtime commits a "
            "checkpoint and stops the run when its spend reaches it (`skygreen resume --budget-usd` raises it).",
            gt=0,
            unit="USD",
        ),
    ] = None
    budget_alerts: Annotated[
        BudgetAlertSpec, meaning("When the runtime warns about spend, in the log and optionally to a webhook.")
    ] = msgspec.field(default_factory=BudgetAlertSpec)
    speed: Annotated[
        Mapping[str, float],
        meaning(
            "Relative training speeds that override the built-in table for this task, e.g. `{L4: 0.35}`.",
            allowed="above 0, at most 1000; relative to one A100 (1.0)",
            default="skygreen's speed table",
        ),
        ReadWith(
            parse_speed, "mapping of GPU name to number", {"type": "object", "additionalProperties": {"type": "number"}}
        ),
    ] = msgspec.field(default_factory=dict)
    preemption: Annotated[
        PreemptionSpec,
        meaning(
            "Overrides of the planner's spot model, for a task whose preemptions you have measured.",
            default="the built-in spot model",
        ),
    ] = msgspec.field(default_factory=PreemptionSpec)
    max_candidates: Annotated[
        int, meaning("How many of the best offers go to SkyPilot, in order, as fallbacks for one another.", ge=1, le=64)
    ] = 8
    precision: Annotated[
        str,
        meaning(
            "Mixed precision: `auto` is bf16 where the GPU has it and fp16 elsewhere; `bf16` refuses GPUs without it.",
            choices=PRECISIONS,
        ),
    ] = "auto"
    batch: Annotated[
        Batch,
        meaning(
            "The effective batch and the micro-batch each rank runs at once; the runtime accumulates gradients "
            "between them.",
            default="the script's own",
        ),
    ] = msgspec.field(default_factory=Batch)
    checkpoint: Annotated[
        CheckpointSpec,
        meaning(
            "Where checkpoints go, how often, and how many are kept. A checkpoint counts once its manifest, "
            "written last after every file is verified, is in the bucket.",
            default="every: auto, keep: 3, in the local default bucket",
        ),
    ] = msgspec.field(default_factory=CheckpointSpec)
    power: Annotated[
        PowerSpec,
        meaning(
            "The GPU power cap the runtime sets through NVML while training, and puts back afterwards.",
            default="{cap: auto}",
        ),
    ] = msgspec.field(default_factory=PowerSpec)
    early_stopping: Annotated[
        EarlyStopConfig | None,
        meaning(
            "Stop the run when the metric the script reports (`run.report(val_loss=...)`) stops improving; the run "
            "ends as done.",
            default="off",
            off=True,
        ),
    ] = None
    recovery: Annotated[
        RecoverySpec,
        meaning(
            "SkyPilot's job recovery for the managed job (`recovery: FAILOVER` sets the strategy alone). skygreen adds "
            "the exit code its runtime leaves after a preemption checkpoint to the codes SkyPilot recovers on."
        ),
    ] = msgspec.field(default_factory=RecoverySpec)
    deadline: Annotated[
        float | None,
        meaning(
            "Finish within this long after launch. The plan prefers spot while there is slack and falls back to "
            "on-demand when the deadline needs it; `skygreen up --deadline` and `watch` hold a run to it.",
            allowed="36h, 90m, 45min, 3600s, or hours (1.5); above 0",
        ),
        ReadWith(read_duration_h, "duration or number of hours", {"type": ["string", "number"]}),
    ] = None
    model: Annotated[
        ModelSpec | None,
        meaning(
            "How big the model is, so the plan keeps only the GPUs, GPU counts and node counts that hold it.",
            default="not set (the plan ranks every GPU)",
        ),
        ReadWith(parse_model, "mapping", {"type": "object"}),
    ] = None
    trainer: Annotated[
        str,
        meaning(
            "What owns the training loop: `runtime` (the script trains through `sg.Run`), `transformers` or "
            "`lightning` (the script's Trainer carries skygreen's callback), `folder` (any script that saves checkpoint "
            "folders into `checkpoint.dir`; skygreen wraps the command). `checkpoint.dir` alone implies `folder`; "
            "without the key, the script's imports decide (`skygreen.integrations.transformers`, `.lightning`, `Run`).",
            choices=TRAINERS,
        ),
    ] = "runtime"
    """`folder` when `checkpoint.dir` is set and the task names no trainer."""
    trainer_given: bool = False
    """The task names `trainer`; without it `task.checks.load_task` infers it from the script's imports."""

    def rules(self) -> None:
        """`checkpoint.dir` is the folder mode, which a loop skygreen drives itself cannot take,
        and which sets `trainer: folder`; on-demand fallbacks stand only behind spot offers; the
        folder mode keeps the script's own checkpoint cadence."""
        folder = self.checkpoint.dir
        if folder is not None and self.trainer_given and self.trainer != "folder":
            raise FieldProblem("checkpoint.dir", f"is the folder mode, and this task says `trainer: {self.trainer}`, "
                               "which checkpoints through skygreen itself", value=folder,
                               hint="remove checkpoint.dir (sg.Run and the trainer callbacks commit their own "
                               "checkpoints), or set `trainer: folder` for a script that saves checkpoint folders on "
                               "its own")  # fmt: skip
        if self.trainer == "folder" and folder is None:
            raise FieldProblem("checkpoint.dir", "is required with `trainer: folder`: the folder the script saves "
                               "its checkpoint folders into",
                               hint="add e.g. `checkpoint: {dir: out, marker: trainer_state.json}`")  # fmt: skip
        if folder is not None:
            msgspec.structs.force_setattr(self, "trainer", "folder")
        if self.on_demand_fallback and not self.spot:
            raise FieldProblem("on_demand_fallback", "only means something with spot: true", value=True,
                               hint="remove on_demand_fallback, or set spot: true")  # fmt: skip
        self._cadence_rule()

    def _cadence_rule(self) -> None:
        """The folder mode commits the folders the script saves, when it saves them: a step or time
        `checkpoint.every` would be priced by `plan` and never kept."""
        checkpoint = self.checkpoint
        if self.trainer != "folder" or checkpoint.every_auto:
            return
        given = f"{checkpoint.every_steps} steps" if checkpoint.every_steps is not None else f"{checkpoint.every_s:g} s"
        raise FieldProblem("checkpoint.every", "cannot be kept in the folder mode: skygreen commits the folders the "
                           f"script saves, on the script's own cadence, and cannot make it save every {given}",
                           value=given, hint="remove checkpoint.every and set the script's own save interval (e.g. "
                           "save_steps), or train through sg.Run or a trainer callback")  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskSpec:
    """A task file as read: its `skygreen:` section parsed, everything else kept for SkyPilot."""

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
