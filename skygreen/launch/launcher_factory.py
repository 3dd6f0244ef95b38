"""The launcher factory: which launcher runs a task (SkyPilot for the cloud, this machine for
`--local`, or a named one).

`skygreen.launch.launcher` is the seam (the `Launcher` protocol and job states) and imports no
launcher; this module is the one place that does. A composition helper, not core: only
`skygreen.api` (and tests) import it; `skygreen.launch.runs` receives launchers from it. A new launcher is a module beside `skypilot_launcher.py` that
implements `skygreen.launch.launcher.Launcher`, selected here (or with
`SKYGREEN_LAUNCHER=module:factory`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from skygreen.errors import InputError
from skygreen.launch.launcher import Launcher
from skygreen.launch.registry import data_dir

LAUNCHER_ENV = "SKYGREEN_LAUNCHER"
"""`module:factory` of the launcher for cloud runs; unset means SkyPilot."""


def cloud_launcher(environ: Mapping[str, str] | None = None) -> Launcher:
    """The launcher for cloud runs: SkyPilot, unless `SKYGREEN_LAUNCHER` names another."""
    target = (os.environ if environ is None else environ).get(LAUNCHER_ENV)
    if target:
        return load_launcher(target)
    from skygreen.launch.skypilot_launcher import SkyPilotLauncher

    return SkyPilotLauncher()


def load_launcher(target: str) -> Launcher:
    """Instantiate `module:factory` (e.g. `skygreen.testing:FakeLauncher`)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise InputError(
            f"{LAUNCHER_ENV}={target!r} is not of the form module:factory\n  fix: e.g. {LAUNCHER_ENV}=skygreen.testing:FakeLauncher, or unset it"
        )
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise InputError(
            f"{LAUNCHER_ENV}={target!r}: cannot load it ({e})\n  fix: name an importable module:factory, or unset it"
        ) from e
    launcher = factory()
    if not isinstance(launcher, Launcher):
        raise InputError(
            f"{LAUNCHER_ENV}={target!r} did not give a launcher (needs kind, launch, status, cancel, logs)"
        )
    return launcher


def local_launcher(environ: Mapping[str, str] | None = None) -> Launcher:
    """The launcher for `--local` runs: this machine, its jobs under the data dir."""
    from skygreen.launch.local_launcher import LocalLauncher

    return LocalLauncher(data_dir(environ) / "local-jobs")
