"""The outside world of a run's life on this machine, handed in as one `Wiring`.

What touches the outside world (the planner over a catalog, the smoke test, stores,
launchers, the registry) is picked by the composition root `skygreen.api` and passed to
`skygreen.launch.runs` and `skygreen.launch.status` in a `Wiring`; those modules import no
adapter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skygreen.checkpoint.store import Store
from skygreen.errors import InputError
from skygreen.launch.launcher import Launcher
from skygreen.launch.registry import Registry, RunRecord
from skygreen.task.spec import TaskSpec

if TYPE_CHECKING:
    from skygreen.launch.smoke import SmokeResult
    from skygreen.plan.rank import Plan

LOCAL = "local"
CLOUD = "cloud"


@dataclass(frozen=True, kw_only=True, slots=True)
class Wiring:
    """The outside world a run's life touches, handed in by the composition root (`skygreen.api`)."""

    registry: Registry
    environ: Mapping[str, str]
    plan: Callable[[TaskSpec], Plan]
    """Ranks the offers for a task (the catalog and measured speeds are the caller's choice)."""
    smoke: Callable[[Path], SmokeResult]
    """Runs the task's CPU smoke test; raises `SmokeTestError` when it fails."""
    open_store: Callable[[str], Store]
    cloud_launcher: Callable[[], Launcher]
    local_launcher: Callable[[], Launcher]


def launcher_for(record: RunRecord, wiring: Wiring) -> Launcher:
    """The launcher a run was launched with."""
    if record.launcher == LOCAL:
        return wiring.local_launcher()
    launcher = wiring.cloud_launcher()
    if launcher.kind != record.launcher:
        raise InputError(
            f"run {record.run_id} was launched with the {record.launcher!r} launcher, but this shell selects {launcher.kind!r}\n"
            "  fix: set or unset SKYGREEN_LAUNCHER as it was when the run started"
        )
    return launcher
