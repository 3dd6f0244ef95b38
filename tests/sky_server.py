"""SkyPilot's real local API server, for the tests that start it: a private HOME, a port picked
free, a seeded catalog, and a stop that waits until the port is released."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

from helpers import wait_for

SMALL_CATALOG = Path(__file__).resolve().parent / "data" / "catalog" / "v8"


def sky_env(home: Path, port: int) -> dict[str, str]:
    """The environment of a SkyPilot client whose API server lives in `home` on `port`, with no
    cloud credentials. SkyPilot's server reads its catalog to canonicalise GPU names and check
    regions; seeded (without .meta checksums) it never downloads one. Tests reach loopback only."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "SKYPILOT_", "SKYGREEN_"))
    }
    env.update(HOME=str(home), SKY_RUNTIME_DIR=str(home), SKYPILOT_API_SERVER_LOCAL_PORT=str(port),
               SKYPILOT_DISABLE_USAGE_COLLECTION="1", XDG_DATA_HOME=str(home / ".local" / "share"))  # fmt: skip
    catalogs = home / ".sky" / "catalogs" / "v8"
    shutil.copytree(SMALL_CATALOG, catalogs)
    (catalogs / "common").mkdir()
    (catalogs / "common" / "accelerators.csv").write_text(
        'AcceleratorName,Clouds\nA100,"AWS, GCP, Azure"\nL4,"AWS, GCP"\nT4,"AWS, GCP, Azure"\n'
    )
    return env


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def stopped_listening(port: int) -> bool:
    return not listening(port)


def stop_server(env: dict[str, str], port: int) -> None:
    """Stop the API server of `env`, and wait until its processes release `port`, which may take
    a moment after `api_stop` returns."""
    subprocess.run([sys.executable, "-c", "import sky; sky.api_stop()"], env=env, capture_output=True, timeout=120)
    wait_for(partial(stopped_listening, port), "the SkyPilot API server to stop listening", timeout_s=120)
