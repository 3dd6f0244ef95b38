"""The runtime's composition of `skygreen.power` for one rank: its GPU, synchronisation, DDP.

Each rank caps and meters its own GPU (found by the CUDA device's UUID, or simulated board
`LOCAL_RANK` under `SKYGREEN_SIMULATED_GPU`). While `auto` profiles under DDP, every rank's
reading is combined as Zeus does (energy summed, time the slowest rank's), so all ranks choose
the same limit; that needs every rank to have a GPU, which the ranks agree on at start.

`SKYGREEN_POWER_PROFILE_STEPS=WARMUP,MEASURED[,SETTLE]` sets the `auto` ladder's steps per
limit and the steps before the first one (default `skygreen.power.policy`: 1, 4 and 5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from skygreen.errors import RuntimeSetupError
from skygreen.power.entry import open_gpu
from skygreen.power.governor import PowerGovernor
from skygreen.power.nvml import Gpu
from skygreen.power.originals import OriginalLimits
from skygreen.power.policy import DEFAULT_ETA, MEASURE_STEPS, SETTLE_STEPS, WARMUP_STEPS
from skygreen.runtime.ranks import World, all_reduce
from skygreen.task.settings import RuntimeSettings, decode

PROFILE_STEPS_ENV = "SKYGREEN_POWER_PROFILE_STEPS"


def open_governor(
    settings: RuntimeSettings,
    *,
    device: torch.device,
    world: World,
    environ: Mapping[str, str],
    smoke: bool = False,
    originals: OriginalLimits | None = None,
) -> PowerGovernor:
    """Open this rank's power governor, for the settings' cap request and eta.

    The GPU is opened through NVML (none in the smoke test or where none is found, with the
    reason, so that the run meters nothing but still trains), and the `auto` ladder's steps
    come from `SKYGREEN_POWER_PROFILE_STEPS`. Under DDP the ranks agree first whether every one
    has a GPU (a collective every rank must join); only then are `auto` profile readings
    combined across ranks.

    Args:
        settings: the run's settings (cap request, `required`, eta, run id).
        device: this rank's torch device; a CUDA device is matched to its NVML board by UUID.
        world: this process's rank, world size and local rank.
        environ: where `SKYGREEN_SIMULATED_GPU` and `SKYGREEN_POWER_PROFILE_STEPS` are read.
        smoke: the CPU smoke test: no GPU is opened.
        originals: where the GPU's original limit is recorded (default: this machine's data folder).

    Returns:
        The governor, not started: call `start()` before the first step and `close()` at the end.

    Raises:
        RuntimeSetupError: a bad SKYGREEN_POWER_PROFILE_STEPS.
    """
    gpu: Gpu | None
    reason: str | None
    if smoke:
        gpu, reason = None, "smoke test on CPU"
    else:
        uuid = str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else None
        gpu, reason = open_gpu(cuda_uuid=uuid, local_rank=world.local_rank, environ=environ)
    reduce: Callable[[float, float], tuple[float, float]] | None = None
    if world.size > 1 and not world.agree(gpu is None)[0]:
        reduce = _reduce
    warmup, measure, settle = _profile_steps(environ.get(PROFILE_STEPS_ENV))
    return PowerGovernor(
        gpu,
        request=settings.power_cap,
        required=settings.power_required,
        eta=DEFAULT_ETA if settings.power_eta is None else settings.power_eta,
        run_id=settings.run_id,
        originals=originals if originals is not None else OriginalLimits.default(environ),
        reason=reason,
        warmup_steps=warmup,
        measure_steps=measure,
        settle_steps=settle,
        sync=(lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None,
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
    values = decode(raw, tuple[int, ...], PROFILE_STEPS_ENV)
    warmup, measure, settle = [*values, SETTLE_STEPS][:3] if len(values) in (2, 3) else (0, 0, 0)
    if warmup < 1 or measure < 1 or settle < 0:
        raise RuntimeSetupError(
            f"{PROFILE_STEPS_ENV}={raw!r}: expected WARMUP,MEASURED[,SETTLE], integers >= 1 (e.g. 1,4,5)"
        )
    return warmup, measure, settle
