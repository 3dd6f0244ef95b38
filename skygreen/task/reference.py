"""Every field of the task file as a user writes it: type, default, allowed values and meaning.

`skygreen.task.spec` reads the task file into the records of `skygreen.task.records`; this table says
what each key a user may write means. It is the one source of the task file reference
(docs/reference/task-file.md is generated from it when the site builds), and
tests/test_docs_reference.py holds it to the parser: every key the parser accepts must have a
row here, and every row must name a key the parser accepts. A field added to the parser without
a row, or a row without a description, fails that test.

A field declared on its record with `meaning(...)` (`skygreen.task.declare`) gets its row from
that declaration (`declared_rows`): type, allowed values, bounds, unit, meaning and its JSON
Schema; only the keys still read their own way (the GPUs, `work`, `checkpoint`, `power.cap`,
the model's size and method) keep a hand-written `TaskField` here. Defaults are read from the
records themselves wherever a key names a record's attribute (`skygreen.checkpoint.keep` is
`CheckpointSpec.keep`), so a changed default changes the page; `default=` text is only for keys
the parser turns into something else (`every`, `power.cap`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import msgspec

from skygreen.checkpoint.bucket_url import URL_FORMS
from skygreen.checkpoint.keep import MIN_KEEP
from skygreen.gpus import GPU_NAMES
from skygreen.ledger.budget import DEFAULT_ALERT_FRACTIONS
from skygreen.memory.method import ALL_LINEAR, DEFAULT_LORA_R, DEFAULT_LORA_TARGETS, LORA_TARGETS, METHODS, OPTIMIZERS
from skygreen.power.policy import DEFAULT_ETA
from skygreen.task.declare import Record, allowed_text, declared, field_schema, fields_of, type_text
from skygreen.task.readers import DURATION_UNITS_S
from skygreen.task.records import (
    CLOUDS,
    DEFAULT_QUIET_S,
    FSDP_FROM_PARAMS,
    HALF_PRECISIONS,
    Batch,
    BudgetAlertSpec,
    CheckpointSpec,
    EarlyStopConfig,
    GpuChoice,
    GreenSpec,
    ModelSpec,
    PowerSpec,
    PreemptionSpec,
    RecoverySpec,
    Work,
)

__all__ = ["RECORDS", "TASK_FIELDS", "TaskField", "default_text", "one_of"]

SKYPILOT = "skypilot"
"""`TaskField.owner` of a SkyPilot key that skygreen reads or rewrites."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TaskField:
    """One key of the task file, as the reference lists it."""

    path: str
    """Where the key sits, dotted from the top of the file: `skygreen.checkpoint.keep`, `run`."""
    type: str
    """What a user writes: `integer`, `number`, `string`, `boolean`, `list of GPU names`, ..."""
    doc: str
    """What the key does, in full sentences."""
    allowed: str = ""
    """Allowed values, ranges and units; empty when the type says it all."""
    default: str | None = None
    """The default as text; None reads it from the record the key lands in (`RECORDS`)."""
    schema: Mapping[str, Any] | None = None
    """The key's JSON Schema where its declaration gives it (`skygreen.task.declare`); None:
    built from `type` and `allowed` (`skygreen.task.schema.TYPES`)."""

    def __post_init__(self) -> None:
        if not self.path or self.path != self.path.strip() or " " in self.path:
            raise ValueError(f"TaskField.path must be a dotted key such as skygreen.keep, got {self.path!r}")
        if not self.type.strip():
            raise ValueError(f"TaskField {self.path}: give its type (what a user writes)")
        if not self.doc.strip():
            raise ValueError(f"TaskField {self.path}: give it a description (doc=)")

    @property
    def section(self) -> str:
        """The mapping the key sits in: `skygreen.checkpoint` for `skygreen.checkpoint.keep`, "" at the top."""
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        """The key as written in its mapping: `keep`."""
        return self.path.rpartition(".")[2]


RECORDS: Mapping[str, type] = {
    "skygreen": GreenSpec,
    "skygreen.gpus": GpuChoice,
    "skygreen.work": Work,
    "skygreen.budget_alerts": BudgetAlertSpec,
    "skygreen.preemption": PreemptionSpec,
    "skygreen.batch": Batch,
    "skygreen.checkpoint": CheckpointSpec,
    "skygreen.power": PowerSpec,
    "skygreen.early_stopping": EarlyStopConfig,
    "skygreen.recovery": RecoverySpec,
    "skygreen.model": ModelSpec,
}
"""The record each section of the task file is read into, where defaults are read from."""


def one_of(choices: tuple[str, ...]) -> str:
    """`a | b | c`, the way the reference lists allowed names."""
    return " | ".join(choices)


def _value_text(value: Any) -> str:
    """A default as a user would write it in YAML."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def default_text(field: TaskField) -> str:
    """The default a reader sees for `field`: its own text, else the record attribute's default.

    Raises:
        ValueError: `field` gives no default text and names no attribute of its section's record.
    """
    if field.default is not None:
        return field.default
    record = RECORDS.get(field.section)
    if record is not None and issubclass(record, Record):
        declared = {f.name: f for f in fields_of(record)}.get(field.key)
        if declared is not None:
            return "required" if declared.required else _value_text(declared.default)
    attributes = {f.name: f for f in dataclasses.fields(record)} if dataclasses.is_dataclass(record) else {}
    attribute = attributes.get(field.key)
    if attribute is None:
        raise ValueError(f"TaskField {field.path}: no record attribute to read its default from; give default= text")
    if attribute.default is not dataclasses.MISSING:
        return _value_text(attribute.default)
    if attribute.default_factory is not dataclasses.MISSING:
        return _value_text(attribute.default_factory())
    return "required"


def declared_rows(section: str, **default_text: str) -> tuple[TaskField, ...]:
    """The rows of the fields declared in the record of `section` (`RECORDS`, `skygreen.task.declare`),
    each with its JSON Schema (`TaskField.schema`); `default_text` gives a default as text where
    the value alone would mislead (`micro="auto"` for None)."""
    record, rows = RECORDS[section], []
    for field in declared(record):
        assert field.meta is not None  # declared() keeps only fields with a meaning
        is_section = f"{section}.{field.name}" in RECORDS
        off = is_section and field.optional
        rows.append(
            TaskField(
                path=f"{section}.{field.name}",
                type=type_text(field.hint) + (" or auto" if field.extra.get("auto") else " or false" if off else ""),
                doc=str(field.meta.description),
                allowed=allowed_text(field),
                default=default_text.get(field.name),
                schema=None if is_section else field_schema(record, field.name),  # a section: from its rows
            )
        )
    return tuple(rows)


_GPUS = ", ".join(GPU_NAMES)
_UNITS = ", ".join(DURATION_UNITS_S)

TASK_FIELDS: tuple[TaskField, ...] = (
    # ------------------------------------------------------------ SkyPilot's keys skygreen reads
    TaskField(
        path="name",
        type="string",
        default="not set (run ids start with `run`)",
        doc="The task's name. Run ids start with it (`tiny-20261201-063404-5c6d`), and the managed job is named after it.",
    ),
    TaskField(
        path="num_nodes",
        type="integer",
        allowed="1 or more",
        default="1",
        doc="Nodes per run, each with `skygreen.gpu_count` GPUs; more than one starts `run` with torchrun on every node. "
        "With `skygreen.model` and no `num_nodes`, the plan picks the node count that holds the model.",
    ),
    TaskField(
        path="run",
        type="string",
        default="required",
        doc="The command that trains. With more than one GPU or node it must be one line, `python SCRIPT ARGS`, "
        "which skygreen starts with torchrun (or a command that calls torchrun itself).",
    ),
    TaskField(
        path="workdir",
        type="string or mapping",
        default="the task file's folder",
        doc="The folder synced to the VM, relative to the task file; `smoke` and `up --local` run the command in it. "
        "A git workdir (`{url, ref}`) goes to SkyPilot as written.",
    ),
    TaskField(
        path="setup",
        type="string",
        default="not set",
        doc="Commands run once per VM before `run`, after skygreen installs its runtime there.",
    ),
    TaskField(
        path="envs",
        type="mapping",
        default="not set",
        doc="Environment variables for the training command. Each needs a value (an empty string counts); "
        "the `SKYGREEN_*` variables skygreen sets for every run are refused.",
    ),
    TaskField(
        path="secrets",
        type="mapping or list",
        default="not set",
        doc="Secrets for the VM, such as a webhook URL or a bucket key. Their values come from the environment "
        "of `skygreen up` (or the file) at launch and are never written to a rendered task, a log or the ledger.",
    ),
    TaskField(
        path="resources",
        type="mapping",
        default="not set",
        doc="SkyPilot's resources, except the keys skygreen sets from the plan (`accelerators`, `infra`, "
        "`use_spot`, `job_recovery`, ...): those are refused with the `skygreen:` field to set instead.",
    ),
    TaskField(
        path="file_mounts",
        type="mapping",
        default="not set",
        doc="SkyPilot's file mounts, kept as written; skygreen adds its own source folder when it installs from a checkout.",
    ),
    # ------------------------------------------------------------ skygreen: where it may run
    TaskField(
        path="skygreen",
        type="mapping",
        default="{}",
        doc="skygreen's own section. skygreen reads it, removes it and writes the final SkyPilot task; "
        "every other top-level key stays SkyPilot's.",
    ),
    TaskField(
        path="skygreen.gpus",
        type="GPU name, list of GPU names, or mapping",
        allowed=f"{_GPUS}; any case (`a100`)",
        default="every GPU skygreen knows",
        doc="The GPUs that may run the job. A list names candidates; the mapping form sets `names` and/or "
        "`min_memory_gb`, and a GPU must meet both. Give the count in `gpu_count`, not in the name.",
    ),
    TaskField(
        path="skygreen.gpus.names",
        type="list of GPU names",
        allowed=_GPUS,
        default="every GPU skygreen knows",
        doc="Candidate GPU models, in the mapping form of `gpus`.",
    ),
    *declared_rows("skygreen.gpus"),
    *declared_rows(
        "skygreen",
        regions="every region",
        preemption="the built-in spot model",
        budget_alerts="alerts at " + ", ".join(f"{f:g}" for f in DEFAULT_ALERT_FRACTIONS),
        batch="the script's own",
        early_stopping="off",
        recovery=_value_text(msgspec.structs.asdict(RecoverySpec())),
    ),
    TaskField(
        path="skygreen.clouds",
        type="cloud or list of clouds",
        allowed=one_of(CLOUDS),
        doc="The clouds whose offers the plan ranks.",
    ),
    TaskField(
        path="skygreen.speed",
        type="mapping of GPU name to number",
        allowed="above 0, at most 1000; relative to one A100 (1.0)",
        default="skygreen's speed table",
        doc="Relative training speeds that override the built-in table for this task, e.g. `{L4: 0.35}`.",
    ),
    *declared_rows(
        "skygreen.preemption", rate_per_hour="the built-in rates", restart_minutes="the built-in restart time"
    ),
    # ------------------------------------------------------------ skygreen: size, money, time
    TaskField(
        path="skygreen.work",
        type="mapping",
        default="1 GPU-hour on one A100 (plan says so)",
        doc="The size of the job: `gpu_hours` of training on one `gpu`. Every estimate (hours, cost, energy) "
        "scales from it. The old key `on:` (and the `true:` a YAML 1.1 tool makes of it) is still read as `gpu:`, with a note.",
    ),
    *declared_rows("skygreen.work"),
    TaskField(
        path="skygreen.work.gpu",
        type="GPU name",
        allowed=_GPUS,
        doc="The reference GPU that `gpu_hours` is measured on.",
    ),
    *declared_rows("skygreen.budget_alerts", at="[" + ", ".join(f"{f:g}" for f in DEFAULT_ALERT_FRACTIONS) + "]"),
    TaskField(
        path="skygreen.deadline",
        type="duration or number of hours",
        allowed="36h, 90m, 45min, 3600s, or hours (1.5); above 0",
        doc="Finish within this long after launch. The plan prefers spot while there is slack and falls back to "
        "on-demand when the deadline needs it; `skygreen up --deadline` and `watch` hold a run to it.",
    ),
    *declared_rows("skygreen.recovery"),
    # ------------------------------------------------------------ skygreen: the training loop
    *declared_rows("skygreen.batch", effective="the script's `effective_batch=`", micro="auto"),
    *declared_rows("skygreen.early_stopping"),
    TaskField(
        path="skygreen.model",
        type="mapping",
        default="not set (the plan ranks every GPU)",
        doc="How big the model is, so the plan keeps only the GPUs, GPU counts and node counts that hold it.",
    ),
    TaskField(
        path="skygreen.model.params",
        type="number or string",
        allowed="7e9, 350000000, or with a suffix: 7B, 350M, 1.5B (K, M, B, T)",
        doc="All parameters of the model. Give this, `config` or `hf`: with a count alone the plan counts "
        "model states and `activation_gb`, no logits.",
    ),
    TaskField(
        path="skygreen.model.config",
        type="string",
        allowed="a path to a Hugging Face config.json, relative to the task file",
        doc="The model's shape (hidden size, layers, heads, key-value heads, intermediate size, vocabulary, tied "
        "embeddings): the plan counts its parameters, activations and logits from it.",
    ),
    TaskField(
        path="skygreen.model.hf",
        type="string",
        allowed="a Hugging Face repo id, e.g. meta-llama/Llama-2-7b-hf",
        doc="Fetch only the repo's config.json through huggingface_hub (cached) and read the shape from it. "
        "Offline or gated: download config.json yourself and give `config`.",
    ),
    TaskField(
        path="skygreen.model.method",
        type="string",
        allowed=one_of(METHODS),
        default="full",
        doc="`full` trains every weight; `lora` freezes the base in 16-bit and trains adapters; `qlora` also "
        "stores the base's linears in 4-bit NF4 (about 0.52 bytes per parameter with its constants).",
    ),
    TaskField(
        path="skygreen.model.lora",
        type="mapping",
        default=f"{{r: {DEFAULT_LORA_R}, targets: [{', '.join(DEFAULT_LORA_TARGETS)}]}} (PEFT's Llama default)",
        doc="The adapters of `lora` and `qlora`.",
    ),
    TaskField(
        path="skygreen.model.lora.r",
        type="integer",
        allowed="1 to 4096",
        default=str(DEFAULT_LORA_R),
        doc="The adapters' rank: r x (d_in + d_out) trainable parameters per adapted matrix.",
    ),
    TaskField(
        path="skygreen.model.lora.targets",
        type="list or string",
        allowed=one_of((*LORA_TARGETS, ALL_LINEAR)),
        default=", ".join(DEFAULT_LORA_TARGETS),
        doc="The linears that get adapters, as PEFT names them; `all-linear` adapts every one.",
    ),
    TaskField(
        path="skygreen.model.optimizer",
        type="string",
        allowed=one_of(OPTIMIZERS),
        default="adamw",
        doc="The optimizer's state per trainable parameter: adamw 8 bytes (fp32 moments), adamw8bit 2, sgd "
        "(with momentum) 4, adafactor about 0; mixed precision adds a 4-byte fp32 master copy.",
    ),
    *declared_rows(
        "skygreen.model",
        activation_checkpointing="true (as the QLoRA, torchtune and Unsloth recipes run)",
        activation_gb="from the shape with `config` or `hf`, else 0",
        sharding=f"fsdp for a full fine-tune from {FSDP_FROM_PARAMS / 1e9:g}B parameters, ddp below and for lora and qlora",
    ),
    # ------------------------------------------------------------ skygreen: checkpoints
    TaskField(
        path="skygreen.checkpoint",
        type="mapping",
        default=f"every: auto, keep: {CheckpointSpec().keep}, in the local default bucket",
        doc="Where checkpoints go, how often, and how many are kept. A checkpoint counts once its manifest, "
        "written last after every file is verified, is in the bucket.",
    ),
    TaskField(
        path="skygreen.checkpoint.bucket",
        type="string",
        allowed=URL_FORMS,
        default="the local default bucket",
        doc="Where the run's checkpoints, ledger and prepared data live. Use a cloud bucket for a cloud run.",
    ),
    TaskField(
        path="skygreen.checkpoint.buckets",
        type="mapping",
        allowed="cloud (aws, gcp, azure) or region -> s3://, gs:// or az:// bucket",
        default="none: one bucket (`bucket`)",
        doc="One bucket per cloud or region, e.g. `{aws: s3://team-ckpt, gcp: gs://team-ckpt}`: a run commits to "
        "the one nearest its VM (a region key wins over its cloud's key), restores the newest commit of them all "
        "and copies it once into the near one. The first listed holds the writer lease. Not with `bucket` or `region`.",
    ),
    TaskField(
        path="skygreen.checkpoint.region",
        type="string",
        allowed="a region of the bucket's cloud, e.g. us-east-1, us-central1, eastus",
        default="read from the bucket when credentials allow, else the cloud's default region",
        doc="Where the cloud bucket is, for pricing the bytes each save and restore moves. A region that "
        "contradicts the bucket (another cloud's, or not the one the bucket reports) is an error.",
    ),
    TaskField(
        path="skygreen.checkpoint.every",
        type="auto, integer or duration",
        allowed=f"auto | a number of steps | a duration ({_UNITS}), e.g. 500, 90s, 5m",
        default="auto",
        doc="How often to checkpoint. `auto` uses Daly's optimum from the measured save cost and the spot "
        "preemption rate; a preemption notice always commits one more.",
    ),
    TaskField(
        path="skygreen.checkpoint.keep",
        type="integer",
        allowed=f"{MIN_KEEP} to 1000",
        doc="After each commit the bucket keeps the last `keep` checkpoints, the best by metric and every pinned one; "
        f"the rest are deleted. At least {MIN_KEEP}: the newest may be the broken one.",
    ),
    TaskField(
        path="skygreen.checkpoint.half_precision",
        type="string or false",
        allowed=one_of(HALF_PRECISIONS),
        default="false (weights stored as trained)",
        doc="Store weights as fp16 or bf16: smaller checkpoints, not bit-exact on resume.",
    ),
    TaskField(
        path="skygreen.checkpoint.dir",
        type="string",
        allowed="a path inside the workdir (no `..`)",
        doc="Folder mode: the folder the script saves its own checkpoint folders into; skygreen commits each "
        "complete one to the bucket and restores the latest before the script starts.",
    ),
    TaskField(
        path="skygreen.checkpoint.marker",
        type="string",
        allowed="a file name, e.g. trainer_state.json or .metadata",
        doc="Folder mode: a checkpoint folder is complete once it holds this file. Only with `dir`; not with `quiet_s`.",
    ),
    TaskField(
        path="skygreen.checkpoint.quiet_s",
        type="number",
        allowed="above 0, seconds",
        default=f"{DEFAULT_QUIET_S:g} when there is no marker",
        doc="Folder mode without a marker: a checkpoint folder is complete once no file in it changed for this long. Only with `dir`.",
    ),
    # ------------------------------------------------------------ skygreen: power
    TaskField(
        path="skygreen.power",
        type="mapping",
        default=f"{{cap: {PowerSpec().mode}}}",
        doc="The GPU power cap the runtime sets through NVML while training, and puts back afterwards.",
    ),
    TaskField(
        path="skygreen.power.cap",
        type="auto, off, watts or fraction",
        allowed="auto | off | 50 to 1500 (watts) | 0.3 to 1.0 (fraction of the default limit)",
        default="auto",
        doc="`auto` measures steps at a few caps and keeps the one that best trades time for energy; "
        "`off` leaves the limit alone.",
    ),
    *declared_rows("skygreen.power", eta=f"{DEFAULT_ETA:g}"),
)
"""Every key of the task file, in the order the reference lists them."""
