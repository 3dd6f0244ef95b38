"""Shared test fixtures.

`../shared/` (beside the checkout) holds a real SkyPilot price catalog and real spot traces.
Tests that need them use the fixtures below, which skip with a reason when the folder is
absent (a fresh clone elsewhere); the rest of the suite covers the same code with small
fixtures of its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import leftovers
from servers import (  # noqa: F401  (real S3/GCS/Azure test servers)
    azure_bucket,
    azurite_server,
    gcs_bucket,
    gcs_server,
    moto_server,
    s3_bucket,
)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# Tests share two cores with each other; one intra-op thread keeps torch runs predictable.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_catalog_dir() -> Path:
    """The real v8 catalog snapshot (`../shared/catalog/v8`), or skip."""
    path = SHARED / "catalog" / "v8"
    if not (path / "aws" / "vms.csv").exists():
        pytest.skip(f"real catalog snapshot not found at {path} (only present beside the main checkout)")
    return path


@pytest.fixture(scope="session")
def shared_traces_dir() -> Path:
    """The real spot availability and preemption traces (`../shared/spot-traces`), or skip."""
    path = SHARED / "spot-traces"
    if not (path / "README.md").exists():
        pytest.skip(f"spot traces not found at {path} (only present beside the main checkout)")
    return path


@pytest.fixture
def private_home(tmp_path, monkeypatch) -> Path:
    """A private HOME and XDG data dir, so no test touches the real ~/.sky or ~/.local."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    return home


@pytest.fixture(scope="session")
def sky(tmp_path_factory):
    """SkyPilot, imported with a private HOME (its catalog and config paths are read at
    import time), so no test reads or writes the real ~/.sky."""
    home = tmp_path_factory.mktemp("skyhome")
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        import sky as sky_module
    finally:
        if saved is not None:
            os.environ["HOME"] = saved
    return sky_module


def pytest_configure(config) -> None:
    leftovers.mark_session(os.environ)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist's workers are started with COLUMNS=80 and LINES=24; the commands the tests run
        # must see the environment a plain run gives them (no terminal, no width), as in CI.
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run when a process a test started is still alive (`tests/leftovers.py`)."""
    found = leftovers.leftovers(os.environ[leftovers.SESSION_MARK_ENV])
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["", "processes started by tests were still alive at the end (killed now):", *found]
        if reporter is not None:
            for line in lines:
                reporter.write_line(line, red=True)
