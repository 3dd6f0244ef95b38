"""What this process runs on: its rank in the world, its device, its autocast, its log lines.

Small functions the `Run` calls while it sets itself up; torch is imported here because the
device and autocast are torch objects.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from skygreen.errors import RuntimeSetupError, SkygreenError
from skygreen.runtime.precision import DeviceFacts, PrecisionChoice, choose_precision, cpu_facts, cuda_facts
from skygreen.runtime.smoke_mode import SMOKE_ACCUM_STEPS, SMOKE_MICRO_BATCH
from skygreen.task.settings import DEFAULT_PRECISION_ENV, RuntimeSettings
from skygreen.task.spec import PRECISIONS

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def end_quietly_on_skygreen_errors(environ: Mapping[str, str]) -> None:
    """Let a skygreen error that nothing catches end the script as it ends the `skygreen` command.

    A training script that lets a `RuntimeSetupError` (no run id, a bad setting) or a
    `CheckpointError` escape would otherwise print a Python traceback: the user gets the one line
    with its fix on stderr (`skygreen: ...`) and the error's exit code (2 for bad input, 1 for a
    failure), as from every `skygreen` command. Only the uncaught case changes: code that catches
    the error still gets it. Other exceptions keep the traceback, and `SKYGREEN_DEBUG=1` keeps it
    for skygreen's too. Installed once per process, by the first `Run`.

    The process ends with `os._exit`, after the exit handlers ran and the streams were flushed:
    Python gives an uncaught exception exit status 1 whatever its hook does, and the launcher, the
    smoke test and `skygreen logs --follow` read the code.

    Args:
        environ: the process environment (`SKYGREEN_DEBUG`).
    """
    if environ.get("SKYGREEN_DEBUG") == "1" or getattr(sys.excepthook, "skygreen", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        if not isinstance(error, SkygreenError):
            previous(kind, error, trace)
            return
        sys.stderr.write(f"skygreen: {type(error).__name__}: {error}\n")
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(error.exit_code)

    hook.skygreen = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def show_runtime_logs(*, verbose: bool) -> None:
    """Print skygreen's lines (resume point, checkpoint interval, commits) on stderr.

    In a container the runtime narrates the run: where it resumed, how often it checkpoints
    and why, what a preemption did. Only when the application has not configured logging
    itself; other ranks than 0 print warnings only, so a DDP run does not say everything N times.
    """
    logger = logging.getLogger("skygreen")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("skygreen: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


def device_facts(device: torch.device) -> DeviceFacts:
    """What the precision choice needs to know about `device`: a CUDA device's name and compute
    capability (the current device when it has no index), or the CPU's facts."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return cuda_facts(torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
    return cpu_facts()


def autocast_factory(device_type: str, precision: PrecisionChoice):
    """A callable with no arguments that opens the autocast context for one forward: a null context
    for fp32, else `torch.autocast` on `device_type` in bf16 or fp16.
    """
    if precision.precision == "fp32":
        return contextlib.nullcontext
    dtype = _AUTOCAST_DTYPES[precision.precision]
    return lambda: torch.autocast(device_type=device_type, dtype=dtype)


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` on `device`: tensors moved without blocking, also inside mappings (which come back as
    dicts), lists and tuples (namedtuples, as torch's default collate makes them, keep their type);
    other values as they are. On CPU the batch comes back untouched.
    """
    if device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [to_device(v, device) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)  # a namedtuple takes fields
    return batch


def pick_device(device: str | torch.device | None, *, smoke: bool, local_rank: int) -> torch.device:
    """CPU under the smoke test; else the code's device; else this rank's GPU; else CPU."""
    if smoke:
        return torch.device("cpu")
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def pick_precision(
    settings: RuntimeSettings, facts: DeviceFacts, *, code_precision: str | None, environ: Mapping[str, str]
) -> PrecisionChoice:
    """The settings' precision, where the cluster's default stands in for `auto` unless the code chose."""
    requested = settings.precision
    cluster_default = environ.get(DEFAULT_PRECISION_ENV)
    if code_precision is None and requested == "auto" and cluster_default:
        requested = cluster_default.lower()  # the cluster's choice stands in for "auto"
        if requested not in PRECISIONS:
            raise RuntimeSetupError(
                f"{DEFAULT_PRECISION_ENV}: unknown precision {cluster_default!r}\n  allowed: {', '.join(PRECISIONS)}"
            )
    return choose_precision(requested, facts)


def batch_shape(
    settings: RuntimeSettings, *, code_micro: int | str | None, world_size: int, smoke: bool
) -> tuple[int, bool, int]:
    """(effective batch, micro-batch is auto, micro-batch), checked to divide across ranks."""
    effective = settings.effective_batch
    if effective is None:
        raise RuntimeSetupError(
            "effective batch is not set\n"
            "  fix: set skygreen.batch.effective in the task file, or pass effective_batch= to Run"
        )
    if smoke:
        micro = SMOKE_MICRO_BATCH
        return micro * SMOKE_ACCUM_STEPS * world_size, False, micro
    if effective % world_size:
        raise RuntimeSetupError(
            f"effective batch {effective} does not divide across {world_size} ranks\n"
            f"  fix: use a multiple of {world_size}"
        )
    per_rank = effective // world_size
    auto = code_micro == "auto" or (code_micro is None and settings.micro_batch is None)
    if auto:
        return effective, True, per_rank
    chosen = settings.micro_batch
    assert chosen is not None  # not auto
    if per_rank % chosen:
        raise RuntimeSetupError(
            f"micro-batch {chosen} does not divide the per-rank batch {per_rank} "
            f"(effective {effective} / {world_size} ranks)\n"
            "  fix: choose a micro-batch that divides it, or micro: auto"
        )
    return effective, False, chosen
