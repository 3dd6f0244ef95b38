"""skygreen: cheap, green cloud GPU training on top of SkyPilot.

The laptop side (`skygreen.api`, the `skygreen` command) plans, renders and launches; the
container side (`skygreen.runtime`) wraps the user's PyTorch loop:

    import skygreen.runtime as sg                                     # a loop of your own: sg.Run
    from skygreen.integrations.transformers import SkygreenCallback   # or .lightning
    from skygreen.data.shards import ShardSpec, prepare               # preprocess once, stream after
    import skygreen.power                                             # skygreen.power.cap(0.6)
    from skygreen import api                                          # the commands, from Python

Importing this package imports neither sky nor torch: the `skygreen` command starts on it,
and each of those costs about 2.3 s. Every name below but `__version__` is loaded on first
use, so `skygreen.runtime` or `skygreen.SkygreenError` work after a bare `import skygreen`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_SUBPACKAGES = ("api", "data", "integrations", "power", "runtime")
_LAZY = {"SkygreenError": "skygreen.errors"}


def __getattr__(name: str) -> Any:
    """Load a public name on first use, so that `import skygreen` stays free of torch and sky."""
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f"skygreen.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'skygreen' has no attribute {name!r}")


__all__ = ["SkygreenError", "__version__", "api", "data", "integrations", "power", "runtime"]
