"""The CLI's start-up path imports neither sky nor torch (each costs about 2.3 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("sky", "torch")


def modules_after(code: str) -> set[str]:
    """Top-level module names loaded after running `code` in a fresh interpreter."""
    probe = code + "\nimport sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.strip().splitlines()[-1].split())


def test_help_imports_neither_sky_nor_torch():
    loaded = modules_after(
        "import sys\nfrom skygreen.cli import main\nsys.argv=['skygreen','--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


CORE = (
    "errors", "files", "settings", "api",
    "fields", "spec", "gpus", "plan.catalog", "plan.cost", "plan.carbon", "plan.rank",
    "launch.render", "launch.registry", "launch.launcher", "launch.runs",
    "checkpoint.manifest", "checkpoint.interval", "checkpoint.gc", "checkpoint.store",
    "runtime.precision", "runtime.early_stop",
)  # fmt: skip


def test_core_modules_import_no_outside_library():
    """The pure core and the laptop-side composition import no outside library at module level."""
    loaded = modules_after("import " + ", ".join(f"skygreen.{m}" for m in CORE))
    assert not loaded & {"sky", "torch", "boto3", "botocore", "google", "pynvml", "numpy"}


def test_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "skygreen.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "catalog" in out.stdout


def test_plan_imports_neither_sky_nor_torch(tmp_path):
    """`skygreen plan`, table and --json, over a real catalog directory: still no sky, no torch."""
    catalog = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
    task = tmp_path / "task.yaml"
    task.write_text("skygreen: {gpus: [L4, T4, A100]}\nrun: python train.py\n")
    for extra in ([], ["--json"]):
        argv = ["plan", str(task), "--catalog", str(catalog), *extra]
        loaded = modules_after(
            f"from skygreen.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit as e:\n    assert not e.code, e.code"
        )
        assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_planning_core_imports_no_outside_library():
    loaded = modules_after(
        "import skygreen.plan.catalog, skygreen.plan.rank, skygreen.plan.cost, skygreen.plan.carbon, skygreen.api"
    )
    assert not loaded & {"sky", "torch", "boto3", "google", "pynvml", "pandas", "rich"}
