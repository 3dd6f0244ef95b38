"""The filters of a task's `skygreen:` section, in a form the ranking applies to each offer and
relaxes one at a time when nothing passes.

Apart from `rank` so that `fit` (which sizes a model onto an offer under these filters) and
`rank` (which uses `fit`) import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.gpus import GPUS
from skygreen.plan.catalog import Offer
from skygreen.task.spec import GreenSpec, ModelSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class Constraints:
    """The filters of the `skygreen:` section, in a form that can be relaxed one at a time."""

    gpu_names: tuple[str, ...] | None
    min_memory_gb: float | None
    gpu_count: int | None
    """None: any number of GPUs per node (only used when relaxing)."""
    clouds: tuple[str, ...]
    regions: tuple[str, ...] | None
    max_price_per_hour: float | None
    budget_usd: float | None
    spot: bool
    on_demand: bool
    model: ModelSpec | None = None
    """With a model, only offers whose GPUs hold it pass, on as many nodes as it takes."""
    precision: str = "auto"
    fixed_nodes: int | None = None
    """The task's own `num_nodes`; None lets a task with a model take the fewest nodes that hold it."""
    effective_batch: int | None = None
    """With a model and any GPU count: only shapes whose ranks split the effective batch evenly."""

    @classmethod
    def from_spec(cls, green: GreenSpec, *, num_nodes: int | None = None) -> Constraints:
        """The section's filters; with `precision: bf16` and no GPU list, only GPUs with bf16 tensor
        cores. On-demand is allowed when `spot` is off or `on_demand_fallback` is on. With a
        `model` and no `gpu_count`, any GPU count per node; `num_nodes` is the task's own, if any."""
        names = green.gpus.names
        if names is None and green.precision == "bf16":  # the runtime refuses bf16 on older GPUs
            names = tuple(name for name, info in GPUS.items() if info.bf16)
        return cls(
            gpu_names=names,
            min_memory_gb=green.gpus.min_memory_gb,
            gpu_count=None if green.model is not None and not green.gpu_count_given else green.gpu_count,
            clouds=green.clouds,
            regions=green.regions,
            max_price_per_hour=green.max_price_per_hour,
            budget_usd=green.budget_usd,
            spot=green.spot,
            on_demand=(not green.spot) or green.on_demand_fallback,
            model=green.model,
            precision=green.precision,
            fixed_nodes=num_nodes if green.model is None or num_nodes is not None else None,
            effective_batch=green.batch.effective if green.model is not None else None,
        )

    def admits_offer(self, offer: Offer) -> bool:
        """The filters that need no estimate."""
        if offer.cloud not in self.clouds or offer.accelerator not in GPUS:
            return False
        if self.gpu_names is not None and offer.accelerator not in self.gpu_names:
            return False
        if self.min_memory_gb is not None and GPUS[offer.accelerator].memory_gb < self.min_memory_gb:
            return False
        if self.gpu_count is not None and offer.accelerator_count != self.gpu_count:
            return False
        return self.regions is None or offer.region in self.regions

    def spot_options(self) -> tuple[bool, ...]:
        """The markets to price each offer on: True for spot, False for on-demand, spot first."""
        return tuple(s for s, allowed in ((True, self.spot), (False, self.on_demand)) if allowed)
