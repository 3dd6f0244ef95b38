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

from skygreen.lazy_names import lazy_getattr

__version__ = "0.1.0"

_SUBPACKAGES = ("api", "data", "integrations", "power", "runtime")
_LAZY = {"SkygreenError": "skygreen.errors"}


__getattr__ = lazy_getattr(__name__, _LAZY, subpackages=_SUBPACKAGES)


__all__ = ["SkygreenError", "__version__", "api", "data", "integrations", "power", "runtime"]
