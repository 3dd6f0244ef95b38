"""Setting power limits and putting them back, on every exit path; and listing them (`local_gpus`).

`PowerCaps` changes limits through the NVML adapter and remembers the limit each GPU had
before its first change, in memory and in `OriginalLimits` (so a later process can restore it
after a `kill -9`). `restore()` puts every changed GPU back and is safe to call twice. Every
live `PowerCaps` is known to `restore_all()`, which an `atexit` hook calls and which any code
that stops a run early (a budget stop, a signal handler) can call itself.

`cap()` is the context manager for inference and evaluation code:

    with skygreen.power.cap(0.6):      # 60% of each GPU's default limit
        evaluate(model)
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from skygreen.errors import PowerError
from skygreen.power.originals import Original, OriginalLimits
from skygreen.power.policy import Limits, needs_set

if TYPE_CHECKING:
    from skygreen.power.nvml import Gpu, Nvml

log = logging.getLogger("skygreen.power")

_LIVE: list[PowerCaps] = []
_LIVE_LOCK = threading.Lock()


def limits_of(gpu: Gpu) -> Limits:
    """The GPU's default power limit and the range it accepts, in watts, read through NVML."""
    low_w, high_w = gpu.limit_range_w()
    return Limits(default_w=gpu.default_limit_w(), min_w=low_w, max_w=high_w)


class PowerCaps:
    """The limits this process changed, and the originals to restore.

    Every instance is registered for `restore_all()` and at exit, so a limit skygreen set is
    put back on every way out of the process short of `kill -9` (for which the record on disk
    is kept).
    """

    def __init__(self, *, originals: OriginalLimits | None = None, run_id: str | None = None) -> None:
        """Start with no GPU changed.

        Args:
            originals: the record of original limits on disk, written before each first
                change; None keeps them in memory only.
            run_id: the run named in that record.
        """
        self.on_disk = originals
        self.run_id = run_id
        self._originals: dict[str, tuple[Gpu, float]] = {}
        self.active_w: dict[str, float] = {}
        """uuid -> the limit skygreen set and has not restored."""
        with _LIVE_LOCK:
            _LIVE.append(self)

    def adopt(self, gpu: Gpu) -> float | None:
        """Before touching `gpu`: undo a cap that a killed skygreen process left on it.

        Args:
            gpu: the GPU about to be capped.

        Returns:
            The original limit the record held, in watts (set again when the board still
            differed from it), or None when the record on disk has nothing of another process
            for this GPU (or there is no record).

        Raises:
            PowerError: a live skygreen process of another run caps this GPU (its limit is left
                alone), or NVML refused to read or set the limit.
        """
        if self.on_disk is None:
            return None
        left = self.on_disk.get(gpu.uuid)
        if left is None or left.pid == os.getpid():
            return None
        if left.owner_alive:
            raise PowerError(
                f"GPU {gpu.index} ({gpu.name}) is capped by another live skygreen process (pid {left.pid}, run {left.run_id}); "
                "leaving its limit alone"
            )
        current_w = gpu.power_limit_w()
        if needs_set(current_w, left.original_limit_w):
            gpu.set_power_limit_w(left.original_limit_w)
            log.warning(
                "GPU %d: restored the original power limit %g W (a killed process of run %s left it at %g W)",
                gpu.index, left.original_limit_w, left.run_id, current_w,
            )  # fmt: skip
        self.on_disk.clear(gpu.uuid)
        return left.original_limit_w

    def set(self, gpu: Gpu, target_w: float) -> bool:
        """Set `gpu` to `target_w` unless it is already there.

        The original limit is recorded (in memory and on disk) before the first change.

        Args:
            gpu: the GPU.
            target_w: the limit in watts, already inside the board's range.

        Returns:
            True when a set happened; False when the board was already at `target_w`.

        Raises:
            PowerError: NVML refused (`PowerPermissionError` without CAP_SYS_ADMIN or root).
        """
        current_w = gpu.power_limit_w()
        if not needs_set(current_w, target_w):
            if gpu.uuid in self._originals:
                self.active_w[gpu.uuid] = target_w
            return False
        if gpu.uuid not in self._originals:
            self._originals[gpu.uuid] = (gpu, current_w)
            if self.on_disk is not None:
                self.on_disk.record(
                    Original(
                        uuid=gpu.uuid, gpu=gpu.name, original_limit_w=current_w, run_id=self.run_id, pid=os.getpid()
                    )
                )
        try:
            gpu.set_power_limit_w(target_w)
        except PowerError:
            if gpu.uuid not in self.active_w:  # nothing of ours is on the board
                self._forget(gpu.uuid)
            raise
        self.active_w[gpu.uuid] = target_w
        return True

    def original_w(self, gpu: Gpu) -> float | None:
        """Return the limit `gpu` had before this `PowerCaps` first changed it, in watts.

        Args:
            gpu: the GPU.

        Returns:
            The original limit; None when this `PowerCaps` has not changed it, or has restored
            it since.
        """
        found = self._originals.get(gpu.uuid)
        return None if found is None else found[1]

    def restore(self) -> list[tuple[Gpu, float]]:
        """Put every changed GPU back to its original limit.

        A GPU NVML refuses to restore is logged and kept, to be tried again by the next call.

        Returns:
            (GPU, original limit in watts) for each GPU restored.
        """
        restored = []
        for uuid, (gpu, original_w) in list(self._originals.items()):
            try:
                if needs_set(gpu.power_limit_w(), original_w):
                    gpu.set_power_limit_w(original_w)
                restored.append((gpu, original_w))
                self._forget(uuid)
            except PowerError as e:
                log.warning("GPU %d: could not restore its power limit to %g W: %s", gpu.index, original_w, e)
        if restored:
            log.info("power limits restored: %s", ", ".join(f"GPU {g.index} {w:g} W" for g, w in restored))
        return restored

    def _forget(self, uuid: str) -> None:
        self._originals.pop(uuid, None)
        self.active_w.pop(uuid, None)
        if self.on_disk is not None:
            self.on_disk.clear(uuid)

    def close(self) -> None:
        """Restore every changed GPU and leave the set that `restore_all()` covers.

        A `PowerError` while restoring is logged, not raised; that GPU's record then stays in
        the record of original limits, if there is one, for the next start on that GPU to restore.
        """
        self.restore()
        with _LIVE_LOCK:
            if self in _LIVE:
                _LIVE.remove(self)


def restore_all() -> int:
    """Restore every power limit any live `PowerCaps` of this process changed.

    The one call for code that ends a run outside the training loop (a budget stop, a signal
    handler): idempotent, safe from any thread, and registered with `atexit`. A GPU NVML
    refuses to restore is logged, not raised.

    Returns:
        How many GPUs were restored.
    """
    with _LIVE_LOCK:
        live = list(_LIVE)
    return sum(len(caps.restore()) for caps in live)


atexit.register(restore_all)


def local_gpus(open_nvml: Callable[[], Nvml], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return `{"gpus": [...], "reason": why none (or None)}`; each GPU in watts.

    `skygreen power`'s read-only view: it sets nothing. A cap is "active" when the record of
    original limits holds the GPU's original limit (a run or `cap()` block changed it and has not
    restored it yet); "left by a killed process" when that owner is dead (the next skygreen
    start on the GPU restores it).

    Args:
        open_nvml: opens the NVML adapter (the composition root's choice).
        environ: where the simulated GPU and the record of original limits are found
            (default: `os.environ`).

    Returns:
        The GPUs, each with its limits, skygreen's cap on it and any read errors; "reason" says
        why there is none (NVML missing, no GPU).
    """
    from skygreen.power.simulated import SIMULATED_GPU_ENV

    environ = os.environ if environ is None else environ
    try:
        nvml = open_nvml()
        devices = nvml.devices()
    except PowerError as e:
        return {"gpus": [], "reason": str(e).splitlines()[0]}
    originals = OriginalLimits.default(environ)
    rows = []
    for gpu in devices:
        row: dict[str, Any] = {"index": gpu.index, "name": gpu.name, "uuid": gpu.uuid, "simulated": gpu.simulated}
        for key, read in (("power_limit_w", gpu.power_limit_w), ("default_limit_w", gpu.default_limit_w)):
            try:
                row[key] = read()
            except PowerError as e:
                row[key] = None
                row.setdefault("errors", []).append(str(e).splitlines()[0])
        try:
            row["min_limit_w"], row["max_limit_w"] = gpu.limit_range_w()
        except PowerError:
            row["min_limit_w"] = row["max_limit_w"] = None
        left = originals.get(gpu.uuid)
        row["skygreen_cap"] = None if left is None else {
            "original_limit_w": left.original_limit_w, "run_id": left.run_id, "pid": left.pid,
            "state": "active" if left.owner_alive else "left by a killed process",
        }  # fmt: skip
        rows.append(row)
    return {
        "gpus": rows,
        "reason": None if rows else "NVML sees no GPU",
        "simulated": bool(environ.get(SIMULATED_GPU_ENV)),
    }
