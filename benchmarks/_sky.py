"""Run a snippet under SkyPilot with a private HOME seeded from a catalog directory.

The seeded CSVs have no `.meta/*.md5` files, so SkyPilot treats them as user-made and never
downloads; HOME is set before `import sky` because SkyPilot reads the path at import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_CATALOG = REPO.parent / "shared" / "catalog" / "v8"


def seeded_home(catalog_dir: Path) -> Path:
    home = Path(tempfile.mkdtemp(prefix="skygreen-bench-home-"))
    for cloud in ("aws", "gcp", "azure"):
        target = home / ".sky" / "catalogs" / "v8" / cloud
        target.mkdir(parents=True)
        shutil.copyfile(catalog_dir / cloud / "vms.csv", target / "vms.csv")
    return home


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_", "SKYGREEN_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # users run from .pyc files: the warm-up run writes them
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local" / "share"), OMP_NUM_THREADS="1")
    return env


def run_python(code: str, home: Path, stdin: str = "") -> dict:
    """Run `code` in a fresh interpreter under `home`; it must print one JSON document last."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean_env(home),
        cwd=REPO,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])
