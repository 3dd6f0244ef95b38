"""Where NVML is opened: the user's `cap()` block and the runtime's GPU for this rank.

The composition point of the power package, as `skygreen.api` is the laptop's: it picks the
NVML adapter (`skygreen.power.nvml`, real or simulated) and hands its devices to the pure
core (`caps`, `governor`, `meter`, `policy`), which never opens NVML itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from skygreen.errors import PowerError, PowerPermissionError
from skygreen.power.caps import PowerCaps, limits_of
from skygreen.power.nvml import Gpu, Nvml
from skygreen.power.originals import OriginalLimits
from skygreen.power.policy import CapRequest, resolve
from skygreen.power.simulated import SIMULATED_GPU_ENV

log = logging.getLogger("skygreen.power")


@contextmanager
def cap(value: str | float, *, devices: Sequence[int] | None = None, required: bool = False, nvml: Nvml | None = None) -> Iterator[PowerCaps | None]:  # fmt: skip
    """Cap the GPUs of this process while the block runs; restore them on any exit.

    For a phase that needs less power than training (evaluation, data loading): a cap outside
    the board's range is clamped into it with a warning. Without NVML or without permission it
    says so in one line and runs the block uncapped, unless `required=True`.

    Args:
        value: watts (`150`), a fraction of the default limit (`0.6`) or `off` (the block runs
            as it is).
        devices: NVML indices (default: `LOCAL_RANK`'s GPU under torchrun, else all).
        required: raise instead of running uncapped when the cap cannot be set.
        nvml: the NVML adapter (default: the real one; tests pass a simulated one).

    Yields:
        The caps set (`PowerCaps`), or None when the block runs uncapped.

    Raises:
        ValueError: `value` is `auto` (which needs training steps to profile) or not a cap.
        PowerError: with `required=True`, NVML is missing, refuses the cap, or another live
            skygreen process caps the GPU.
    """
    request = CapRequest.parse(value)
    if request.mode == "auto":
        raise ValueError("cap('auto') needs training steps to profile; use a number (watts or a fraction) here, "
                         "or the limit a run's profile chose")  # fmt: skip
    if request.mode == "off":
        yield None
        return
    caps: PowerCaps | None = None
    try:
        nvml = nvml or Nvml()
        caps = PowerCaps(originals=OriginalLimits.default())
        for gpu in _devices(nvml, devices):
            caps.adopt(gpu)
            decision = resolve(request, limits_of(gpu))
            if decision.clamp_note:
                log.warning("GPU %d: %s", gpu.index, decision.clamp_note)
            assert decision.target_w is not None
            caps.set(gpu, decision.target_w)
    except PowerError as e:
        if caps is not None:
            caps.close()
        if required:
            raise
        why = "no permission to set power limits" if isinstance(e, PowerPermissionError) else str(e).splitlines()[0]
        log.warning("power cap %s not applied (%s); running uncapped", request.describe(), why)
        caps = None
    try:
        yield caps
    finally:
        if caps is not None:
            caps.close()


def _devices(nvml: Nvml, devices: Sequence[int] | None) -> list[Gpu]:
    if devices is not None:
        return [nvml.device(i) for i in devices]
    if os.environ.get("LOCAL_RANK"):
        return [nvml.device(int(os.environ["LOCAL_RANK"]))]
    return nvml.devices()


def open_gpu(*, cuda_uuid: str | None, local_rank: int, environ: Mapping[str, str]) -> tuple[Gpu | None, str | None]:
    """This process's GPU at the NVML boundary, or (None, why not).

    `cuda_uuid`: the CUDA device's UUID (None when training on CPU). With
    `SKYGREEN_SIMULATED_GPU`, rank `local_rank` gets simulated board `local_rank`.
    """
    simulated = bool(environ.get(SIMULATED_GPU_ENV))
    if cuda_uuid is None and not simulated:
        return None, "no GPU: this run trained on CPU"
    try:
        nvml = Nvml(environ=environ)
        if simulated:
            if local_rank >= nvml.device_count():
                return (
                    None,
                    f"{SIMULATED_GPU_ENV} simulates {nvml.device_count()} GPU(s), none for local rank {local_rank}",
                )
            return nvml.device(local_rank), None
        assert cuda_uuid is not None
        uuid = cuda_uuid if cuda_uuid.startswith("GPU-") else f"GPU-{cuda_uuid}"
        return nvml.device_by_uuid(uuid), None
    except PowerError as e:
        return None, f"NVML unavailable: {str(e).splitlines()[0]}"
