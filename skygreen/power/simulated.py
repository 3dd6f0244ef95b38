"""A simulated NVIDIA GPU at the pynvml boundary, for laptops, tests and the demo.

`SKYGREEN_SIMULATED_GPU=V100` (any name in `skygreen.gpus`; `V100:2` for two) makes
`skygreen.power.nvml.Nvml` load this module's `SimulatedNvml` instead of `pynvml`. Training
still runs on the CPU, untouched (bit-identical to a run without it); only what NVML reports
and accepts is simulated, and everything that comes from it says `simulated`.

The device, like a real data-centre board:
- default and max power limit = the board's TDP, min = 40% of it (real boards: A100 25%,
  H100 29%, V100-SXM2 50%, L4 56%); limits in whole milliwatts, a value outside the range is
  NVML_ERROR_INVALID_ARGUMENT; the caller may set limits (unless the fault `no-permission`).
- limits and the total-energy counter live in `<data dir>/simulated-gpu/<NAME>-<i>.json`, so
  a later process sees what a killed one left (a real GPU keeps its limit until reset).
- the counter (millijoules) only grows: it integrates the modelled draw over the wall time a
  process has the device open (a simulated GPU is "busy" while it is open).

The power and speed model is `skygreen.power.model` (the planner uses the same one, calibrated
to the V100 study: -13.7% energy and +6.8% time at 0.6 of the default limit). The slowdown is made real: `skygreenSimSynchronize` (what `Gpu.synchronize` calls at a
step boundary) sleeps the extra time the capped board would have needed for the host work done
since the last call.

Faults for tests (`SKYGREEN_SIMULATED_GPU_FAULTS=a,b` or `faults=`): `no-permission` (setting a
limit fails as in a container without CAP_SYS_ADMIN), `no-energy-counter` (pre-Volta, many
vGPUs), `no-library` (nvmlInit fails: no driver), `gpu-lost` (every device call fails).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skygreen.gpus import GPU_NAMES, GPUS, canonical_gpu_name
from skygreen.locks import exclusive_lock
from skygreen.power.model import MIN_LIMIT_FRACTION, model_draw_fraction, model_time_ratio

SIMULATED_GPU_ENV = "SKYGREEN_SIMULATED_GPU"
FAULTS_ENV = "SKYGREEN_SIMULATED_GPU_FAULTS"
FAULTS = ("no-permission", "no-energy-counter", "no-library", "gpu-lost")


class NVMLError(Exception):
    """Raised like pynvml's: `.value` holds the NVML return code."""

    def __init__(self, value: int, message: str) -> None:
        super().__init__(message)
        self.value = value


_ERROR_NAMES = {
    1: "Uninitialized",
    2: "InvalidArgument",
    3: "NotSupported",
    4: "NoPermission",
    12: "LibraryNotFound",
    15: "GpuIsLost",
}


def _error(value: int, message: str) -> NVMLError:
    cls = type(f"NVMLError_{_ERROR_NAMES.get(value, 'Unknown')}", (NVMLError,), {})
    return cls(value, message)


@dataclass(kw_only=True)
class _Handle:
    index: int
    opened_s: float
    accrued_to_s: float
    synced_to_s: float


class SimulatedNvml:
    """The subset of pynvml skygreen calls, for `count` simulated `gpu` boards."""

    SIMULATED = True

    def __init__(self, gpu: str, *, count: int = 1, state_dir: str | os.PathLike[str], faults: tuple[str, ...] = (),
                 sleep: Any = time.sleep, clock: Any = time.monotonic) -> None:  # fmt: skip
        name = canonical_gpu_name(gpu)
        if name is None:
            raise ValueError(f"{SIMULATED_GPU_ENV}: unknown GPU {gpu!r}; known: {', '.join(GPU_NAMES)}")
        unknown = set(faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"{FAULTS_ENV}: unknown fault(s) {sorted(unknown)}; known: {', '.join(FAULTS)}")
        self.gpu = name
        self.count = count
        self.state_dir = Path(state_dir)
        self.faults = tuple(faults)
        self.tdp_mw = int(GPUS[name].tdp_w * 1000)
        self.min_mw = round(GPUS[name].tdp_w * MIN_LIMIT_FRACTION) * 1000
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        """Every call made, in order: (function name, arguments without the handle)."""
        self._sleep = sleep
        self._clock = clock
        self._init_count = 0
        """nvmlInit calls not yet matched by nvmlShutdown: NVML counts them and stays usable until
        the last shutdown, then every call but nvmlInit raises code 1 (uninitialised)."""

    # -- library --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        """Initialise the library; before it (and after the matching `nvmlShutdown`) every other
        call raises code 1 (uninitialised), as NVML does.

        Raises `NVMLError` code 12 (library not found) under the `no-library` fault. The call
        is recorded in `calls`.
        """
        self.calls.append(("nvmlInit", ()))
        if "no-library" in self.faults:
            raise _error(12, "NVML Shared Library Not Found")
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        """Undo one `nvmlInit`; after the last, the library is uninitialised again. Code 1 when
        it is not initialised. The call is recorded in `calls`."""
        self.calls.append(("nvmlShutdown", ()))
        self._require_init()
        self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        """How many simulated boards there are (`count`)."""
        self._require_init()
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        """A new handle on board `index`; the board counts as busy, drawing energy, from now.

        Raises `NVMLError` code 2 (invalid argument) for an index out of range.
        """
        self._require_init()
        if not 0 <= index < self.count:
            raise _error(2, f"Invalid Argument: no simulated GPU {index}")
        now = self._clock()
        return _Handle(index=index, opened_s=now, accrued_to_s=now, synced_to_s=now)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        """A new handle on the board with this UUID; code 2 (invalid argument) when none has it."""
        self._require_init()
        for i in range(self.count):
            if self._uuid(i) == uuid:
                return self.nvmlDeviceGetHandleByIndex(i)
        raise _error(2, f"Invalid Argument: no simulated GPU {uuid}")

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        """The board's index."""
        self._require_init()
        return handle.index

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        """`<GPU name> (simulated)`; answers under the `gpu-lost` fault too, as a driver's cached identity does."""
        self._check(handle, identity=True)
        return f"{self.gpu} (simulated)"

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        """`GPU-simulated-<gpu name, lower case>-<index>`; answers under the `gpu-lost` fault too."""
        self._check(handle, identity=True)
        return self._uuid(handle.index)

    def _uuid(self, index: int) -> str:
        return f"GPU-simulated-{self.gpu.lower()}-{index}"

    # -- power limits ---------------------------------------------------------------------

    def nvmlDeviceGetPowerManagementLimit(self, handle: _Handle) -> int:
        """The board's limit now, in milliwatts, as any process left it; the TDP until one is set."""
        self._check(handle)
        return self._read(handle.index)["power_limit_mw"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:
        """The board's TDP, in milliwatts."""
        self._check(handle)
        return self.tdp_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: _Handle) -> list[int]:
        """[min, max] limit in milliwatts: 40% of the TDP in whole watts, and the TDP."""
        self._check(handle)
        return [self.min_mw, self.tdp_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: _Handle, limit_mw: int) -> None:
        """Set the board's limit, in whole milliwatts, in its state file for every process to see.

        Every attempt is recorded in `calls`; a set that succeeds also in the state file's
        `set_calls`, after the energy this handle drew at the old limit is booked. Raises
        `NVMLError` code 4 (no permission) under the `no-permission` fault, code 2 (invalid
        argument) for a value that is not an int or is outside the range.
        """
        self.calls.append(("nvmlDeviceSetPowerManagementLimit", (handle.index, limit_mw)))
        self._check(handle)
        if "no-permission" in self.faults:
            raise _error(4, "Insufficient Permissions")
        if not isinstance(limit_mw, int) or not self.min_mw <= limit_mw <= self.tdp_mw:
            raise _error(2, "Invalid Argument")
        with self._state(handle.index) as state:
            self._accrue(handle, state)
            state["power_limit_mw"] = limit_mw
            state["set_calls"].append(limit_mw)

    # -- power and energy -----------------------------------------------------------------

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        """The board's energy counter in millijoules, after booking this handle's draw up to now.

        The counter is shared by every process that opened the board and only grows. Raises
        `NVMLError` code 3 (not supported) under the `no-energy-counter` fault.
        """
        self._check(handle)
        if "no-energy-counter" in self.faults:
            raise _error(3, "Not Supported")
        with self._state(handle.index) as state:
            self._accrue(handle, state)
            return int(state["energy_mj"])

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        """The modelled draw at the board's current limit, in milliwatts (steady while the limit is)."""
        self._check(handle)
        limit_mw = self._read(handle.index)["power_limit_mw"]
        return int(model_draw_fraction(limit_mw / self.tdp_mw) * self.tdp_mw)

    def skygreenSimSynchronize(self, handle: _Handle) -> None:
        """Sleep the extra time a board at its current limit needs for the host work since the last call."""
        now = self._clock()
        ratio = model_time_ratio(self._read(handle.index)["power_limit_mw"] / self.tdp_mw)
        extra_s = (now - handle.synced_to_s) * (ratio - 1.0)
        if extra_s > 0:
            self._sleep(extra_s)
        handle.synced_to_s = self._clock()

    # -- state ----------------------------------------------------------------------------

    def _require_init(self) -> None:
        if self._init_count <= 0:
            raise _error(1, "Uninitialized")

    def _check(self, handle: _Handle, *, identity: bool = False) -> None:
        """Identity (name, UUID) is cached by the driver and answers even for a lost GPU."""
        self._require_init()
        if "gpu-lost" in self.faults and not identity:
            raise _error(15, "GPU is lost")

    def _accrue(self, handle: _Handle, state: dict[str, Any]) -> None:
        now = self._clock()
        draw_mw = model_draw_fraction(state["power_limit_mw"] / self.tdp_mw) * self.tdp_mw
        state["energy_mj"] += max(now - handle.accrued_to_s, 0.0) * draw_mw
        handle.accrued_to_s = now

    def state_path(self, index: int) -> Path:
        """The JSON file of board `index`: its limit, its energy counter and every limit set on it."""
        return self.state_dir / f"{self.gpu}-{index}.json"

    def _read(self, index: int) -> dict[str, Any]:
        try:
            return json.loads(self.state_path(index).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"power_limit_mw": self.tdp_mw, "energy_mj": 0.0, "set_calls": []}

    @contextmanager
    def _state(self, index: int):
        """Read-modify-write of one board's file under an exclusive lock (ranks share boards)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.state_dir / f"{self.gpu}-{index}.lock"):
            state = self._read(index)
            yield state
            # A rename is atomic for other processes and survives kill -9; no fsync: a simulated
            # board need not survive the machine, and fsync would add disk latency to every read.
            tmp = self.state_path(index).with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state), encoding="utf-8")
            os.replace(tmp, self.state_path(index))

    def set_calls_w(self, index: int = 0) -> list[float]:
        """Every limit set on board `index`, by any process, in watts (for tests)."""
        return [mw / 1000.0 for mw in self._read(index)["set_calls"]]


def parse_env(value: str) -> tuple[str, int]:
    """`V100` or `V100:2` -> (name, count)."""
    name, _, count = value.partition(":")
    try:
        number = int(count) if count else 1
    except ValueError:
        raise ValueError(f"{SIMULATED_GPU_ENV}={value!r}: the count after ':' must be a number") from None
    return name.strip(), max(number, 1)


def state_dir(environ: Mapping[str, str]) -> Path:
    """Where the simulated boards' state files live: `<data dir>/simulated-gpu`."""
    from skygreen.launch.registry import data_dir

    return data_dir(environ) / "simulated-gpu"


def library(environ: Mapping[str, str] | None = None) -> SimulatedNvml:
    """The simulated library `SKYGREEN_SIMULATED_GPU` asks for (see the module docstring)."""
    environ = os.environ if environ is None else environ
    name, count = parse_env(environ[SIMULATED_GPU_ENV])
    from skygreen.task.settings import decode

    faults = decode(environ.get(FAULTS_ENV, ""), tuple[str, ...], FAULTS_ENV)
    return SimulatedNvml(name, count=count, state_dir=state_dir(environ), faults=faults)
