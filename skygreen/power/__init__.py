"""GPU power: NVML limits set and restored, the `auto` cap, energy metering.

    import skygreen.power
    with skygreen.power.cap(0.6):          # 60% of the default limit while evaluating
        evaluate(model)
    skygreen.power.restore_all()           # put back every limit this process changed

Modules: `nvml` (the one NVML adapter), `entry` (where NVML is opened: `cap()`, the runtime's GPU), `simulated` (a simulated GPU at the pynvml boundary),
`policy` (pure cap decisions and the Zeus-style chooser), `caps` (set/restore, and the GPUs
here with skygreen's caps on them), `originals` (the originals on disk, for a restart after
`kill -9`), `meter` (energy per GPU). Importing this
package loads no NVML library.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "DEFAULT_ETA": "skygreen.power.policy",
    "CapRequest": "skygreen.power.policy",
    "PowerCaps": "skygreen.power.caps",
    "restore_all": "skygreen.power.caps",
    "cap": "skygreen.power.entry",
}


def __getattr__(name: str) -> Any:
    """Load a public name on first use, as `skygreen.runtime` does.

    So the package's modules can import one another without running this file's imports first.
    """
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'skygreen.power' has no attribute {name!r}")


__all__ = ["DEFAULT_ETA", "CapRequest", "PowerCaps", "cap", "restore_all"]
