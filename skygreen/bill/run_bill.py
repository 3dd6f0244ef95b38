"""The bill of one run on one offer: compute, transfer, storage and requests, and their total.

    compute   = price per hour x wall hours x nodes (the plan's estimate)
    transfer  = transfer(VM -> bucket, uploaded GB) + transfer(bucket -> VM, downloaded GB)
    storage   = kept GB-months x the bucket cloud's price per GB-month
    requests  = writes and reads x the bucket cloud's request prices

Each direction is priced by its sender (`skygreen.bill.rates.transfer_usd`) on the run's whole
volume in that direction, as if the run were the account's only traffic that month.
Not counted: the controller VM, disks, the VM's own internet traffic (datasets, images), the
free monthly allowances (account-wide), and checkpoints kept after the run ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.bill.rates import Place, Rates, load_rates, requests_usd, storage_usd, transfer_usd
from skygreen.bill.traffic import RunTraffic


@dataclass(frozen=True, kw_only=True, slots=True)
class RunBill:
    """One run's dollars by kind."""

    compute: float
    transfer: float = 0.0
    storage: float = 0.0
    requests: float = 0.0

    @property
    def data(self) -> float:
        """Everything but compute: what the bucket costs the run."""
        return self.transfer + self.storage + self.requests

    @property
    def total(self) -> float:
        """The whole bill."""
        return self.compute + self.data

    def to_json(self) -> dict[str, float]:
        """`cost_usd` of `plan --json`: compute, transfer, storage, requests, total."""
        return {
            "compute": self.compute,
            "transfer": self.transfer,
            "storage": self.storage,
            "requests": self.requests,
            "total": self.total,
        }


def transfer_of(traffic: RunTraffic, *, vm: Place, bucket: Place, rates: Rates | None = None) -> float:
    """The transfer dollars of a run's traffic between the VM's place and the bucket's."""
    rates = rates or load_rates()
    return transfer_usd(vm, bucket, traffic.uploaded_gb, rates) + transfer_usd(bucket, vm, traffic.downloaded_gb, rates)


def bill_run(
    *, compute_usd: float, traffic: RunTraffic | None, vm: Place, bucket: Place | None, rates: Rates | None = None
) -> RunBill:
    """The run's bill; compute alone when the checkpoint's size or the bucket's place is unknown
    (`traffic` or `bucket` None: a local bucket, or a task without `skygreen.model`)."""
    if traffic is None or bucket is None:
        return RunBill(compute=compute_usd)
    rates = rates or load_rates()
    return RunBill(
        compute=compute_usd,
        transfer=transfer_of(traffic, vm=vm, bucket=bucket, rates=rates),
        storage=storage_usd(bucket.cloud, traffic.gb_months, rates),
        requests=requests_usd(bucket.cloud, writes=traffic.writes, reads=traffic.reads, rates=rates),
    )
