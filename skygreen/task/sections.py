"""The task file's sections declared as msgspec records (`skygreen.task.declare.Record`): each
field's type, default, bounds and meaning in one annotation, the rules across its fields in
`rules()`. `skygreen.task.records` holds the rest of the records and the `skygreen:` section;
import them all from `skygreen.task.spec`.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

import msgspec

from skygreen.task.declare import FieldProblem, Record, choices_of, meaning


class Batch(Record, frozen=True, kw_only=True):
    """`batch:` of the task: the effective batch and the micro-batch each rank runs at once; the
    runtime accumulates gradients between them."""

    SECTION: ClassVar[str] = "skygreen.batch"
    effective: (
        Annotated[
            int,
            meaning(
                "Samples per optimizer step over all ranks. It stays the same on any GPU and any number of them, so a "
                "resumed run trains the same steps.",
                ge=1,
                allowed="a multiple of gpu_count x num_nodes",
            ),
        ]
        | None
    ) = None
    """None keeps the training script's own (`effective_batch=`)."""
    micro: (
        Annotated[
            int,
            meaning(
                "Samples per forward pass on each rank; `auto` probes the largest that fits the GPU.",
                ge=1,
                allowed="dividing the per-rank batch",
                auto=True,
            ),
        ]
        | None
    ) = None
    """None means `auto` (probe the largest that fits)."""

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


class RecoverySpec(Record, frozen=True, kw_only=True):
    """`recovery:` of the task: the strategy and restart limit of SkyPilot's `job_recovery` (the
    renderer adds the preempted exit code to recover on); `recovery: FAILOVER` sets the strategy alone."""

    SECTION: ClassVar[str] = "skygreen.recovery"
    SHORTHAND: ClassVar[str] = "strategy"
    strategy: Annotated[
        Literal["EAGER_NEXT_REGION", "FAILOVER"],
        meaning(
            "Where SkyPilot relaunches a preempted job: the next region at once, or first the same region.",
        ),
    ] = "EAGER_NEXT_REGION"
    max_restarts_on_errors: Annotated[
        int,
        meaning("Relaunches after a failure that is not a preemption, before the job counts as failed.", ge=0, le=100),
    ] = 3


EARLY_STOP_MODES: tuple[str, ...] = choices_of(EarlyStopConfig, "mode")
RECOVERY_STRATEGIES: tuple[str, ...] = choices_of(RecoverySpec, "strategy")


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
    webhook_env: (
        Annotated[
            str,
            meaning(
                "The environment variable (declare it in `secrets:`) that holds the URL each alert is POSTed to as JSON.",
                allowed="an environment variable name, not the URL",
            ),
        ]
        | None
    ) = None
    burn_usd_per_hour: (
        Annotated[
            float,
            meaning(
                "Warn once per segment when the run spends faster than this (controller included).",
                gt=0,
                unit="USD per hour",
            ),
        ]
        | None
    ) = None

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
