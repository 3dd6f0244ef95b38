"""The plan's records: a `Candidate` (one offer with what the run is expected to take there) and
the `Plan` (the ranked candidates and what the ranking assumed).

Apart from `skygreen.plan.rank`, which makes them, so that the modules that explain and draw a
plan (`explain`, `report`) read the records without importing the ranking.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from skygreen.plan.catalog import CLOUDS
from skygreen.plan.cost import DEFAULT_CHECKPOINT_COST_S, DEFAULT_RESTART_S
from skygreen.task.spec import OBJECTIVES


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One offer the job could run on, with what the run is expected to take there."""

    cloud: str
    region: str
    zone: str | None
    """The cheapest zone when the catalog has zones (AWS: a zone ID such as "use1-az1"), else None."""
    instance_type: str
    """For GCP: the host VM type (e.g. "a2-highgpu-1g")."""
    accelerator: str
    accelerator_count: int
    """GPUs per node."""
    spot: bool
    price_usd_per_hour: float
    """The price of this offer per node (the spot price when spot), equal to SkyPilot's."""
    on_demand_price_usd_per_hour: float | None
    spot_price_usd_per_hour: float | None
    est_hours: float
    """Wall hours including the expected preemption overhead."""
    est_cost_usd: float
    """For the whole run, all nodes."""
    energy_kwh: float
    co2e_kg: float
    num_nodes: int = 1
    compute_hours: float = 0.0
    """Hours of uninterrupted training; est_hours minus this is the spot overhead."""
    expected_preemptions: float = 0.0
    checkpoint_interval_s: float | None = None
    on_demand_hours: float = 0.0
    """Under a deadline: expected hours a spot run spends on its on-demand fallback."""
    deadline_source: str | None = None
    """Under a deadline, where the expected cost of a spot run came from: "traces" or "model"."""
    memory_per_gpu_gb: float | None = None
    """With `skygreen.model`: what each GPU holds at the high end of the estimate, in GB."""
    memory_gb_per_gpu: Mapping[str, float] | None = None
    """With `skygreen.model`: each GPU's memory by term, in GB: states, activations, logits,
    overhead, and the low and high ends of the peak (`skygreen.memory.estimate`)."""
    step: Mapping[str, float] | None = None
    """With `skygreen.model` and a GPU without a given or measured speed: seconds of compute and
    of communication per optimizer step and the efficiency they leave (`skygreen.plan.speed`)."""
    restart_s: float = DEFAULT_RESTART_S
    """Per preemption: provisioning, setup and the checkpoint's restore."""
    checkpoint_save_s: float = DEFAULT_CHECKPOINT_COST_S
    """The blocking part of one checkpoint save."""
    cost_usd: Mapping[str, float] = field(default_factory=dict)
    """The whole bill by kind: compute, transfer, storage, requests and their total, which
    `est_cost_usd` equals (`skygreen.bill`). Left empty when made: compute alone, `est_cost_usd`."""
    bytes_moved_gb: float = 0.0
    """GB the run's checkpoints move between the VM and the bucket (saves and restores)."""
    checkpoint_save_usd: float = 0.0
    """What one save costs in transfer and requests."""

    def __post_init__(self) -> None:
        if self.cloud not in CLOUDS:
            raise ValueError(f"unknown cloud {self.cloud!r}")
        if self.accelerator_count < 1 or self.num_nodes < 1:
            raise ValueError("accelerator_count and num_nodes must be >= 1")
        for name in ("price_usd_per_hour", "est_hours", "est_cost_usd", "energy_kwh", "co2e_kg"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not self.cost_usd:
            compute_only = {"compute": self.est_cost_usd, "transfer": 0.0, "storage": 0.0, "requests": 0.0}
            object.__setattr__(self, "cost_usd", {**compute_only, "total": self.est_cost_usd})
        elif set(self.cost_usd) != set(COST_KINDS):
            raise ValueError(f"cost_usd must have exactly {', '.join(COST_KINDS)}, got {sorted(self.cost_usd)}")
        elif not math.isclose(self.cost_usd["total"], self.est_cost_usd, rel_tol=1e-9, abs_tol=1e-9):
            raise ValueError(f"est_cost_usd {self.est_cost_usd} must equal cost_usd total {self.cost_usd['total']}")

    @property
    def compute_usd(self) -> float:
        """The compute part of the bill."""
        return self.cost_usd["compute"]

    @property
    def data_usd(self) -> float:
        """Transfer, storage and requests together: what the bucket costs the run."""
        return self.est_cost_usd - self.compute_usd

    @property
    def label(self) -> str:
        """A short human name: `aws us-east-1 g6.xlarge (L4x1, spot)`."""
        kind = "spot" if self.spot else "on-demand"
        nodes = f" x{self.num_nodes} nodes" if self.num_nodes > 1 else ""
        return f"{self.cloud} {self.region} {self.instance_type} ({self.accelerator}x{self.accelerator_count}{nodes}, {kind})"

    def to_json(self) -> dict:
        """Every field under its own name, values as they are (all plain JSON values); no `label`."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: object) -> object:
    return dict(value) if isinstance(value, Mapping) else value


COST_KINDS: tuple[str, ...] = ("compute", "transfer", "storage", "requests", "total")


def with_compute(c: Candidate, compute_usd: float, **changes: object) -> Candidate:
    """The candidate with its compute repriced (a deadline's on-demand fallback) and `changes`;
    its data bill stays, and `est_cost_usd` stays the total."""
    bill = dict(c.cost_usd)
    data = c.data_usd
    bill.update(compute=compute_usd, total=compute_usd + data)
    return replace(c, est_cost_usd=compute_usd + data, cost_usd=bill, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """The ranked candidates, best first, and what the ranking assumed."""

    candidates: tuple[Candidate, ...]
    objective: str
    best_per_cloud: Mapping[str, Candidate] = field(default_factory=dict)
    reason: tuple[str, ...] = ()
    """One or two sentences on why the winner won."""
    assumptions: tuple[str, ...] = ()
    night_hint: str = ""
    """One sourced line: what starting the winner at the region's night would save, for a job that can wait."""
    notices: tuple[str, ...] = ()
    catalog_source: str = ""
    offers_considered: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}")
        if not self.candidates:
            raise ValueError("a plan has at least one candidate")

    @property
    def best(self) -> Candidate:
        """The winner: the first candidate (a plan always has one)."""
        return self.candidates[0]

    def to_json(self) -> dict:
        """The plan for `skygreen plan --json`: every field but `offers_considered`, the catalog's
        source under the key `catalog`."""
        return {
            "candidates": [c.to_json() for c in self.candidates],
            "objective": self.objective,
            "best_per_cloud": {cloud: c.to_json() for cloud, c in self.best_per_cloud.items()},
            "reason": list(self.reason),
            "assumptions": list(self.assumptions),
            "night_hint": self.night_hint,
            "notices": list(self.notices),
            "catalog": self.catalog_source,
        }
