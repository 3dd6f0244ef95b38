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
    "errors", "fields", "files", "spec", "settings", "gpus", "catalog", "cost", "carbon", "plan",
    "render", "checkpoint", "store", "registry", "launcher", "precision", "early_stop", "api", "runs",
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
    loaded = modules_after("import skygreen.catalog, skygreen.plan, skygreen.cost, skygreen.carbon, skygreen.api")
    assert not loaded & {"sky", "torch", "boto3", "google", "pynvml", "pandas", "rich"}
