"""The task file's records: the typed, frozen values `skygreen.task.spec` reads a task into.

Kept apart from the reading (`skygreen.task.spec`) so the two stay under one screenful each; import
them from `skygreen.task.spec`, the task file's one public face.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from skygreen.memory.method import Method
from skygreen.memory.shape import ModelShape
from skygreen.task.declare import check_declared, meaning
from skygreen.task.sections import Batch, BudgetAlertSpec, EarlyStopConfig, RecoverySpec

CLOUDS: tuple[str, ...] = ("aws", "gcp", "azure")
OBJECTIVES: tuple[str, ...] = ("cost", "time", "energy", "carbon")
PRECISIONS: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
HALF_PRECISIONS: tuple[str, ...] = ("fp16", "bf16")
SHARDINGS: tuple[str, ...] = ("fsdp", "ddp")
FSDP_FROM_PARAMS = 1e9
"""`model.sharding` left out: FSDP from a billion parameters (16 GB of weights, gradients and
AdamW states, more than most single GPUs hold beside activations), DDP below."""
DEFAULT_MAX_NODES = 4
DEFAULT_SEQ_LEN = 2048
"""`model.seq_len` left out: the context most 7B fine-tuning recipes train at (Llama-2's length)."""
TRAINERS: tuple[str, ...] = ("runtime", "transformers", "lightning", "folder")
"""What owns the training loop (`GreenSpec.trainer`)."""
DEFAULT_QUIET_S = 30.0
"""Folder mode without a marker file: a checkpoint folder counts as complete once no file in it
changed for this long."""

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
    min_memory_gb: (
        Annotated[float, meaning("Keep only GPUs with at least this much memory each.", gt=0, unit="GB per GPU")] | None
    ) = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Work:
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
    gpu: str = "A100"


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """`model:` of the task: the model and how it is trained, so the plan keeps only GPUs that
    can hold it (`skygreen.memory` does the arithmetic)."""

    params: float
    """All parameters (7e9 for a 7B model); from the shape when the task gives `config` or `hf`."""
    activation_gb: (
        Annotated[
            float,
            meaning(
                "Activation memory per GPU at the micro-batch, measured or guessed: replaces the estimate.",
                ge=0,
                le=10_000,
                unit="GB (1e9 bytes) per GPU",
            ),
        ]
        | None
    ) = None
    """None: from the shape when known, else 0."""
    sharding: Annotated[
        str,
        meaning(
            "`fsdp` shards weights, gradients and optimizer states over every GPU of the run (ZeRO stage 3); "
            "with `ddp` every GPU holds them whole.",
            choices=SHARDINGS,
        ),
    ] = "ddp"
    max_nodes: Annotated[
        int, meaning("The most nodes the plan may give a run whose task does not fix `num_nodes`.", ge=1, le=64)
    ] = DEFAULT_MAX_NODES
    shape: ModelShape | None = None
    """Read from `config` or fetched through `hf`; None for a bare `params:`."""
    config: str | None = None
    """The `config.json` path as the task gives it."""
    hf: str | None = None
    """The Hugging Face repo id as the task gives it."""
    method: Method = field(default_factory=Method)
    seq_len: Annotated[
        int,
        meaning(
            "Tokens per sample: the longest sample sets the peak, so give the length you pad or pack to.",
            ge=1,
            le=10_000_000,
            unit="tokens",
        ),
    ] = DEFAULT_SEQ_LEN
    micro_batch: Annotated[
        int, meaning("Samples per forward pass per GPU, for the activation and logit memory.", ge=1, le=65_536)
    ] = 1
    activation_checkpointing: Annotated[
        bool,
        meaning(
            "Whether the trainer recomputes activations in the backward pass (HF `gradient_checkpointing`): "
            "only each layer's input is kept. Set false if your script does not turn it on."
        ),
    ] = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.params) and self.params >= 1):
            raise ValueError(f"ModelSpec.params must be a finite number >= 1, got {self.params}")
        check_declared(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    """`checkpoint:` of the task: where checkpoints go, how often, and how many are kept."""

    bucket: str | None = None
    """s3://, gs://, file:// or a local path; None means the local default bucket."""
    region: str | None = None
    """The cloud bucket's region as the task states it; None: read from the bucket, else assumed."""
    every_steps: int | None = None
    every_s: float | None = None
    """With neither set, the interval is `auto` (Daly's optimum from the measured save cost)."""
    keep: int = 3
    half_precision: str | None = None
    """Store weights as fp16 or bf16 (smaller, not bit-exact); None stores them as trained."""
    dir: str | None = None
    """Folder mode: the folder the script saves its checkpoint folders into (relative to the workdir)."""
    marker: str | None = None
    """Folder mode: a checkpoint folder is complete once it holds this file (`trainer_state.json`,
    `.metadata`); None: once nothing in it changed for `quiet_s`."""
    quiet_s: float | None = None
    """Folder mode without a marker: the quiet period; None means `DEFAULT_QUIET_S`."""

    @property
    def every_auto(self) -> bool:
        """True when `every:` was `auto` or left out: neither a step nor a time interval is set."""
        return self.every_steps is None and self.every_s is None


@dataclass(frozen=True, kw_only=True, slots=True)
class PowerSpec:
    """`power:` of the task: the GPU power cap (`mode`: auto, off, watts in `cap_w`, or a fraction of
    the default limit in `cap_fraction`) and whether failing to apply it is an error."""

    mode: str = "auto"
    """auto | off | watts | fraction."""
    cap_w: float | None = None
    cap_fraction: float | None = None
    required: Annotated[
        bool,
        meaning(
            "Fail before training when the cap cannot be applied (no permission, no GPU); otherwise the run "
            "trains uncapped and says so."
        ),
    ] = False
    eta: (
        Annotated[
            float,
            meaning(
                "The `auto` chooser's weight on energy against time.",
                ge=0,
                le=1,
                allowed="0 is time only, 1 energy only",
            ),
        ]
        | None
    ) = None
    """None: skygreen.power's default."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PreemptionSpec:
    """Overrides of the planner's spot model; None keeps the built-in assumption."""

    rate_per_hour: Annotated[
        Mapping[str, Annotated[float, msgspec.Meta(ge=0, le=60)]],
        meaning("Expected preemptions per hour of a spot VM, per cloud.", keys=CLOUDS, unit="preemptions per hour"),
    ] = field(default_factory=dict)
    restart_minutes: (
        Annotated[
            float,
            meaning("Minutes lost per preemption: a new VM, setup and the restore.", ge=0, le=1440, unit="minutes"),
        ]
        | None
    ) = None


@dataclass(frozen=True, kw_only=True, slots=True)
class GreenSpec:
    """The `skygreen:` section, validated, with defaults filled in."""

    gpus: GpuChoice = GpuChoice()
    gpu_count: Annotated[
        int,
        meaning("GPUs per node. Without it, a task with `model` may get any count that holds the model.", ge=1, le=64),
    ] = 1
    gpu_count_given: bool = False
    """The task names `gpu_count`; without it a task with a `model` may get any count that holds it."""
    clouds: tuple[str, ...] = CLOUDS
    regions: (
        Annotated[
            tuple[str, ...],
            meaning(
                "Keep only offers in these regions (cloud region names such as `us-east-1`). With two or "
                "more and a deadline, the watcher moves the run between them (docs/multi-region.md)."
            ),
        ]
        | None
    ) = None
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
        str,
        meaning("What the plan minimises: the run's cost, its time, its energy, or its CO2e.", choices=OBJECTIVES),
    ] = "cost"
    work: Work = Work()
    max_price_per_hour: (
        Annotated[float, meaning("Drop offers that cost more per node-hour.", gt=0, unit="USD per node-hour")] | None
    ) = None
    budget_usd: (
        Annotated[
            float,
            meaning(
                "The run's budget. The plan drops offers whose estimated run cost exceeds it, and the runtime commits a "
                "checkpoint and stops the run when its spend reaches it (`skygreen resume --budget-usd` raises it).",
                gt=0,
                unit="USD",
            ),
        ]
        | None
    ) = None
    budget_alerts: Annotated[
        BudgetAlertSpec, meaning("When the runtime warns about spend, in the log and optionally to a webhook.")
    ] = field(default_factory=BudgetAlertSpec)
    speed: Mapping[str, float] = field(default_factory=dict)
    """Relative training speed overrides, GPU name -> speed relative to one A100."""
    preemption: Annotated[
        PreemptionSpec,
        meaning("Overrides of the planner's spot model, for a task whose preemptions you have measured."),
    ] = PreemptionSpec()
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
            "between them."
        ),
    ] = field(default_factory=Batch)
    checkpoint: CheckpointSpec = CheckpointSpec()
    power: PowerSpec = PowerSpec()
    early_stopping: (
        Annotated[
            EarlyStopConfig,
            meaning(
                "Stop the run when the metric the script reports (`run.report(val_loss=...)`) stops improving; the run "
                "ends as done."
            ),
        ]
        | None
    ) = None
    """None (or `false` in the file): no early stopping."""
    recovery: Annotated[
        RecoverySpec,
        meaning(
            "SkyPilot's job recovery for the managed job (`recovery: FAILOVER` sets the strategy alone). skygreen adds "
            "the exit code its runtime leaves after a preemption checkpoint to the codes SkyPilot recovers on.",
        ),
    ] = field(default_factory=RecoverySpec)
    deadline: float | None = None
    """Hours from launch by which the run must be done (`deadline: 36h`); None: no deadline."""
    model: ModelSpec | None = None
    """None: the plan does not know the model's size and ranks every GPU."""
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
