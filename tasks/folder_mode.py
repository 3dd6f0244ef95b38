"""A plain PyTorch loop that saves its own checkpoint folders, as most scripts outside the HF
and Lightning worlds do; the task file's `checkpoint.dir` makes them verified commits.

Every SAVE_EVERY steps it writes `out/folder-mode/step_<N>/` with `model.pt`, `optim.pt` and
`rng.pt` (torch.save), then `done.json` last: the marker the task names. At start it resumes
from the newest folder holding `done.json`. Data is synthetic (a fixed linear teacher), so the
task runs offline. SKYGREEN_TASK_SIZE=small shrinks the model; FOLDER_STEPS and
FOLDER_SAVE_EVERY override the length and the save interval.

It honours `SKYGREEN_TEST_HOLD_AT_STEPS` the way the runtime does (`skygreen.runtime.hold`), in a
few lines of its own so that it stays a script that imports nothing of skygreen: after saving a
named step it waits until the file `$SKYGREEN_TEST_HOLD_RELEASE/<step>` exists (or it is killed),
so a test that kills it mid-run knows where it is. Without the variable this does nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

OUT = Path("out/folder-mode")
SMALL = os.environ.get("SKYGREEN_TASK_SIZE", "full") == "small"
WIDTH = 16 if SMALL else 512
STEPS = int(os.environ.get("FOLDER_STEPS", "2000"))
SAVE_EVERY = int(os.environ.get("FOLDER_SAVE_EVERY", "100"))
HOLD_AT = {int(s) for s in os.environ.get("SKYGREEN_TEST_HOLD_AT_STEPS", "").split(",") if s.strip()}
RELEASE = os.environ.get("SKYGREEN_TEST_HOLD_RELEASE")


def latest() -> Path | None:
    done = [p for p in OUT.glob("step_*") if (p / "done.json").is_file()]
    return max(done, key=lambda p: int(p.name.removeprefix("step_")), default=None)


def save(step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    folder = OUT / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "model.pt")
    torch.save(optimizer.state_dict(), folder / "optim.pt")
    torch.save(torch.get_rng_state(), folder / "rng.pt")
    (folder / "done.json").write_text(json.dumps({"step": step}))


def hold(step: int) -> None:
    """Wait at `step` until its release file exists (the test's gate); SIGTERM or SIGKILL end it."""
    print(f"held at step {step} (SKYGREEN_TEST_HOLD_AT_STEPS)", flush=True)
    release = Path(RELEASE) / str(step) if RELEASE else None
    while not (release is not None and release.exists()):
        time.sleep(0.05)


def main() -> None:
    torch.manual_seed(0)
    teacher = torch.nn.Linear(WIDTH, 1)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    folder = latest()
    if folder is not None:
        model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
        optimizer.load_state_dict(torch.load(folder / "optim.pt", weights_only=True))
        torch.set_rng_state(torch.load(folder / "rng.pt", weights_only=True))
        step = json.loads((folder / "done.json").read_text())["step"]
        print(f"resumed from {folder}", flush=True)
    while step < STEPS:
        x = torch.randn(32, WIDTH)
        loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % SAVE_EVERY == 0:
            save(step, model, optimizer)
            print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step in HOLD_AT:
                hold(step)
    torch.save(model.state_dict(), OUT / "final.pt")


if __name__ == "__main__":
    main()
