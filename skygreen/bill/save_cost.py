"""What one checkpoint save costs in data dollars, for `skygreen status`.

    save_usd = save GB x the transfer rate from the VM's place to the bucket's
             + (upload parts + SAVE_OVERHEAD_WRITES) x the bucket cloud's write price

The bytes are measured (the newest committed checkpoint's files, from its manifest); the rates
are the list prices of `skygreen.bill.rates`, at one save's volume (a single save pays the first
egress tier). A VM off the three clouds (a laptop, a test) uploads over the internet, which the
bucket's cloud receives for free, so only its requests cost. The plan's own figure for an offer
before any save is `checkpoint_save_usd` in `plan --json` (`skygreen.plan.data_cost.save_usd`).

Pure: places and sizes are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.bill.rates import CLOUDS, Place, Rates, load_rates, requests_usd, transfer_usd
from skygreen.bill.traffic import SAVE_OVERHEAD_WRITES, UPLOAD_PART_BYTES, parts


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveCost:
    """One save's data dollars and what they were worked from."""

    usd: float
    transfer_usd: float
    requests_usd: float
    gb: float
    """The save's size, all its files together (measured)."""
    route: str
    """`aws us-east-1 -> gcp us-central1`, or `internet -> aws us-east-1` from off the clouds."""

    def to_json(self) -> dict[str, float | str]:
        """`checkpoint_save` of `skygreen status --json`."""
        return {
            "usd": self.usd,
            "transfer_usd": self.transfer_usd,
            "requests_usd": self.requests_usd,
            "gb": self.gb,
            "route": self.route,
            "basis": "measured bytes x list rates",
        }


def save_cost(*, gb: float, files: int, vm: Place | None, bucket: Place, rates: Rates | None = None) -> SaveCost:
    """One save of `gb` in `files` files from `vm` (None: off the clouds) to `bucket`.

    Raises:
        ValueError: a negative size or no file.
    """
    if not gb >= 0 or files < 1:
        raise ValueError(f"a save has a size >= 0 and at least one file, got {gb} GB in {files}")
    rates = rates or load_rates()
    on_cloud = vm is not None and vm.cloud in CLOUDS
    moved = transfer_usd(vm, bucket, gb, rates) if on_cloud and vm is not None else 0.0
    writes = parts(gb, UPLOAD_PART_BYTES[bucket.cloud], files=files) + SAVE_OVERHEAD_WRITES
    asked = requests_usd(bucket.cloud, writes=writes, reads=0.0, rates=rates)
    src = f"{vm.cloud} {vm.region}" if on_cloud and vm is not None else "internet"
    return SaveCost(
        usd=moved + asked,
        transfer_usd=moved,
        requests_usd=asked,
        gb=gb,
        route=f"{src} -> {bucket.cloud} {bucket.region}",
    )
