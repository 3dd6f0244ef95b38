"""`power: {cap: auto}` against the simulated GPU's model: does the ladder find the optimum?

For each GPU type and eta, a `PowerGovernor` profiles its ladder on the simulated board (the
real adapter, profiler and chooser; the pynvml boundary is `skygreen.power.simulated`) over
steps of fixed host work, then keeps a limit. The model's true optimum of the same objective,
`eta x energy + (1 - eta) x max_power x time` per step, is found by a 0.1 W grid over the
board's whole range. Reported: the chosen and the optimal limit, and how far the chosen
limit's objective is above the optimum (target: within 2%).

Two clocks: `virtual` (a fake clock; the simulated board's sleeps advance it: exact) and
`wall` (real sleeps of `--host-ms` per step, the real clock, one GPU type: what the runtime
meets, with scheduler noise).

    python benchmarks/bench_power.py [--host-ms 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from skygreen.gpus import GPUS  # noqa: E402
from skygreen.power.governor import PowerGovernor  # noqa: E402
from skygreen.power.model import MIN_LIMIT_FRACTION, model_draw_fraction, model_time_ratio  # noqa: E402
from skygreen.power.nvml import Nvml  # noqa: E402
from skygreen.power.originals import OriginalLimits  # noqa: E402
from skygreen.power.policy import CapRequest, ProfilePoint, zeus_cost  # noqa: E402
from skygreen.power.simulated import SimulatedNvml  # noqa: E402

GPU_TYPES = ("V100", "A100", "H100", "L4", "T4", "A10G")
ETAS = (0.25, 0.5, 0.75)


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def model_point(gpu: str, limit_w: float, host_s: float) -> ProfilePoint:
    tdp_w = GPUS[gpu].tdp_w
    c = limit_w / tdp_w
    time_s = host_s * model_time_ratio(c)
    return ProfilePoint(limit_w=limit_w, energy_j=model_draw_fraction(c) * tdp_w * time_s, time_s=time_s)


def true_optimum(gpu: str, eta: float, host_s: float) -> tuple[float, float]:
    """(limit_w, objective) minimising the model's objective over the board's range, 0.1 W grid."""
    tdp_w = GPUS[gpu].tdp_w
    low_w = round(tdp_w * MIN_LIMIT_FRACTION)
    grid = [low_w + 0.1 * i for i in range(int((tdp_w - low_w) * 10) + 1)]
    best = min(grid, key=lambda w: (zeus_cost(model_point(gpu, w, host_s), eta=eta, max_power_w=tdp_w), -w))
    return best, zeus_cost(model_point(gpu, best, host_s), eta=eta, max_power_w=tdp_w)


def profile_once(gpu: str, eta: float, *, host_s: float, wall: bool, root: Path) -> dict:
    virtual = VirtualClock()
    clock: Any = time.monotonic if wall else virtual
    sleep = time.sleep if wall else virtual.sleep
    lib = SimulatedNvml(gpu, state_dir=root / f"sim-{gpu}-{eta}-{wall}", clock=clock, sleep=sleep)
    gov = PowerGovernor(Nvml(lib).device(0), request=CapRequest(mode="auto"), eta=eta, originals=OriginalLimits(root / "ledger"),
                        warmup_steps=1, measure_steps=10 if wall else 3, settle_steps=0, clock=clock)  # fmt: skip
    gov.start()
    steps = 0
    while gov.profile is None:
        if wall:
            time.sleep(host_s)
        else:
            virtual.now += host_s
        gov.step_done()
        steps += 1
    profile = gov.profile
    gov.close()
    tdp_w = GPUS[gpu].tdp_w
    opt_w, opt_cost = true_optimum(gpu, eta, host_s)
    chosen_cost = zeus_cost(model_point(gpu, profile.chosen_w, host_s), eta=eta, max_power_w=tdp_w)
    return {
        "gpu": gpu,
        "eta": eta,
        "clock": "wall" if wall else "virtual",
        "profiling_steps": steps,
        "chosen_w": profile.chosen_w,
        "optimum_w": round(opt_w, 1),
        "objective_gap": chosen_cost / opt_cost - 1,
        "energy_saving": profile.saving_vs_uncapped,
        "slowdown": profile.slowdown_vs_uncapped,
        "points": [
            vars(p) if hasattr(p, "__dict__") else {"limit_w": p.limit_w, "energy_j": p.energy_j, "time_s": p.time_s}
            for p in profile.points
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-ms", type=float, default=100.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    host_s = args.host_ms / 1000.0
    rows = []
    with tempfile.TemporaryDirectory(prefix="skygreen-bench-power-") as tmp:
        root = Path(tmp)
        for gpu in GPU_TYPES:
            for eta in ETAS:
                rows.append(profile_once(gpu, eta, host_s=host_s, wall=False, root=root))
        for eta in ETAS:
            rows.append(profile_once("V100", eta, host_s=host_s, wall=True, root=root))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        "| GPU | eta | clock | steps | chosen W | optimum W | objective above optimum | energy/step saved | time/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gpu']} | {r['eta']} | {r['clock']} | {r['profiling_steps']} | {r['chosen_w']:g} | {r['optimum_w']:g} | "
              f"{100 * r['objective_gap']:.2f}% | {100 * r['energy_saving']:.1f}% | {100 * r['slowdown']:+.1f}% |")  # fmt: skip
    worst = max(r["objective_gap"] for r in rows)
    print(f"\nworst objective gap: {100 * worst:.2f}% (target <= 2%)")
    v100 = next(r for r in rows if r["gpu"] == "V100" and r["eta"] == 0.5 and r["clock"] == "wall")
    base = max(v100["points"], key=lambda p: p["limit_w"])
    print("\nV100, eta 0.5, wall clock: the profiled ladder (per step, relative to the highest limit)\n")
    print("| limit W | energy | time | objective |")
    print("|---|---|---|---|")
    for p in v100["points"]:
        pt = ProfilePoint(**p)
        cost = zeus_cost(pt, eta=0.5, max_power_w=base["limit_w"]) / zeus_cost(
            ProfilePoint(**base), eta=0.5, max_power_w=base["limit_w"]
        )
        mark = " (chosen)" if p["limit_w"] == v100["chosen_w"] else ""
        print(
            f"| {p['limit_w']:g}{mark} | {p['energy_j'] / base['energy_j']:.3f} | {p['time_s'] / base['time_s']:.3f} | {cost:.3f} |"
        )


if __name__ == "__main__":
    main()
