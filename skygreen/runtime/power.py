"""The runtime's composition of `skygreen.power` for one rank: its GPU, synchronisation, DDP.

Each rank caps and meters its own GPU (found by the CUDA device's UUID, or simulated board
`LOCAL_RANK` under `SKYGREEN_SIMULATED_GPU`). While `auto` profiles under DDP, every rank's
reading is combined as Zeus does (energy summed, time the slowest rank's), so all ranks choose
the same limit; that needs every rank to have a GPU, which the ranks agree on at start.

`SKYGREEN_POWER_PROFILE_STEPS=WARMUP,MEASURED[,SETTLE]` sets the `auto` ladder's steps per
limit and the steps before the first one (default `skygreen.power.policy`: 1, 4 and 5).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from skygreen.errors import RuntimeSetupError
from skygreen.power.entry import open_gpu
from skygreen.power.governor import PowerGovernor
from skygreen.power.ledger import Ledger
from skygreen.power.nvml import Gpu
from skygreen.power.policy import DEFAULT_ETA, MEASURE_STEPS, SETTLE_STEPS, WARMUP_STEPS, CapRequest
from skygreen.runtime.ranks import all_reduce

if TYPE_CHECKING:
    from skygreen.runtime.run import Run

PROFILE_STEPS_ENV = "SKYGREEN_POWER_PROFILE_STEPS"


def make_governor(run: Run) -> PowerGovernor:
    """This rank's power governor: its GPU opened through NVML (none in the smoke test or where none
    is found, with the reason), the settings' cap request and eta, and the `auto` ladder's steps.

    Under DDP the ranks agree first whether every one has a GPU (a collective every rank must
    join); only then are `auto` profile readings combined across ranks. Raises
    `RuntimeSetupError` for a bad SKYGREEN_POWER_CAP or SKYGREEN_POWER_PROFILE_STEPS.
    """
    environ = run._environ
    gpu: Gpu | None
    reason: str | None
    if run.smoke:
        gpu, reason = None, "smoke test on CPU"
    else:
        uuid = str(torch.cuda.get_device_properties(run.device).uuid) if run.device.type == "cuda" else None
        gpu, reason = open_gpu(cuda_uuid=uuid, local_rank=run.local_rank, environ=environ)
    reduce = None
    if run.world_size > 1 and not run.agree_flags(gpu is None)[0]:
        reduce = _reduce
    warmup, measure, settle = _profile_steps(environ.get(PROFILE_STEPS_ENV))
    try:
        request = CapRequest.parse(run.settings.power_cap)
    except ValueError as e:
        raise RuntimeSetupError(f"SKYGREEN_POWER_CAP: {e}") from None
    return PowerGovernor(
        gpu,
        request=request,
        required=run.settings.power_required,
        eta=DEFAULT_ETA if run.settings.power_eta is None else run.settings.power_eta,
        run_id=run.settings.run_id,
        ledger=Ledger.default(environ),
        reason=reason,
        warmup_steps=warmup,
        measure_steps=measure,
        settle_steps=settle,
        sync=(lambda: torch.cuda.synchronize(run.device)) if run.device.type == "cuda" else None,
        reduce=reduce,
    )


def _reduce(energy_j: float, time_s: float) -> tuple[float, float]:
    """Zeus's combination of ranks: energy summed, time the slowest rank's."""
    (energy,) = all_reduce([energy_j], op="SUM", dtype=torch.float64)
    (elapsed,) = all_reduce([time_s], op="MAX", dtype=torch.float64)
    return float(energy), float(elapsed)


def _profile_steps(raw: str | None) -> tuple[int, int, int]:
    if not raw:
        return WARMUP_STEPS, MEASURE_STEPS, SETTLE_STEPS
    try:
        values = [int(v) for v in raw.split(",")]
        warmup, measure, settle = [*values, SETTLE_STEPS][:3] if len(values) in (2, 3) else (0, 0, 0)
        if warmup < 1 or measure < 1 or settle < 0:
            raise ValueError
    except ValueError:
        raise RuntimeSetupError(
            f"{PROFILE_STEPS_ENV}={raw!r}: expected WARMUP,MEASURED[,SETTLE], integers >= 1 (e.g. 1,4,5)"
        ) from None
    return warmup, measure, settle
