"""A rank dies with the process that started it.

torchrun starts each worker in a session of its own, so a kill of the job's process group (what
losing a local machine, `cancel`'s last resort, or a test does) ends torchrun's agent but not its
workers: they would train on beside the run's next life and hold its GPU's memory. Linux lets a
process ask for a signal when its parent ends (`PR_SET_PDEATHSIG`); every rank asks for SIGKILL.

A single process started by a shell is left alone: its shell may end first on purpose (a wrapper
killed alone), and the local launcher finds and stops such a process by its job mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Mapping

PR_SET_PDEATHSIG = 1
"""prctl's option number (linux/prctl.h)."""


def started_as_rank(environ: Mapping[str, str]) -> bool:
    """Whether this process is one of a launcher's ranks: torchrun's (TORCHELASTIC_RUN_ID) or any
    world of more than one rank (WORLD_SIZE)."""
    try:
        several = int(environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        several = False
    return several or "TORCHELASTIC_RUN_ID" in environ


def die_with_parent(environ: Mapping[str, str], *, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent ends, if it is a rank.

    Called by the runtime as each rank opens its services. When the parent ended while the
    request was made, the signal is sent now, as it would have been. Returns whether the request was made: False off Linux, without
    libc's prctl, or for a process that is not a rank.
    """
    if not sys.platform.startswith("linux") or not started_as_rank(environ):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)  # the parent was gone already: no signal would ever come
    return True
