"""The stream tuner's levels on model links: each level's measured rate against the link's.

    .venv/bin/python benchmarks/stream_tuner.py [--against 6889f9c]

Runs `StreamTuner` from this tree, and the one at `--against` (default: the last commit that
measured a level by the wall clock since it began), through `tests/tuner_links.py`: parts kept in
flight as `download_ranged` keeps them, from 2 streams up to 8, on each model link. Prints, per
link and tuner, the streams it settles at and each level as streams, measured MB/s and that rate
over the link's true one (1.00 is exact). No servers, no network: a second to run.
"""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from skygreen.checkpoint.ranged import StreamTuner  # noqa: E402
from tuner_links import LINKS, tune_over  # noqa: E402


class WallClockTuner:
    """A tuner whose `part_started` took the clock and whose `part_done` took no start (the API
    until ba9b7df), driven through the calls `tune_over` makes: each part starts at the clock of
    the last part done, as it does in the model."""

    def __init__(self, tuner) -> None:
        self.tuner, self.now_s = tuner, 0.0

    @property
    def streams(self) -> int:
        return self.tuner.streams

    @property
    def levels(self) -> list[tuple[int, float]]:
        return self.tuner.levels

    def part_started(self) -> int:
        return self.tuner.part_started(self.now_s)

    def part_done(self, level: int, nbytes: int, *, started_s: float, now_s: float) -> None:
        self.now_s = now_s
        self.tuner.part_done(level, nbytes, now_s)


def tuner_at(commit: str) -> type:
    """`StreamTuner` as `skygreen/checkpoint/ranged.py` had it at `commit`."""
    source = subprocess.check_output(
        ["git", "-C", str(REPO), "show", f"{commit}:skygreen/checkpoint/ranged.py"], text=True
    )
    module = types.ModuleType(f"ranged_at_{commit}")
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is built
    exec(compile(source, f"{commit}:skygreen/checkpoint/ranged.py", "exec"), module.__dict__)
    return module.StreamTuner


def driven(tuner_class: type):
    """A fresh tuner from 2 to 8 streams, through the wall-clock adapter when its API is the old one."""
    tuner = tuner_class(start=2, most=8)
    return tuner if "started_s" in inspect.signature(tuner.part_done).parameters else WallClockTuner(tuner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="6889f9c", help="the commit whose StreamTuner to run beside this tree's")
    args = parser.parse_args()
    tuners = {"this tree": StreamTuner, args.against: tuner_at(args.against)}
    print(f"{'link':<14}{'tuner':<11}{'keeps':>6}  levels: streams MB/s (measured / true)")
    for name, link in LINKS.items():
        for label, tuner_class in tuners.items():
            tuner = tune_over(driven(tuner_class), link)
            levels = "  ".join(f"{n} {rate / 1e6:,.1f} ({rate / link(n):.2f})" for n, rate in tuner.levels)
            print(f"{name:<14}{label:<11}{tuner.streams:>6}  {levels}")


if __name__ == "__main__":
    main()
