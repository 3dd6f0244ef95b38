"""The CLI's start-up path imports neither sky nor torch (each costs about 2.3 s)."""

from __future__ import annotations

import ast
import os
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
    "errors", "files", "task.settings", "api",
    "task.readers", "task.spec", "gpus", "plan.catalog", "plan.cost", "plan.carbon", "plan.rank",
    "launch.render", "launch.registry", "launch.launcher", "launch.runs",
    "checkpoint.keep", "checkpoint.manifest", "checkpoint.interval", "checkpoint.gc", "checkpoint.store",
    "runtime.precision", "runtime.early_stop", "deadline.status", "places.journey",
)  # fmt: skip


def test_core_modules_import_no_outside_library():
    """The pure core and the laptop-side composition import no outside library at module level."""
    loaded = modules_after("import " + ", ".join(f"skygreen.{m}" for m in CORE))
    assert not loaded & {"sky", "torch", "boto3", "botocore", "google", "azure", "pynvml", "numpy"}


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


OFF_THE_PLAN_PATH = (
    "skygreen.costs.costing", "skygreen.ledger.pricing", "skygreen.ledger.records", "skygreen.launch.registry",
    "skygreen.checkpoint.store", "skygreen.task.settings", "secrets", "rich", "urllib.request",
)  # fmt: skip
"""What `skygreen plan` has no use for: pricing ledgers, run records, buckets, runtime settings,
an HTTP client (about 20 ms; an Azure bucket's lookup imports it when it asks), and rich (the plan draws its tables itself, as rich would: tests/test_plan_report.py)."""


def test_plan_imports_no_pricing_registry_or_store(tmp_path):
    """The plan reads the speeds earlier runs measured without the cost or registry modules
    (they cost it a third of its start-up), and a task without `envs:` skips the settings."""
    catalog = Path(__file__).resolve().parent / "data" / "catalog" / "v8"
    task = tmp_path / "task.yaml"
    task.write_text("skygreen: {gpus: [L4, T4, A100]}\nrun: python train.py\n")
    probe = (
        f"from skygreen.cli import main\ntry:\n    main(['plan', {str(task)!r}, '--catalog', {str(catalog)!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\nimport sys\n"
        f"print('loaded:', *(m for m in {OFF_THE_PLAN_PATH!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)}
    )
    assert out.returncode == 0, out.stderr
    assert "Best" in out.stdout  # the plan ran
    loaded = out.stdout.splitlines()[-1]
    assert loaded == "loaded:", loaded


def test_planning_core_imports_no_outside_library():
    loaded = modules_after(
        "import skygreen.plan.catalog, skygreen.plan.rank, skygreen.plan.cost, skygreen.plan.carbon, skygreen.api"
    )
    assert not loaded & {"sky", "torch", "boto3", "google", "pynvml", "pandas", "rich"}


# -- the import graph: no circles, composition only at the edges -----------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "skygreen"

ADAPTERS = {
    # adapter: the skygreen modules it may import (the seam it implements, errors, small helpers)
    "skygreen.checkpoint.s3_store": {"skygreen.checkpoint.store", "skygreen.checkpoint.cloud_store", "skygreen.errors"},
    "skygreen.checkpoint.gcs_store": {
        "skygreen.checkpoint.store",
        "skygreen.checkpoint.cloud_store",
        "skygreen.errors",
    },
    "skygreen.checkpoint.azure_store": {
        "skygreen.checkpoint.store",
        "skygreen.checkpoint.cloud_store",
        "skygreen.errors",
    },
    "skygreen.checkpoint.local_store": {"skygreen.checkpoint.store", "skygreen.errors", "skygreen.files"},
    "skygreen.launch.skypilot_launcher": {"skygreen.launch.launcher", "skygreen.errors"},
    "skygreen.launch.local_launcher": {"skygreen.launch.launcher", "skygreen.errors", "skygreen.task.settings"},
    "skygreen.plan.catalog_update": {"skygreen.plan.catalog", "skygreen.errors"},
    "skygreen.power.nvml": {"skygreen.errors", "skygreen.power.simulated"},  # the stand-in library
}
FACTORIES = {"skygreen.checkpoint.store_factory", "skygreen.launch.launcher_factory"}
"""Pick an adapter by URL scheme or setting; only composition roots use them."""
ROOTS = (
    "skygreen.api", "skygreen.cli", "skygreen.testing", "skygreen.runtime", "skygreen.power.entry",
    "skygreen.data.shards", "skygreen.folder_mode", "skygreen.integrations",
)  # fmt: skip
"""The laptop's composition root (`api`, with `cli` over it), the container's (`runtime`, and for
trainers that own their loop `integrations` and the folder mode's entry point), where
NVML is opened for `skygreen.power.cap()` and a run's GPU (`power.entry`), where a task's script
opens the bucket for its prepared data (`data.shards.prepare`), and the fakes."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(path: Path, known: set[str], *, type_checking: bool = False) -> set[str]:
    """skygreen modules `path` imports anywhere (function-local ones too); those under
    `if TYPE_CHECKING:` only with `type_checking`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if type_checking else {
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block)
        for stmt in block.body for n in ast.walk(stmt)}  # fmt: skip
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from skygreen.plan import carbon` imports a module
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
    modules: set[str] = set()
    for name in found:
        if not name.startswith("skygreen"):
            continue
        # importing a.b.c runs the packages a and a.b first
        parts = name.split(".")
        modules.update(".".join(parts[: i + 1]) for i in range(1, len(parts)) if ".".join(parts[: i + 1]) in known)
    return modules


def import_graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, known, type_checking=type_checking) - {module_name(p)} for p in paths}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in `graph` (its modules, the first repeated at the end), or None."""
    try:
        _assert_no_circle(graph)
    except AssertionError as e:
        return str(e).removeprefix("import circle: ").split(" -> ")
    return None


def test_the_circle_finder_finds_a_circle_through_a_type_checking_import(tmp_path):
    """The check below can fail: two modules that name each other only for the type checker."""
    (tmp_path / "a.py").write_text("import skygreen.b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import skygreen.a\n")
    known = {"skygreen.a", "skygreen.b"}
    graph = {f"skygreen.{n}": imported_modules(tmp_path / f"{n}.py", known, type_checking=True) - {f"skygreen.{n}"}
             for n in ("a", "b")}  # fmt: skip
    assert find_circle(graph) == ["skygreen.a", "skygreen.b", "skygreen.a"]
    without = {f"skygreen.{n}": imported_modules(tmp_path / f"{n}.py", known) - {f"skygreen.{n}"} for n in ("a", "b")}
    assert find_circle(without) is None


TYPE_ONLY_EDGES_TO_CUT: set[tuple[str, str]] = set()
"""Type-only imports still closing a circle, outside the runtime; each one listed must still
exist (the test below fails once it is gone, so the list only shrinks)."""


def test_no_import_circle_counting_function_local_and_type_checking_imports():
    graph = import_graph(type_checking=True)
    for source, target in TYPE_ONLY_EDGES_TO_CUT:
        assert target in graph[source], f"{source} no longer imports {target}: drop it from the list"
        graph[source] = graph[source] - {target}
    _assert_no_circle(graph)


def _assert_no_circle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_core_imports_no_adapter_and_adapters_import_only_their_seam():
    graph = import_graph()
    assert set(ADAPTERS) | FACTORIES <= set(graph), "the lists above name modules that exist"
    for module, imports in graph.items():
        root = module.startswith(ROOTS) or module in FACTORIES
        if module in ADAPTERS:
            extra = imports - ADAPTERS[module] - {"skygreen"} - {p for p in imports if graph.get(p) == set()}
            assert not extra, f"adapter {module} imports {sorted(extra)}: adapters import only their seam"
        elif not root:
            reached = imports & (set(ADAPTERS) | FACTORIES)
            assert not reached, f"core module {module} imports {sorted(reached)}: pass a store or launcher in"


CLI = ("skygreen.cli", "skygreen.cli.commands", "skygreen.cli.options", "skygreen.cli.costs")
PRINTERS = (
    "skygreen.plan.report", "skygreen.launch.report", "skygreen.costs.report", "skygreen.deadline.report",
    "skygreen.power.report", "skygreen.demo_view", "skygreen.places.simulate",
)  # fmt: skip


def test_the_cli_only_parses_calls_the_api_and_prints():
    graph = import_graph()
    allowed = {"skygreen", "skygreen.api", "skygreen.errors", "skygreen.exit_codes", "skygreen.terminal", *CLI}
    allowed |= {*PRINTERS, *{p.rsplit(".", 1)[0] for p in PRINTERS}}
    for module in CLI:
        assert graph[module] <= allowed, f"{module} imports {sorted(graph[module] - allowed)}"


def test_log_lines_carry_one_prefix():
    """The runtime's log formatter adds `skygreen: `; a message that starts with it prints it twice."""
    doubled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"debug", "info", "warning", "error", "exception"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).startswith("skygreen:")
            ):
                doubled.append(f"{path.name}:{node.lineno}")
    assert not doubled, doubled


MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines():
    """A module that outgrows one screenful of responsibilities is split, not scrolled."""
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long
