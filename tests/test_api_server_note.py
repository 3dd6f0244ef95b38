"""`skygreen up` through the real SkyPilot client, without cloud credentials, output piped.

SkyPilot's client starts its local API server (here on a private port, in a private HOME) on
the first call that needs it. The launch then fails (no cloud enabled): skygreen says in one
line that this command started the server and how to stop it, exits 1, and writes no ANSI
colour codes into output that is not a terminal. The server is stopped afterwards.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from helpers import user_env
from servers import FAKE_AWS_ENV, free_port
from sky_server import SMALL_CATALOG, listening, sky_env, stop_server

SKYGREEN = [sys.executable, "-m", "skygreen.cli"]


def sky_env_with_a_bucket(home: Path, port: int, s3_endpoint: str) -> dict[str, str]:
    """SkyPilot's private environment, with the checkpoint bucket on moto; SkyPilot itself finds
    no AWS credentials file."""
    return {**sky_env(home, port), **FAKE_AWS_ENV, "AWS_ENDPOINT_URL_S3": s3_endpoint}


def port_taken_under_the_server(home: Path, out: subprocess.CompletedProcess) -> bool:
    """Whether SkyPilot's API server died because another process bound its port first: the
    port was only free when it was picked."""
    log = home / ".sky" / "api_server" / "server.log"
    said = out.stdout + out.stderr + (log.read_text(errors="replace") if log.exists() else "")
    return "exited unexpectedly" in said and "already in use" in said.lower()


def up_through_sky(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> tuple[subprocess.CompletedProcess, int, bool]:
    """`skygreen up` in a private HOME whose API server port is picked free, tried again on a new
    port (and a new HOME) when another process takes it before the server binds it, as
    `tests/servers.py` does for the storage servers. Returns (result, port, server started)."""
    for attempt in range(3):
        home = tmp_path / f"home-{attempt}"
        home.mkdir()
        port = free_port()
        env = sky_env_with_a_bucket(home, port, s3_endpoint)
        task = tmp_path / "task.yaml"
        task.write_text(yaml.safe_dump({"name": "demo", "skygreen": {"gpus": ["L4", "T4"], "checkpoint": {"bucket": f"s3://{s3_bucket}/runs"}},
                                        "run": "python train.py"}))  # fmt: skip
        try:
            out = subprocess.run([*SKYGREEN, "up", str(task), "--no-smoke", "--catalog", str(SMALL_CATALOG)],
                                 env=env, capture_output=True, text=True, timeout=420, cwd=tmp_path)  # fmt: skip
            started = listening(port)
        finally:
            stop_server(env, port)
        if not port_taken_under_the_server(home, out) or attempt == 2:
            return out, port, started
    raise AssertionError("unreachable")


def test_a_failed_launch_names_the_api_server_it_started_and_prints_no_colour(tmp_path, moto_server, s3_bucket):
    out, port, started = up_through_sky(tmp_path, moto_server.url, s3_bucket)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert "sky check" in out.stderr and "Traceback" not in out.stderr
    assert started, "the launch was expected to start SkyPilot's local API server"
    notes = [line for line in out.stderr.splitlines() if "sky api stop" in line]
    assert len(notes) == 1 and f"127.0.0.1:{port}" in notes[0] and "started" in notes[0], out.stderr
    assert "\x1b[" not in out.stdout + out.stderr, repr((out.stdout + out.stderr)[-1500:])


def test_a_local_runs_colours_are_dropped_when_piped(private_home, tmp_path):
    env = user_env(private_home)
    task = tmp_path / "colour.yaml"
    task.write_text("name: colour\nrun: printf '\\033[1;31mred\\033[0m and plain\\n'\n")
    out = subprocess.run(
        [*SKYGREEN, "up", str(task), "--local", "--no-smoke"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "red and plain" in out.stdout
    assert "\x1b" not in out.stdout + out.stderr
