"""How long and how much: the estimate model that turns an offer into the cost of one whole run.

    compute_h   = work_gpu_hours x speed(work.gpu) / (speed(gpu) x gpus x efficiency(gpus))
    wall_h      = compute_h x (1 + C/tau) / (1 - lambda x (R + tau/2))      (spot)
    wall_h      = compute_h x (1 + C/tau)                                   (on-demand, lambda = 0)
    cost_usd    = price_usd_per_hour x wall_h x num_nodes

where gpus = GPUs per node x nodes; efficiency = compute / (compute + exposed communication) of
one step on the offer's links when the task gives its model (`skygreen.plan.speed`), else 0.95 per
doubling of gpus (data-parallel all-reduce overhead); lambda = the cloud's assumed preemption rate per hour x nodes (any node
lost stops the job); R = restart time (provision, setup, load the checkpoint); tau = the
checkpoint interval; C = the blocking cost of one save (with a fixed interval, at most a
tenth of it: whoever checkpoints every few seconds has small saves). Each preemption costs R plus, on
average, half an interval of lost work; each interval costs C. With `every: auto` tau is
Daly's optimum for C and the mean time between preemptions 1/lambda (Daly 2006, "A higher
order estimate of the optimum checkpoint interval for restart dumps"), so on-demand offers
(lambda = 0) pay no checkpoint overhead. When lambda x (R + tau/2) reaches 0.9 the run would
spend its time restarting: the offer is not viable and gets no estimate.

Assumed preemption rates, per hour a spot node is alive, come from the one table in
`skygreen.checkpoint.interval.PREEMPTION_RATE_PER_HOUR` (override with
`skygreen.preemption.rate_per_hour`); the checkpoint interval is that module's
`optimal_interval_s`, the same one the runtime uses.
Restart 6 min and a 10 s blocking save (an async save blocks only for the copy to host
memory: PyTorch DCP async_save measured 6.3 s for a 7B model) are the other defaults.

With the model's size known (`skygreen.model`), the checkpoint's size S (`skygreen.plan.memory`)
replaces the flat save and adds its restore to the restart:

    C         = S per GPU / HOST_COPY_GB_PER_S          (the blocking copy to host memory)
    upload_s  = S / (upload rate x uploading nodes)     (tau is never shorter: one save in flight)
    R         = restart + S / (download rate x downloading nodes)

where every node uploads and downloads its own shards under FSDP and one node holds the whole
checkpoint under DDP. The rates are measured by earlier runs of the task where known, else
`DEFAULT_TRANSFER_GB_PER_S` per node.

Energy = (wall_h - restarts x R) x nodes x gpus x board power (TDP) x 0.8 average draw x the
cloud's PUE x the power cap's energy ratio. Carbon = energy x grams CO2e per kWh of the region
(`skygreen.plan.carbon`). The cap's ratio comes from `skygreen.power.model` (calibrated to the V100
study, arXiv 2205.09646: 0.6 of the default limit -> 0.863 of the energy; `auto` at the limit the
Zeus-style chooser keeps on the model's ladder; `off` 1.0). The cap's slowdown (+6.8% at 0.6) is
not added to the time and cost: the runtime's `auto` profile measures it per job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from skygreen.bill.bucket_places import SetPlaces
from skygreen.bill.interval import auto_interval_s
from skygreen.bill.rates import Place
from skygreen.checkpoint.interval import PREEMPTION_RATE_PER_HOUR
from skygreen.gpus import GPUS
from skygreen.power.model import planned_energy_ratio

DEFAULT_RESTART_S = 360.0
DEFAULT_CHECKPOINT_COST_S = 10.0
SCALING_EFFICIENCY_PER_DOUBLING = 0.95
GPU_AVERAGE_DRAW_FRACTION = 0.8
"""Average board power during training as a fraction of TDP (mixed-precision training keeps
GPUs near, not at, their limit; skygreen's own metering replaces this after a run)."""
PUE: Mapping[str, float] = {"aws": 1.15, "gcp": 1.10, "azure": 1.18}
"""Power usage effectiveness as each provider reports its fleet (Google 2023 environmental
report 1.10; AWS 2023 sustainability report 1.15; Microsoft 2023 datacenter fact sheet 1.18)."""
MAX_LOSS_FRACTION = 0.9
MAX_SAVE_FRACTION = 0.1
DEFAULT_TRANSFER_GB_PER_S = 0.25
"""Per node, to and from the bucket, when no run of the task measured it: a conservative figure
for a few parallel multipart streams to an object store in the VM's region (one boto3 stream
reaches about 0.1 GB/s)."""
PROVISION_S = 240.0
"""The cloud's part of a restart, which no VM sees: 4 minutes of provisioning ("Can't Be Late",
NSDI'24, measured on a RoBERTa job). A changeover measured by earlier runs of the task (from the
first setup line to the first new step, restore included) comes on top of it."""
HOST_COPY_GB_PER_S = 1.5
"""Per GPU, the blocking copy of a checkpoint shard to host memory (an assumption, in line with
DCP async_save's 6.3 s for a 7B model spread over 8 GPUs)."""
"""A fixed interval (`every: 5s`) caps the assumed blocking save at this fraction of it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunModel:
    """Everything the estimate needs besides the offer, taken from the task file."""

    work_gpu_hours: float
    work_on: str = "A100"
    speed: Mapping[str, float] = field(default_factory=dict)
    """Relative speed per GPU (A100 = 1.0); missing GPUs use `skygreen.gpus`."""
    num_nodes: int = 1
    preemption_rate_per_hour: Mapping[str, float] = field(default_factory=lambda: dict(PREEMPTION_RATE_PER_HOUR))
    restart_s: float = DEFAULT_RESTART_S
    checkpoint_cost_s: float = DEFAULT_CHECKPOINT_COST_S
    checkpoint_interval_s: float | None = None
    """None: Daly's optimum per offer (`every: auto`)."""
    power_cap_mode: str = "off"
    """The task's `power.cap`: off | auto | watts | fraction (`skygreen.task.spec.PowerSpec.mode`)."""
    power_cap_value: float | None = None
    power_eta: float = 0.5
    checkpoint_gb: float | None = None
    """The size of one checkpoint, all shards together; None: unknown (a flat `checkpoint_cost_s`)."""
    checkpoint_sharded: bool = False
    """Every node saves and loads its own shards (FSDP) rather than one node the whole (DDP)."""
    upload_gb_per_s: float = DEFAULT_TRANSFER_GB_PER_S
    download_gb_per_s: float = DEFAULT_TRANSFER_GB_PER_S
    measured_changeover_s: Mapping[str, float] = field(default_factory=dict)
    """Changeovers measured by earlier runs of the task, "cloud/GPU" or "cloud" -> seconds; where
    one is known it replaces `restart_s` (and the restore) with `PROVISION_S` plus it."""
    bucket: Place | None = None
    """Where the checkpoint bucket is; None: a local bucket (no transfer, storage or requests)."""
    bucket_set: SetPlaces | None = None
    """A bucket per place (`checkpoint.buckets`): each offer is priced against its nearest
    (`skygreen.bill.bucket_places`); `bucket` is then the home bucket's place."""
    keep: int = 3
    """Checkpoints the bucket keeps (`checkpoint.keep`), for storage."""
    trainable_fraction: float = 1.0
    """The fraction of the checkpoint a save writes: 1.0 for a full fine-tune; less where only
    the trainable state is saved (adapters)."""

    def __post_init__(self) -> None:
        if not (self.work_gpu_hours > 0 and math.isfinite(self.work_gpu_hours)):
            raise ValueError(f"work_gpu_hours must be > 0, got {self.work_gpu_hours}")
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {self.num_nodes}")
        if self.restart_s < 0 or self.checkpoint_cost_s < 0:
            raise ValueError("restart_s and checkpoint_cost_s must be >= 0")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint_interval_s must be > 0, got {self.checkpoint_interval_s}")
        if self.checkpoint_gb is not None and not (math.isfinite(self.checkpoint_gb) and self.checkpoint_gb >= 0):
            raise ValueError(f"checkpoint_gb must be a finite number >= 0, got {self.checkpoint_gb}")
        if not (self.upload_gb_per_s > 0 and self.download_gb_per_s > 0):
            raise ValueError(f"transfer rates must be > 0, got {self.upload_gb_per_s}, {self.download_gb_per_s}")
        for cloud, rate in self.preemption_rate_per_hour.items():
            if rate < 0:
                raise ValueError(f"preemption rate for {cloud} must be >= 0, got {rate}")
        self.relative_speed(self.work_on)  # fail early on an unknown reference GPU

    def relative_speed(self, gpu: str) -> float:
        """The GPU's training speed relative to one A100: the task's `speed` override, else
        `skygreen.gpus`'s figure; a `ValueError` for a GPU in neither."""
        if gpu in self.speed:
            return self.speed[gpu]
        if gpu not in GPUS:
            raise ValueError(f"no relative speed known for GPU {gpu!r}")
        return GPUS[gpu].relative_speed


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointCost:
    """What checkpoints cost a run on one offer shape: the blocking part of a save, the upload
    that must end before the next save, and the restart including the restore."""

    blocking_s: float
    upload_s: float
    restore_s: float
    restart_s: float


def measured_changeover(model: RunModel, cloud: str | None, gpu: str | None) -> float | None:
    """The changeover earlier runs measured on this cloud and GPU, else on this cloud; None if none."""
    if cloud is None:
        return None
    found = model.measured_changeover_s.get(f"{cloud}/{gpu}")
    return found if found is not None else model.measured_changeover_s.get(cloud)


def checkpoint_cost(
    model: RunModel, gpus_per_node: int, *, cloud: str | None = None, gpu: str | None = None
) -> CheckpointCost:
    """The save and restore times on `gpus_per_node` x `model.num_nodes` GPUs: from the
    checkpoint's size and the transfer rates when the size is known, else the flat defaults.
    The restart is `PROVISION_S` plus the changeover measured on `cloud` (and `gpu`) where
    earlier runs measured one (its restore included), else the default plus the restore."""
    measured = measured_changeover(model, cloud, gpu)
    if model.checkpoint_gb is None:
        restart_s = model.restart_s if measured is None else PROVISION_S + measured
        return CheckpointCost(blocking_s=model.checkpoint_cost_s, upload_s=0.0, restore_s=0.0, restart_s=restart_s)
    nodes = model.num_nodes if model.checkpoint_sharded else 1
    per_gpu_gb = (
        model.checkpoint_gb / (gpus_per_node * model.num_nodes) if model.checkpoint_sharded else model.checkpoint_gb
    )
    restore_s = model.checkpoint_gb / (model.download_gb_per_s * nodes)
    return CheckpointCost(
        blocking_s=per_gpu_gb / HOST_COPY_GB_PER_S,
        upload_s=model.checkpoint_gb / (model.upload_gb_per_s * nodes),
        restore_s=restore_s,
        restart_s=model.restart_s + restore_s if measured is None else PROVISION_S + measured,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """The expected wall time, energy and preemptions of one run on one offer."""

    compute_hours: float
    est_hours: float
    expected_preemptions: float
    checkpoint_interval_s: float | None
    energy_kwh: float
    restart_s: float = DEFAULT_RESTART_S
    """Per preemption: provisioning, setup and the restore."""
    checkpoint_save_s: float = DEFAULT_CHECKPOINT_COST_S
    """The blocking part of one save."""


def scaling_efficiency(total_gpus: int) -> float:
    """The fraction of linear speed-up kept on `total_gpus` data-parallel GPUs: 0.95 per doubling
    (1.0 on one GPU, 0.9025 on four), continuous in between."""
    return SCALING_EFFICIENCY_PER_DOUBLING ** math.log2(total_gpus)


def compute_hours(model: RunModel, gpu: str, gpus_per_node: int, *, efficiency: float | None = None) -> float:
    """Hours of uninterrupted training for the whole job on `gpus_per_node` x nodes of `gpu`, at
    `efficiency` of linear speed-up (from the step's communication, `skygreen.plan.speed`), else
    `scaling_efficiency`'s fixed loss per doubling."""
    total = gpus_per_node * model.num_nodes
    reference_hours = model.work_gpu_hours * model.relative_speed(model.work_on)
    kept = scaling_efficiency(total) if efficiency is None else efficiency
    return reference_hours / (model.relative_speed(gpu) * total * kept)


def _auto_interval_s(
    save_cost_s: float, rate_per_hour: float, restart_s: float, save_usd: float, run_price_usd_per_hour: float | None
) -> float:
    """Daly's optimum, or with a save's dollars the dollar-optimal interval, held where preemptions
    cost at most `skygreen.bill.interval.DOLLAR_LOSS_CAP` of the time."""
    return auto_interval_s(
        stall_s=save_cost_s,
        save_usd=save_usd,
        price_usd_per_hour=run_price_usd_per_hour,
        mtbf_s=3600.0 / rate_per_hour,
        restart_s=restart_s,
    )


def estimate(
    model: RunModel,
    *,
    cloud: str,
    gpu: str,
    gpus_per_node: int,
    spot: bool,
    efficiency: float | None = None,
    save_usd: float = 0.0,
    run_price_usd_per_hour: float | None = None,
) -> Estimate | None:
    """The run's expected wall hours and energy on an offer, or None when preemptions would
    stop it from making progress; `efficiency` as `compute_hours` takes it.

    With `save_usd` (what a save's bytes and requests cost) and the price per hour of all nodes,
    `every: auto` takes the dollar-optimal interval (`skygreen.bill.interval`), held where
    preemptions cost at most `skygreen.bill.interval.DOLLAR_LOSS_CAP` of the time; without, Daly's optimum."""
    compute_h = compute_hours(model, gpu, gpus_per_node, efficiency=efficiency)
    rate = model.preemption_rate_per_hour.get(cloud, PREEMPTION_RATE_PER_HOUR.get(cloud, 0.0))
    rate_per_hour = rate * model.num_nodes if spot else 0.0
    interval_s = model.checkpoint_interval_s
    ckpt = checkpoint_cost(model, gpus_per_node, cloud=cloud, gpu=gpu)
    save_cost_s = ckpt.blocking_s
    restart_s = ckpt.restart_s
    if interval_s is None:
        # A zero save cost would make any interval free; one second stands in for it. A save
        # waits for the previous upload, so the interval is never shorter than one upload.
        interval_s = (
            max(
                _auto_interval_s(max(save_cost_s, 1.0), rate_per_hour, restart_s, save_usd, run_price_usd_per_hour),
                ckpt.upload_s,
            )
            if rate_per_hour > 0
            else math.inf
        )
    elif model.checkpoint_gb is None:
        # Whoever saves every few seconds has small saves: at most a tenth of the interval.
        save_cost_s = min(save_cost_s, interval_s * MAX_SAVE_FRACTION)
    else:
        # A fixed interval shorter than an upload waits for it: the wait blocks training.
        save_cost_s = max(save_cost_s, ckpt.upload_s - interval_s)
    save_overhead = save_cost_s / interval_s if math.isfinite(interval_s) else 0.0
    lost_per_preemption_h = (restart_s + (interval_s / 2 if math.isfinite(interval_s) else 0.0)) / 3600.0
    loss = rate_per_hour * lost_per_preemption_h
    if loss >= MAX_LOSS_FRACTION:
        return None
    wall_h = compute_h * (1 + save_overhead) / (1 - loss)
    preemptions = rate_per_hour * wall_h
    busy_h = max(wall_h - preemptions * restart_s / 3600.0, compute_h)
    info = GPUS.get(gpu)
    tdp_w = info.tdp_w if info else 300.0
    cap_ratio = planned_energy_ratio(model.power_cap_mode, model.power_cap_value, tdp_w=tdp_w, eta=model.power_eta)
    draw_w = tdp_w * GPU_AVERAGE_DRAW_FRACTION * cap_ratio
    energy = busy_h * model.num_nodes * gpus_per_node * draw_w * PUE.get(cloud, 1.2) / 1000.0
    return Estimate(
        compute_hours=compute_h,
        est_hours=wall_h,
        expected_preemptions=preemptions,
        checkpoint_interval_s=interval_s if math.isfinite(interval_s) else None,
        energy_kwh=energy,
        restart_s=restart_s,
        checkpoint_save_s=save_cost_s,
    )
