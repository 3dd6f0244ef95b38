"""Mutated task files thrown at `skygreen plan` through the real parsing path: every one ends
in a plan (exit 0) or one clear error (exit 2), never a traceback or an unexpected error.

A seeded mutator over the example tasks in `tasks/` deletes keys, gives values of the wrong
type, misspells keys and puts numbers out of range, a few hundred times; the bulk runs in this
process through the CLI's own `run_command`, a handful as real `skygreen` subprocesses. The
mutants are written as JSON (one key a line), which YAML 1.2 reads as it is, so each is exactly
the tree built.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skygreen.cli.commands import run_command
from skygreen.task.yaml_lines import read_yaml

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "tests" / "data" / "catalog" / "v8"
SEED = 34
MUTANTS = 400
SUBPROCESSES = 4

ODD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 2, 3.5, -0.5, 1e308, -1e308, 10**30, "", " ", "auto", "off", "two", "1e3",
    "36h", "-5m", "A100", "s3://", "nan", [], [None], ["A100", 3], {}, {"a": 1}, [[1]], 0.3, 1500, 65,
)  # fmt: skip
"""Values of every YAML type, edge numbers and strings that look like numbers or durations."""


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path and list index in a task tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


def _parent(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        tree = tree[part]
    return tree


def _misspelt(key: str, rng: random.Random) -> str:
    i = rng.randrange(max(len(key), 1))
    kind = rng.choice(("drop", "double", "swap", "case", "dash"))
    if kind == "drop" and len(key) > 1:
        return key[:i] + key[i + 1 :]
    if kind == "swap" and len(key) > 2:
        i = min(i, len(key) - 2)
        return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    if kind == "case":
        return key.upper()
    if kind == "dash":
        return key.replace("_", "-") if "_" in key else key + "-"
    return key[:i] + key[i] * 2 + key[i + 1 :] if key else "x"


def mutate(task: dict, rng: random.Random) -> dict:
    """One to three mutations of `task`, the `skygreen:` section most often."""
    tree = copy.deepcopy(task)
    for _ in range(rng.randint(1, 3)):
        paths = list(_paths(tree))
        green = [p for p in paths if p[0] == "skygreen"]
        path = rng.choice(green if green and rng.random() < 0.8 else paths or [("skygreen",)])
        parent = _parent(tree, path) if len(path) > 1 else tree
        key = path[-1]
        kind = rng.choice(("delete", "type", "type", "misspell", "number", "add"))
        if kind == "delete":
            del parent[key]
        elif kind == "misspell" and isinstance(key, str):
            parent[_misspelt(key, rng)] = parent.pop(key)
        elif kind == "number":
            parent[key] = rng.choice((-1, 0, -1e9, 1e9, 1e-9, 65, 1001, 0.29, 10**19, 2.5))
        elif kind == "add" and isinstance(parent, dict):
            parent[rng.choice(("gpus", "power", "every", "kep", "model", "cap", "batch", "micro", "sharding"))] = (
                rng.choice(ODD_VALUES)
            )
        else:
            parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
    return tree


def mutants(folder: Path) -> list[Path]:
    """`MUTANTS` mutated copies of the example tasks, written into `folder` beside their scripts."""
    rng = random.Random(SEED)
    tasks = [read_yaml(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "tasks").glob("*.yaml"))]
    written = []
    for i in range(MUTANTS):
        path = folder / f"mutant-{i:03d}.yaml"
        path.write_text(json.dumps(mutate(rng.choice(tasks), rng), indent=2, allow_nan=False), encoding="utf-8")
        written.append(path)
    return written


@pytest.fixture(scope="module")
def mutant_tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("fuzz") / "tasks"
    shutil.copytree(ROOT / "tasks", folder, ignore=shutil.ignore_patterns("*.yaml", "out", "__pycache__"))
    return mutants(folder)


def test_the_mutator_makes_varied_tasks(mutant_tasks: list[Path]) -> None:
    texts = {p.read_text(encoding="utf-8") for p in mutant_tasks}
    assert len(texts) > MUTANTS * 0.9


def test_plan_ends_every_mutant_with_a_plan_or_one_clear_error(
    mutant_tasks: list[Path], private_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SKYGREEN_DEBUG", raising=False)
    codes: dict[int, int] = {}
    for path in mutant_tasks:
        code = run_command(["plan", str(path), "--catalog", str(CATALOG), "--json"])
        err = capsys.readouterr().err
        assert code in (0, 2), f"{path.name} exit {code}: {err}\n{path.read_text()}"
        assert "Traceback" not in err and "unexpected" not in err, f"{path.name}: {err}\n{path.read_text()}"
        if code == 2:
            first, *details = err.splitlines()
            assert first.startswith(f"error: {path}: ") and all(d.startswith("  ") for d in details), err
            assert any(d.startswith("  fix: ") for d in details), f"{path.name}: no fix line\n{err}"
        codes[code] = codes.get(code, 0) + 1
    assert codes.get(2, 0) > MUTANTS // 2 and codes.get(0, 0) > 10, codes  # both outcomes are exercised
    print("exit codes:", codes)


def test_the_installed_command_ends_mutants_alike(mutant_tasks: list[Path], private_home: Path) -> None:
    """A few mutants through a real `skygreen` process: the exit code and no traceback on stderr."""
    for path in mutant_tasks[:SUBPROCESSES]:
        out = subprocess.run(
            [sys.executable, "-m", "skygreen.cli", "plan", str(path), "--catalog", str(CATALOG), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode in (0, 2), out.stderr
        assert "Traceback" not in out.stderr, out.stderr
