"""Every random number generator a training rank draws from, as checkpointable state.

Exact resume needs the streams of python's `random`, numpy's global generator, torch's CPU
generator and every CUDA device generator to continue where they were. Checkpoints are loaded
with `torch.load(weights_only=True)`, so the states are stored as tensors and plain lists,
never as pickled objects.
"""

from __future__ import annotations

import random
from typing import Any

import torch

np: Any
try:
    import numpy as np
except ImportError:  # numpy is optional for a training script
    np = None


def capture() -> dict[str, Any]:
    """This process's RNG states, in a form `torch.load(weights_only=True)` accepts."""
    version, mt_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss_next": gauss_next},
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's own device
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back the states `capture` returned (in this or another process)."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    torch.set_rng_state(state["torch"])
    if np is not None and "numpy" in state:
        st = state["numpy"]
        keys = st["keys"].numpy().astype(np.uint32)
        np.random.set_state((st["kind"], keys, st["pos"], st["has_gauss"], st["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
