"""One offer's whole bill: the estimate (`skygreen.plan.cost`) with the bytes its checkpoints move.

With a bucket per place (`checkpoint.buckets`), each offer is priced against its nearest
bucket (`skygreen.bill.bucket_places`); the copies a move makes are added once the offers are
ranked (`skygreen.plan.set_copies`). With a cloud bucket and a known checkpoint size (`skygreen.model`), each offer is priced as

    compute = price x wall hours x nodes
    data    = transfer + storage + requests of the run's traffic (`skygreen.bill`)

and `checkpoint.every: auto` takes the interval that minimises the sum
(`skygreen.bill.interval`): a save then weighs its stall and its dollars against the work a
preemption loses. Tiers make a gigabyte's price depend on the run's volume, so the interval is
found twice: first at the volume of the bytes-free interval, then at the rate that volume pays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skygreen.bill.rates import Place, load_rates, requests_usd, usd_per_gb
from skygreen.bill.run_bill import RunBill, bill_run
from skygreen.bill.traffic import RunTraffic, run_traffic, save_gb
from skygreen.plan.cost import Estimate, RunModel, estimate


@dataclass(frozen=True, kw_only=True, slots=True)
class Priced:
    """An offer's estimate, its bill and the traffic under it (None without a bucket or a size)."""

    estimate: Estimate
    bill: RunBill
    traffic: RunTraffic | None
    save_usd: float
    """What one save costs in transfer and requests (0 without a bucket)."""


def _traffic(model: RunModel, est: Estimate, bucket: Place, *, gpus_per_node: int) -> RunTraffic:
    training_h = max(est.est_hours - est.expected_preemptions * est.restart_s / 3600.0, est.compute_hours)
    files = gpus_per_node * model.num_nodes if model.checkpoint_sharded else 1
    return run_traffic(
        save_gb=save_gb(model.checkpoint_gb or 0.0, trainable_fraction=model.trainable_fraction),
        interval_s=est.checkpoint_interval_s,
        training_hours=training_h,
        expected_preemptions=est.expected_preemptions,
        keep=model.keep,
        span_hours=est.est_hours,
        bucket_cloud=bucket.cloud,
        files_per_save=files,
    )


def save_usd(traffic: RunTraffic, *, vm: Place, bucket: Place) -> float:
    """One save's dollars: its bytes at the average rate of the run's upload volume, and its writes."""
    rates = load_rates()
    volume_gb = traffic.uploaded_gb or traffic.save_gb
    writes_per_save = traffic.writes / traffic.saves if traffic.saves else 0.0
    return traffic.save_gb * usd_per_gb(vm, bucket, volume_gb, rates) + requests_usd(
        bucket.cloud, writes=writes_per_save, reads=0.0, rates=rates
    )


def price_offer(
    model: RunModel,
    *,
    cloud: str,
    region: str,
    gpu: str,
    gpus_per_node: int,
    spot: bool,
    price_usd_per_hour: float,
    efficiency: float | None = None,
) -> Priced | None:
    """The offer's estimate and whole bill; None when preemptions would stop the run.
    `efficiency` is the share of linear speed-up the step's communication leaves
    (`skygreen.plan.speed`), as `skygreen.plan.cost.compute_hours` takes it."""
    est = estimate(model, cloud=cloud, gpu=gpu, gpus_per_node=gpus_per_node, spot=spot, efficiency=efficiency)
    if est is None:
        return None
    compute_usd = price_usd_per_hour * est.est_hours * model.num_nodes
    if model.bucket is None or model.checkpoint_gb is None:
        return Priced(estimate=est, bill=RunBill(compute=compute_usd), traffic=None, save_usd=0.0)
    vm = Place(cloud=cloud, region=region)
    bucket = model.bucket if model.bucket_set is None else model.bucket_set.nearest(vm)[1].place
    traffic = _traffic(model, est, bucket, gpus_per_node=gpus_per_node)
    per_save = save_usd(traffic, vm=vm, bucket=bucket)
    if model.checkpoint_interval_s is None and per_save > 0 and est.checkpoint_interval_s is not None:
        for _ in range(2):  # the bytes-free interval's volume, then the rate that volume pays
            found = estimate(
                model,
                cloud=cloud,
                gpu=gpu,
                gpus_per_node=gpus_per_node,
                spot=spot,
                efficiency=efficiency,
                save_usd=per_save,
                run_price_usd_per_hour=price_usd_per_hour * model.num_nodes,
            )
            if found is None:
                break
            est = found
            traffic = _traffic(model, est, bucket, gpus_per_node=gpus_per_node)
            per_save = save_usd(traffic, vm=vm, bucket=bucket)
        compute_usd = price_usd_per_hour * est.est_hours * model.num_nodes
    bill = bill_run(compute_usd=compute_usd, traffic=traffic, vm=vm, bucket=bucket)
    return Priced(estimate=est, bill=bill, traffic=traffic, save_usd=per_save if math.isfinite(per_save) else 0.0)
