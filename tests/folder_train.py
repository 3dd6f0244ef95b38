"""A plain training script with no checkpointing library: it saves checkpoint folders itself,
as axolotl or a plain PyTorch loop does: `OUT/checkpoint-<step>/` with `weights.bin`, then `state.json` last.

It resumes from the newest `checkpoint-*` folder in OUT, trains `--steps` steps of a
deterministic toy model (each step's state is a pure function of the previous one), saves
every `--save-every` steps and at the end writes `OUT/final.bin`.

Test gates (never a sleep): `FOLDER_TRAIN_HOLD_AT=<step>` stops after saving that step and
waits for the file `FOLDER_TRAIN_RELEASE` to exist. On SIGTERM it saves the step it is at
(slowly, to show the wrapper waits for it) and exits 143.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

signals: list[int] = []


def on_term(signum, frame):
    signals.append(signum)


def step_state(state: bytes) -> bytes:
    return hashlib.sha256(state).digest() * 8


def save(out: Path, step: int, state: bytes, *, slow: bool = False) -> None:
    folder = out / f"checkpoint-{step}"
    (folder / "nested").mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(state)
    (folder / "nested" / "rng.txt").write_text(str(step))
    if slow:
        for _ in range(5):  # a save that takes a while after SIGTERM
            time.sleep(0.1)
    (folder / "state.json").write_text(json.dumps({"step": step}))
    print(f"saved step {step}", flush=True)


def latest(out: Path) -> tuple[int, bytes]:
    found = []
    for folder in out.glob("checkpoint-*"):
        if (folder / "state.json").exists():
            found.append((json.loads((folder / "state.json").read_text())["step"], folder))
    if not found:
        return 0, b"seed"
    step, folder = max(found)
    print(f"resumed from step {step}", flush=True)
    return step, (folder / "weights.bin").read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-every", type=int, default=2)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hold_at = int(os.environ.get("FOLDER_TRAIN_HOLD_AT", "-1"))
    release = Path(os.environ.get("FOLDER_TRAIN_RELEASE", "/nonexistent"))
    step, state = latest(out)
    while step < args.steps:
        state = step_state(state)
        step += 1
        if step % args.save_every == 0:
            save(out, step, state)
        if step == hold_at:
            while not release.exists() and not signals:
                time.sleep(0.05)
        if signals:
            save(out, step, state, slow=True)
            return 143
    (out / "final.bin").write_bytes(state)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
