"""The task file's sections declared as msgspec records (`skygreen.task.declare.Record`): each
field's type, default, bounds and meaning in one annotation, the rules across its fields in
`rules()`. `skygreen.task.records` holds the rest of the records and the `skygreen:` section;
import them all from `skygreen.task.spec`.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from skygreen.checkpoint.bucket_url import URL_FORMS, canonical_url
from skygreen.checkpoint.keep import MIN_KEEP
from skygreen.errors import SpecError
from skygreen.power.policy import DEFAULT_ETA, CapRequest
from skygreen.task.declare import FieldProblem, ReadWith, Record, meaning
from skygreen.task.readers import DURATION_UNITS_S, parse_duration_s, read_int, read_number, read_str


class Batch(Record, frozen=True, kw_only=True):
    """`batch:` of the task: the effective batch and the micro-batch each rank runs at once; the
    runtime accumulates gradients between them."""

    SECTION: ClassVar[str] = "skygreen.batch"
    effective: Annotated[
        int | None,
        meaning(
            "Samples per optimizer step over all ranks. It stays the same on any GPU and any number of them, so a "
            "resumed run trains the same steps.",
            ge=1,
            allowed="a multiple of gpu_count x num_nodes",
            default="the script's `effective_batch=`",
        ),
    ] = None
    micro: Annotated[
        int | None,
        meaning(
            "Samples per forward pass on each rank; `auto` probes the largest that fits the GPU.",
            ge=1,
            allowed="dividing the per-rank batch",
            auto=True,
            default="auto",
        ),
    ] = None

    def rules(self) -> None:
        """The micro-batch is part of the effective batch, so it cannot be larger."""
        if self.effective is not None and self.micro is not None and self.micro > self.effective:
            raise FieldProblem(
                "micro",
                f"is larger than the effective batch {self.effective}",
                value=self.micro,
                hint="set micro to at most the effective batch, or to auto",
            )


class EarlyStopConfig(Record, frozen=True, kw_only=True):
    """`early_stopping:` of the task file, carried to the runtime's `EarlyStopper` as is."""

    SECTION: ClassVar[str] = "skygreen.early_stopping"
    metric: Annotated[str, meaning("The name of the reported metric, e.g. `val_loss`.", example="val_loss")]
    mode: Annotated[Literal["min", "max"], meaning("Whether lower (`min`) or higher (`max`) is better.")] = "min"
    patience: Annotated[int, meaning("Evaluations without improvement before the run stops.", ge=1)] = 3
    min_delta: Annotated[float, meaning("The smallest change that counts as an improvement.", ge=0)] = 0.0
    grace: Annotated[
        int, meaning("Evaluations at the start that never count against patience (curricula, warm-up).", ge=0)
    ] = 0


RecoveryStrategy = Literal["EAGER_NEXT_REGION", "FAILOVER"]
RECOVERY_STRATEGIES: tuple[str, ...] = typing.get_args(RecoveryStrategy)


class RecoverySpec(Record, frozen=True, kw_only=True):
    """`recovery:` of the task: the strategy and restart limit of SkyPilot's `job_recovery` (the
    renderer adds the preempted exit code to recover on); `recovery: FAILOVER` sets the strategy alone."""

    SECTION: ClassVar[str] = "skygreen.recovery"
    SHORTHAND: ClassVar[str] = "strategy"
    strategy: Annotated[
        RecoveryStrategy,
        meaning("Where SkyPilot relaunches a preempted job: the next region at once, or first the same region."),
    ] = "EAGER_NEXT_REGION"
    max_restarts_on_errors: Annotated[
        int,
        meaning("Relaunches after a failure that is not a preemption, before the job counts as failed.", ge=0, le=100),
    ] = 3


class BudgetAlertSpec(Record, frozen=True, kw_only=True):
    """When the runtime warns about spend (`budget_usd` itself stops the run at 100%)."""

    SECTION: ClassVar[str] = "skygreen.budget_alerts"
    at: Annotated[
        tuple[Annotated[float, msgspec.Meta(gt=0)], ...],
        meaning(
            "Warn once as spend crosses each fraction of `budget_usd` (0.5 for 50%).",
            allowed="fractions of `budget_usd`, at most 1",
        ),
    ] = ()
    """Sorted, each once; empty means the default 0.5, 0.8, 1.0."""
    webhook_env: Annotated[
        str | None,
        meaning(
            "The environment variable (declare it in `secrets:`) that holds the URL each alert is POSTed to as JSON.",
            allowed="an environment variable name, not the URL",
        ),
    ] = None
    burn_usd_per_hour: Annotated[
        float | None,
        meaning(
            "Warn once per segment when the run spends faster than this (controller included).",
            gt=0,
            unit="USD per hour",
        ),
    ] = None

    def rules(self) -> None:
        """Fractions of the budget, at most 1 (100%); a variable's name, never the URL it holds."""
        for i, fraction in enumerate(self.at):
            if fraction > 1:
                raise FieldProblem(
                    f"at[{i}]",
                    "is a fraction of budget_usd and must be at most 1",
                    value=fraction,
                    hint=f"write {fraction / 100:g} for {fraction:g}%" if fraction <= 100 else "use a number in (0, 1]",
                )
        if self.webhook_env is not None and not _ENV_NAME.match(self.webhook_env):
            raise FieldProblem(
                "webhook_env",
                "is not an environment variable name",
                value=self.webhook_env if "://" not in self.webhook_env else "<a URL>",
                hint="name the environment variable that holds the URL (e.g. BUDGET_WEBHOOK, declared "
                "in secrets:), not the URL itself",
            )
        msgspec.structs.force_setattr(self, "at", tuple(sorted(set(self.at))))


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


# ---------------------------------------------------------------- checkpoint

HALF_PRECISIONS: tuple[str, ...] = ("fp16", "bf16")
DEFAULT_QUIET_S = 30.0
"""Folder mode without a marker file: a checkpoint folder counts as complete once no file in it
changed for this long."""
_EVERY_ALLOWED = "auto | 500 | 90s | 5m | 1h"


def read_bucket(raw: Any, path: str) -> str:
    """The bucket through the one URL parser the stores use, so the task file takes exactly
    the buckets a run can open."""
    return canonical_url(read_str(raw, path), field=path)


def read_buckets(raw: Any, path: str) -> str:
    """`buckets:` (cloud or region -> bucket) as the set's one URL (`buckets://{...}`), which
    travels as the run's bucket; a set URL already read is taken back as it is."""
    from skygreen.bill.bucket import check_buckets
    from skygreen.checkpoint.bucket_set import SET_SCHEME

    if isinstance(raw, str) and raw.startswith(SET_SCHEME):
        return raw
    if not isinstance(raw, Mapping):
        raise SpecError(path, "must be a mapping of cloud or region to bucket", value=raw,
                        hint="e.g. {aws: s3://team-ckpt, gcp: gs://team-ckpt, azure: az://account/team-ckpt}")  # fmt: skip
    return check_buckets(raw, path)


def read_every(raw: Any, path: str) -> int | str:
    """`auto`, a number of steps, or a duration (`90s`, `5m`, `1h`) kept as written."""
    if raw == "auto":
        return "auto"
    if isinstance(raw, str):
        seconds = parse_duration_s(raw)
        if seconds is None:
            raise SpecError(path, "expected auto, a number of steps, or a duration", value=raw, allowed=_EVERY_ALLOWED,
                            hint="write e.g. every: 500 (steps) or every: 5m")  # fmt: skip
        if seconds <= 0:
            raise SpecError(
                path, "the interval must be greater than 0", value=raw, hint="write e.g. every: 5m, or auto"
            )
        return raw.strip()
    return read_int(raw, path, minimum=1)


def read_folder(raw: Any, path: str) -> str:
    """A folder inside the workdir (relative paths stay relative to it)."""
    folder = read_str(raw, path).strip()
    if ".." in Path(folder).parts:
        raise SpecError(path, "may not leave the workdir with `..`", value=folder,
                        hint="name a folder inside the workdir, e.g. dir: out")  # fmt: skip
    return folder


def read_marker(raw: Any, path: str) -> str:
    """A file name inside each checkpoint folder."""
    marker = read_str(raw, path).strip()
    if "/" in marker or marker in (".", ".."):
        raise SpecError(path, "must be a file name inside each checkpoint folder", value=marker,
                        hint="e.g. trainer_state.json (HF Trainer) or .metadata (torch.distributed.checkpoint)")  # fmt: skip
    return marker


_STRING: Mapping[str, Any] = {"type": "string"}


class CheckpointSpec(Record, frozen=True, kw_only=True):
    """`checkpoint:` of the task: where checkpoints go, how often, and how many are kept."""

    SECTION: ClassVar[str] = "skygreen.checkpoint"
    bucket: Annotated[
        str | None,
        meaning(
            "Where the run's checkpoints, ledger and prepared data live. Use a cloud bucket for a cloud run.",
            allowed=URL_FORMS,
            default="the local default bucket",
        ),
        ReadWith(read_bucket),
    ] = None
    """A canonical bucket URL (a set's `buckets://` URL with `buckets`); None: the local default bucket."""
    buckets: Annotated[
        str | None,
        meaning(
            "One bucket per cloud or region, e.g. `{aws: s3://team-ckpt, gcp: gs://team-ckpt}`: a run commits to "
            "the one nearest its VM (a region key wins over its cloud's key), restores the newest commit of them "
            "all and copies it once into the near one. The first listed holds the writer lease. Not with "
            "`bucket` or `region`.",
            allowed="cloud (aws, gcp, azure) or region -> s3://, gs:// or az:// bucket",
            default="none: one bucket (`bucket`)",
        ),
        ReadWith(read_buckets, "mapping", {"type": "object", "additionalProperties": _STRING}),
    ] = None
    """The set's URL (`skygreen.checkpoint.bucket_set`), which `bucket` then holds too."""
    region: Annotated[
        str | None,
        meaning(
            "Where the cloud bucket is, for pricing the bytes each save and restore moves. A region that "
            "contradicts the bucket (another cloud's, or not the one the bucket reports) is an error.",
            allowed="a region of the bucket's cloud, e.g. us-east-1, us-central1, eastus",
            default="read from the bucket when credentials allow, else the cloud's default region",
        ),
    ] = None
    every: Annotated[
        int | str,
        meaning(
            "How often to checkpoint. `auto` uses Daly's optimum from the measured save cost and the spot "
            "preemption rate; a preemption notice always commits one more.",
            allowed=f"auto | a number of steps | a duration ({', '.join(DURATION_UNITS_S)}), e.g. 500, 90s, 5m",
        ),
        ReadWith(read_every, "auto, integer or duration", {"type": ["integer", "string"]}),
    ] = "auto"
    keep: Annotated[
        int,
        meaning(
            "After each commit the bucket keeps the last `keep` checkpoints, the best by metric and every pinned one; "
            f"the rest are deleted. At least {MIN_KEEP}: the newest may be the broken one.",
            ge=MIN_KEEP,
            le=1000,
        ),
    ] = 3
    half_precision: Annotated[
        str | None,
        meaning(
            "Store weights as fp16 or bf16: smaller checkpoints, not bit-exact on resume.",
            choices=HALF_PRECISIONS,
            default="false (weights stored as trained)",
            off=True,
        ),
    ] = None
    dir: Annotated[
        str | None,
        meaning(
            "Folder mode: the folder the script saves its own checkpoint folders into; skygreen commits each "
            "complete one to the bucket and restores the latest before the script starts.",
            allowed="a path inside the workdir (no `..`)",
        ),
        ReadWith(read_folder),
    ] = None
    marker: Annotated[
        str | None,
        meaning(
            "Folder mode: a checkpoint folder is complete once it holds this file. Only with `dir`; not with "
            "`quiet_s`.",
            allowed="a file name, e.g. trainer_state.json or .metadata",
        ),
        ReadWith(read_marker),
    ] = None
    quiet_s: Annotated[
        float | None,
        meaning(
            "Folder mode without a marker: a checkpoint folder is complete once no file in it changed for this "
            "long. Only with `dir`.",
            gt=0,
            unit="seconds",
            default=f"{DEFAULT_QUIET_S:g} when there is no marker",
        ),
    ] = None

    @property
    def every_steps(self) -> int | None:
        """The interval in steps, when `every` gives one."""
        return self.every if isinstance(self.every, int) else None

    @property
    def every_s(self) -> float | None:
        """The interval in seconds, when `every` gives a duration."""
        return parse_duration_s(self.every) if isinstance(self.every, str) and self.every != "auto" else None

    @property
    def every_auto(self) -> bool:
        """True when `every:` was `auto` or left out: Daly's optimum from the measured save cost."""
        return self.every == "auto"

    def rules(self) -> None:
        """A set names its places in its keys; a region describes one cloud bucket; the folder
        mode's completion rules only with its folder, and one of them."""
        if self.buckets is not None:
            for other, value in (
                ("bucket", self.bucket if self.bucket != self.buckets else None),
                ("region", self.region),
            ):
                if value is not None:
                    raise FieldProblem("buckets", f"and skygreen.checkpoint.{other} cannot both be set: `bucket` names "
                                       "one bucket, `buckets` one per cloud or region", value=value,
                                       hint=f"remove {other}: (key each bucket of `buckets` by its cloud or region)")  # fmt: skip
            msgspec.structs.force_setattr(self, "bucket", self.buckets)
        if self.region is not None:
            from skygreen.bill.bucket import check_region

            msgspec.structs.force_setattr(self, "region", check_region(self.bucket, self.region))
        for key in ("marker", "quiet_s"):
            if getattr(self, key) is not None and self.dir is None:
                raise FieldProblem(key, "only means something with checkpoint.dir (the folder mode)", value=getattr(self, key),
                                   hint="add `dir:` naming the folder the script saves its checkpoint folders into, "
                                   "or remove it")  # fmt: skip
        if self.marker is not None and self.quiet_s is not None:
            raise FieldProblem("quiet_s", "and checkpoint.marker both say when a folder is complete; give one",
                               value=self.quiet_s, hint="remove quiet_s: (the marker file says it)")  # fmt: skip


# ---------------------------------------------------------------- power


def read_cap(raw: Any, path: str) -> CapRequest:
    """`auto`, `off` (or false), watts (50-1500) or a fraction of the default limit (0.3-1.0)."""
    if isinstance(raw, CapRequest):
        return raw
    if raw is False or raw in ("off", "auto"):
        return CapRequest(mode="off" if raw is False else raw)
    value = read_number(raw, path, positive=True)
    if value <= 1.0 and value < 0.3:
        raise SpecError(path, "a power cap below 30% of the default limit stalls training", value=raw,
                        hint="use a fraction between 0.3 and 1.0, or watts")  # fmt: skip
    if value > 1.0 and not 50 <= value <= 1500:
        raise SpecError(path, "watts must be between 50 and 1500", value=raw,
                        allowed="auto | off | watts (50-1500) | fraction (0.3-1.0)",
                        hint="give watts between 50 and 1500, a fraction such as 0.8, or auto")  # fmt: skip
    return CapRequest(mode="fraction" if value <= 1.0 else "watts", value=value)


class PowerSpec(Record, frozen=True, kw_only=True):
    """`power:` of the task: the GPU power cap the runtime sets through NVML while training, and
    whether failing to apply it is an error."""

    SECTION: ClassVar[str] = "skygreen.power"
    cap: Annotated[
        CapRequest,
        meaning(
            "`auto` measures steps at a few caps and keeps the one that best trades time for energy; "
            "`off` leaves the limit alone.",
            allowed="auto | off | 50 to 1500 (watts) | 0.3 to 1.0 (fraction of the default limit)",
            default="auto",
        ),
        ReadWith(
            read_cap,
            "auto, off, watts or fraction",
            {"anyOf": [{"type": "number"}, {"enum": ["auto", "off"]}, {"const": False}]},
        ),
    ] = CapRequest()
    required: Annotated[
        bool,
        meaning(
            "Fail before training when the cap cannot be applied (no permission, no GPU); otherwise the run "
            "trains uncapped and says so."
        ),
    ] = False
    eta: Annotated[
        float | None,
        meaning(
            "The `auto` chooser's weight on energy against time.",
            ge=0,
            le=1,
            allowed="0 is time only, 1 energy only",
            default=f"{DEFAULT_ETA:g}",
        ),
    ] = None

    @property
    def mode(self) -> str:
        """auto | off | watts | fraction."""
        return self.cap.mode

    @property
    def cap_w(self) -> float | None:
        """The cap in watts, in `watts` mode."""
        return self.cap.value if self.cap.mode == "watts" else None

    @property
    def cap_fraction(self) -> float | None:
        """The cap as a fraction of the default limit, in `fraction` mode."""
        return self.cap.value if self.cap.mode == "fraction" else None
