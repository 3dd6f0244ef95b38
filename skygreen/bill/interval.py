"""The checkpoint interval that minimises a run's expected total cost, bytes included.

Per hour of training, with tau the interval, C the blocking part of a save, D the dollars a save
costs besides its stall (its bytes x the transfer rate, and its requests), p the price per hour
of all nodes, lambda the preemptions per hour and R the restart:

    cost per hour = p x C / tau + D / tau + lambda x p x (tau / 2 + R)

A save's dollars act like extra stall: D / p hours. So the optimum is Daly's for the save cost
C + 3600 x D / p seconds (Young's first term: sqrt(2 (p C + D) / (lambda p)) hours). With free
bytes (D = 0) it is Daly's optimum itself, the one `skygreen.checkpoint.interval` computes for
the runtime.
"""

from __future__ import annotations

import math

from skygreen.checkpoint.interval import optimal_interval_s


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
