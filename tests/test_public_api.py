"""The public API: each package's `__all__` is pinned, and every public name is documented.

"Documented" as the API reference renders it: the docstrings are parsed by griffe's Google
parser (what mkdocstrings uses), which must not warn, and every parameter of a public
function or method appears in its `Args:` section.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import skygreen

PUBLIC = {
    "skygreen": ["SkygreenError", "__version__", "api", "data", "integrations", "power", "runtime"],
    "skygreen.data": ["MANIFEST", "ShardSpec", "ShardWriter", "ShardedDataset", "open_prepared", "prepare"],
    "skygreen.data.shards": ["MANIFEST", "ShardSpec", "ShardWriter", "ShardedDataset", "open_prepared", "prepare"],
    "skygreen.power": ["DEFAULT_ETA", "CapRequest", "PowerCaps", "cap", "restore_all"],
    "skygreen.integrations": [],
    "skygreen.integrations.transformers": ["SkygreenCallback", "check_precision"],
    "skygreen.integrations.lightning": ["SkygreenCallback", "SkygreenCheckpointIO", "check_precision"],
}
"""`skygreen.runtime`'s own list is pinned in tests/test_runtime_parts.py."""

DOCUMENTED = [*PUBLIC, "skygreen.runtime", "skygreen.api"]
"""`skygreen.api` has no `__all__`: its public names are the functions it defines."""


def _module(name: str) -> Any:
    if name.endswith(".transformers"):
        pytest.importorskip("transformers")
    if name.endswith(".lightning"):
        pytest.importorskip("lightning")
    return importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_all_is_pinned_and_every_name_resolves(name):
    module = _module(name)
    assert sorted(module.__all__) == sorted(PUBLIC[name])
    for public in module.__all__:
        assert getattr(module, public) is not None, f"{name}.{public}"


def test_the_package_loads_its_names_on_first_use_without_torch_or_sky():
    probe = (
        "import sys, skygreen\n"
        "assert skygreen.SkygreenError.__module__ == 'skygreen.errors'\n"
        "assert skygreen.runtime.PREEMPTED_EXIT_CODE == 75\n"
        "from skygreen import *\n"
        "print(sorted({'torch', 'sky'} & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = skygreen.nothing


def _public_callables(module: Any) -> Iterator[tuple[str, Any]]:
    """Each public function, class, and public method (with `__init__`) defined in skygreen."""
    names = getattr(module, "__all__", None) or [
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    ]
    for public in names:
        obj = getattr(module, public)
        if inspect.ismodule(obj) or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not obj.__module__.startswith("skygreen."):
            continue
        yield f"{obj.__module__}.{obj.__qualname__}", obj
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if (attr.startswith("_") and attr != "__init__") or not inspect.isfunction(member):
                    continue
                if not member.__qualname__.startswith(f"{obj.__qualname__}."):
                    continue  # not written in the class (a Protocol's placeholder __init__)
                if attr == "__init__" and dataclasses.is_dataclass(obj):
                    continue  # generated: the class's Attributes section documents the fields
                yield f"{obj.__module__}.{member.__qualname__}", member


def _parameters(fn: Any) -> list[str]:
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in ("self", "cls"):
            continue
        prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        names.append(prefix + p.name)
    return names


class _Warnings(logging.Handler):
    """griffe's warnings while parsing: what `mkdocs build --strict` fails on."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _problems(griffe: Any, package: Any, callables: list[tuple[str, Any]]) -> list[str]:
    """Warnings from parsing each docstring in place (in its function, as mkdocstrings does),
    and parameters missing from an `Args:` section.

    As Google style allows, a constructor's arguments may be documented in the class's
    docstring instead of (or as well as) its `__init__`'s.
    """
    problems: list[str] = []
    collect = _Warnings()
    logging.getLogger("griffe").addHandler(collect)

    def parameters_in(found: Any) -> set[str]:
        sections = found.docstring.parse("google") if found.docstring else []
        return {p.name for s in sections if s.kind is griffe.DocstringSectionKind.parameters for p in s.value}

    try:
        for qualname, fn in callables:
            found = package[qualname.split(".", 1)[1]]
            is_init = qualname.endswith(".__init__")
            if found.docstring is None and not is_init:
                problems.append(f"{qualname} has no docstring")
                continue
            documented = parameters_in(found)
            if inspect.isclass(fn):
                continue
            if is_init:
                documented |= parameters_in(found.parent)
            missing = [p for p in _parameters(fn) if p not in documented and p.lstrip("*") not in documented]
            if missing:
                problems.append(f"{qualname}: parameters missing from its Args section: {missing}")
    finally:
        logging.getLogger("griffe").removeHandler(collect)
    return problems + collect.messages


@pytest.fixture(scope="module")
def griffe_package() -> tuple[Any, Any]:
    griffe = pytest.importorskip("griffe")
    return griffe, griffe.load("skygreen", resolve_aliases=False, allow_inspection=False)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_public_name_has_a_google_docstring_that_renders(name, griffe_package):
    griffe, package = griffe_package
    assert _problems(griffe, package, list(_public_callables(_module(name)))) == []


def test_the_docstring_check_catches_a_parameter_the_signature_lacks(tmp_path, monkeypatch):
    griffe = pytest.importorskip("griffe")
    (tmp_path / "wrongdoc.py").write_text(
        '"""A module."""\n\n\n'
        "def add_one(a: int, c: int) -> int:\n"
        '    """Add one.\n\n    Args:\n        a: the number.\n        b: no such parameter.\n\n'
        '    Returns:\n        `a + 1`.\n    """\n'
        "    return a + 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("wrongdoc")
    package = griffe.load("wrongdoc", search_paths=[str(tmp_path)], allow_inspection=False)
    problems = _problems(griffe, package, [("wrongdoc.add_one", module.add_one)])
    assert "wrongdoc.add_one: parameters missing from its Args section: ['c']" in problems
    assert any("'b' does not appear in the function signature" in p for p in problems), problems
