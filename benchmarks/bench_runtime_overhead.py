"""Per-step overhead of skygreen.runtime against the seed's hand-written loop (target: <= 2%).

Both sides train the same model (the tiny task's transformer) on the same data, on CPU in
fp32, with the same micro-batch and accumulation; the baseline is the seed article's loop
(autocast, GradScaler, `loss / accum_steps`, step every `accum_steps` micro-batches, plus
gradient clipping after unscale), the runtime side is `Run`/`Step` with checkpoints pushed
beyond the measured steps. Both trainings live side by side in one process and advance one
optimizer step at a time, alternately (who goes first alternates too), so the machine's load
hits both alike; each step is timed on its own, and for the runtime that includes its
boundary work. Reported: the median of the per-step ratios runtime / baseline, the ratio of
the medians and of the totals.

    .venv/bin/python benchmarks/bench_runtime_overhead.py [--steps 400] [--warmup 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tasks"))
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import tiny  # noqa: E402
from skygreen.runtime.run import Run  # noqa: E402
from skygreen.task.settings import RuntimeSettings  # noqa: E402

MICRO = 8
ACCUM = 4
EFFECTIVE = MICRO * ACCUM


def build():
    torch.manual_seed(0)
    model = tiny.TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return model, optimizer, tiny.Sequences(tiny.make_sequences(tiny.TRAIN_SEQUENCES, seed=1))


def seed_steps():
    """The seed recipe's loop, same structure, on CPU (autocast and scaler disabled in fp32).

    A generator: one optimizer step per `next()`.
    """
    model, optimizer, data = build()
    loader = torch.utils.data.DataLoader(
        data, batch_size=MICRO, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    while True:
        for i, (x, y) in enumerate(loader):
            with torch.autocast("cpu", enabled=False):
                loss = tiny.lm_loss(model(x), y)
                loss = loss / ACCUM
            scaler.scale(loss).backward()
            if (i + 1) % ACCUM == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                yield


def runtime_steps(bucket: str, total_steps: int):
    """The same training through `Run`/`Step`; one optimizer step (and its boundary work) per `next()`."""
    model, optimizer, data = build()
    settings = RuntimeSettings(
        run_id="bench",
        bucket=bucket,
        precision="fp32",
        effective_batch=EFFECTIVE,
        micro_batch=MICRO,
        checkpoint_every_steps=10**9,
    )
    run = Run(model=model, optimizer=optimizer, dataset=data, settings=settings, environ={})
    with run:
        for step in run.steps(total_steps):
            with step:
                for x, y in step.micro_batches():
                    with step.autocast():
                        loss = tiny.lm_loss(run.model(x), y)
                    step.backward(loss)
                step.clip_grad_norm_(1.0)
                step.optimizer_step()
            yield


def timed(steps) -> float:
    started = time.perf_counter()
    next(steps)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="timed optimizer steps per side")
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    seed_s, runtime_s, ratios = [], [], []
    with tempfile.TemporaryDirectory(prefix="skygreen-bench-") as bucket:
        # +1: the runtime's boundary work after the last timed step runs inside its next() call
        seed, runtime = seed_steps(), runtime_steps(bucket, args.warmup + args.steps + 1)
        for _ in range(args.warmup):
            next(seed)
            next(runtime)
        for i in range(args.steps):
            if i % 2 == 0:  # alternate who goes first, so drift in machine load hits both
                a, b = timed(seed), timed(runtime)
            else:
                b, a = timed(runtime), timed(seed)
            seed_s.append(a)
            runtime_s.append(b)
            ratios.append(b / a)
        runtime.close()
    result = {
        "benchmark": "runtime per-step overhead vs the seed loop (CPU, fp32, no checkpoint in the timed steps)",
        "micro_batch": MICRO,
        "accum_steps": ACCUM,
        "timed_steps_per_side": args.steps,
        "torch_threads": torch.get_num_threads(),
        "seed_ms_per_step_median": round(statistics.median(seed_s) * 1000, 3),
        "runtime_ms_per_step_median": round(statistics.median(runtime_s) * 1000, 3),
        "ratio_of_medians": round(statistics.median(runtime_s) / statistics.median(seed_s), 4),
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_of_totals": round(sum(runtime_s) / sum(seed_s), 4),
        "overhead_pct_median": round((statistics.median(ratios) - 1) * 100, 2),
        "target": "ratio_median <= 1.02",
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
