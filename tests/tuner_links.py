"""A link model for `skygreen.checkpoint.ranged.StreamTuner`, shared by its tests and
`benchmarks/stream_tuner.py`: parts kept in flight as `download_ranged` keeps them."""

from __future__ import annotations

import heapq
from collections.abc import Callable

MIB = 1024 * 1024


def tune_over(tuner, bytes_per_s_at: Callable[[int], float], *, parts: int = 200, part_bytes: int = 16 * MIB):
    """Parts through a link whose throughput at n streams is `bytes_per_s_at(n)`, kept in flight
    as `download_ranged` keeps them: as many at once as the tuner's streams, a new one started as
    soon as one lands, each taking its share of the link at the level it started at. The parts of
    a level still landing when the next begins hold their streams meanwhile."""
    now_s, started = 0.0, 0
    landing: list[tuple[float, int, float]] = []  # a heap of (lands_s, level, started_s)
    while started < parts or landing:
        while started < parts and len(landing) < tuner.streams:
            level = tuner.part_started()
            heapq.heappush(landing, (now_s + part_bytes * level / bytes_per_s_at(level), level, now_s))
            started += 1
        now_s, level, started_s = heapq.heappop(landing)
        tuner.part_done(level, part_bytes, started_s=started_s, now_s=now_s)
    return tuner


LINKS: dict[str, Callable[[int], float]] = {
    # a cloud link: each stream adds its 80 MB/s share, up to 10 Gbit/s
    "cloud-link": lambda n: min(80e6 * n, 1250e6),
    # a small host: more streams compete for its cores and only add overhead
    "small-host": lambda n: {2: 900e6, 4: 850e6, 8: 600e6}[n],
    # a link full at 300 MB/s: doubling past 4 streams wins nothing
    "full-link": lambda n: min(80e6 * n, 300e6),
    # the fault proxy of tests/faultproxy.py pacing each reply at 2 MB/s
    "paced-2-mb-s": lambda n: 2e6 * n,
}
"""Links by name: the throughput in bytes per second at n streams."""
