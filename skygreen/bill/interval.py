"""The checkpoint interval that minimises a run's expected total cost, bytes included.

Per hour of training, with tau the interval, C the blocking part of a save, D the dollars a save
costs besides its stall (its bytes x the transfer rate, and its requests), p the price per hour
of all nodes, lambda the preemptions per hour and R the restart:

    cost per hour = p x C / tau + D / tau + lambda x p x (tau / 2 + R)

A save's dollars act like extra stall: D / p hours. So the optimum is Daly's for the save cost
C + 3600 x D / p seconds (Young's first term: sqrt(2 (p C + D) / (lambda p)) hours). With free
bytes (D = 0) it is Daly's optimum itself, the one `skygreen.checkpoint.interval` computes.

`auto_interval_s` is the one rule the plan (`skygreen.plan.cost`) and the runtime
(`skygreen.checkpoint.interval.IntervalPolicy`, through `SaveBill`) both take for `every: auto`:
the dollar-optimal interval, held by `DOLLAR_LOSS_CAP`, never shorter than Daly's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skygreen.bill.rates import Place, usd_per_gb
from skygreen.bill.traffic import HOURS_PER_MONTH
from skygreen.checkpoint.interval import optimal_interval_s

DOLLAR_LOSS_CAP = 0.5
"""The dollar-optimal interval is held where preemptions cost at most this fraction of the
run's time: past it the first-order model the optimum rests on (Young, Daly) no longer holds."""


def dollar_stall_s(save_usd: float, price_usd_per_hour: float) -> float:
    """A save's dollars as seconds of the run's time at its price: what it weighs against lost work."""
    if save_usd < 0 or not price_usd_per_hour > 0:
        raise ValueError(f"need save_usd >= 0 and price_usd_per_hour > 0, got {save_usd}, {price_usd_per_hour}")
    return 3600.0 * save_usd / price_usd_per_hour


def dollar_optimal_interval_s(*, stall_s: float, save_usd: float, price_usd_per_hour: float, mtbf_s: float) -> float:
    """The interval of least expected total cost (module docstring); infinite without preemptions.

    Args:
        stall_s: the blocking part of one save, in seconds.
        save_usd: what one save costs in transfer and requests.
        price_usd_per_hour: the price of every node of the run together.
        mtbf_s: mean time between preemptions, in seconds.
    """
    if math.isinf(mtbf_s):
        return math.inf
    return optimal_interval_s(stall_s + dollar_stall_s(save_usd, price_usd_per_hour), mtbf_s)


def auto_interval_s(
    *, stall_s: float, save_usd: float, price_usd_per_hour: float | None, mtbf_s: float, restart_s: float
) -> float:
    """`every: auto`'s interval: Daly's optimum for `stall_s` when a save costs no dollars or the
    price is unknown; else the dollar-optimal interval, held where preemptions (`restart_s` plus
    half an interval each) cost at most `DOLLAR_LOSS_CAP` of the time, and never below Daly's."""
    daly_s = optimal_interval_s(stall_s, mtbf_s)
    if save_usd <= 0 or not price_usd_per_hour:
        return daly_s
    interval_s = dollar_optimal_interval_s(
        stall_s=stall_s, save_usd=save_usd, price_usd_per_hour=price_usd_per_hour, mtbf_s=mtbf_s
    )
    cap_s = 2.0 * (DOLLAR_LOSS_CAP * mtbf_s - restart_s)
    return max(min(interval_s, cap_s), daly_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class SaveBill:
    """What a running job's saves cost in dollars: where its VM and its bucket are, and its price.

    The runtime's counterpart of the plan's `save_usd` (`skygreen.plan.data_cost`), for bytes it
    measured: a save's bytes x the rate between the two places. Requests (a few cents per
    thousand) are left out, so a bucket in the VM's region keeps Daly's optimum exactly. Tiers
    are monthly, so the rate is the average over a month of saves at Daly's interval.
    """

    vm: Place
    bucket: Place
    price_usd_per_hour: float
    """Every node of the run together."""
    restart_s: float
    """What a preemption costs besides the lost work (provisioning; the restore comes on top)."""

    def save_usd(self, save_bytes: int, *, daly_s: float) -> float:
        """One save's transfer dollars at the rate a month of saves every `daly_s` pays."""
        gb = save_bytes / 1e9
        if gb <= 0:
            return 0.0
        month_gb = gb * HOURS_PER_MONTH * 3600.0 / max(daly_s, 1.0)
        return gb * usd_per_gb(self.vm, self.bucket, month_gb)

    def describe(self) -> str:
        """Where the bytes go and the price, for the log: `azure/westus3 -> aws/us-east-1 at $8.19/h`."""
        return (
            f"{self.vm.cloud}/{self.vm.region} -> {self.bucket.cloud}/{self.bucket.region} "
            f"at ${self.price_usd_per_hour:.4g}/h"
        )

    def interval_s(self, *, stall_s: float, save_bytes: int, mtbf_s: float, restore_s: float = 0.0) -> float:
        """`auto_interval_s` for a save that blocked `stall_s` and moved `save_bytes`; a restore
        of `restore_s` adds to the restart."""
        usd = self.save_usd(save_bytes, daly_s=optimal_interval_s(stall_s, mtbf_s))
        return auto_interval_s(
            stall_s=stall_s,
            save_usd=usd,
            price_usd_per_hour=self.price_usd_per_hour,
            mtbf_s=mtbf_s,
            restart_s=self.restart_s + restore_s,
        )
