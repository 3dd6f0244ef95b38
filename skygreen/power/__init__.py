"""GPU power: NVML limits set and restored, the `auto` cap, energy metering.

    import skygreen.power
    with skygreen.power.cap(0.6):          # 60% of the default limit while evaluating
        evaluate(model)
    skygreen.power.restore_all()           # put back every limit this process changed

Modules: `nvml` (the one NVML adapter), `simulated` (a simulated GPU at the pynvml boundary),
`policy` (pure cap decisions and the Zeus-style chooser), `caps` (set/restore), `ledger` (the
originals on disk, for a restart after `kill -9`), `meter` (energy per GPU). Importing this
package loads no NVML library.
"""

from skygreen.power.caps import PowerCaps, cap, restore_all
from skygreen.power.policy import DEFAULT_ETA, CapRequest

__all__ = ["DEFAULT_ETA", "CapRequest", "PowerCaps", "cap", "restore_all"]
