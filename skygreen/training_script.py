"""What a training script does with skygreen, read from its syntax tree, never from its words.

A task need not say which trainer owns its loop: a script that imports
`skygreen.integrations.transformers` trains through an HF `Trainer`, one that imports
`skygreen.integrations.lightning` through Lightning, one that calls `skygreen.runtime.Run` through
the runtime. Reading the text instead ("skygreen" appears, "effective_batch" does not) refused
HF scripts that never build a `Run`, and would pass a script that names skygreen in a comment.
Anything the tree does not settle (no import, both integrations, `Run(**kwargs)`) is unclear,
and left to the smoke test, which runs the script.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

INTEGRATION_TRAINERS: dict[str, str] = {
    "skygreen.integrations.transformers": "transformers",
    "skygreen.integrations.lightning": "lightning",
}
"""The integration modules, and the `trainer:` each import means."""

RUN_NAMES = frozenset({"skygreen.runtime.Run", "skygreen.runtime.run.Run"})
"""Where the runtime's `Run` can be imported from."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScriptUse:
    """What a script shows of its trainer, as far as its syntax tree settles it."""

    trainer: str | None = None
    """`transformers`, `lightning` (it imports that callback), `runtime` (it calls `Run`), or None: unclear."""
    run_without_batch: bool = False
    """It calls `Run(...)`, and no call passes `effective_batch=` (nor `**kwargs` that might)."""


def read_script_use(source: str) -> ScriptUse:
    """Read a script's imports and `Run(...)` calls.

    Args:
        source: the script's text.

    Returns:
        The trainer it uses and whether its `Run` lacks a batch; `ScriptUse()` (unclear) for
        a script that does not parse.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ScriptUse()
    aliases, modules = _imports(tree)
    trainers = {INTEGRATION_TRAINERS[m] for m in modules if m in INTEGRATION_TRAINERS}
    runs = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and _resolve(node.func, aliases) in RUN_NAMES]
    without_batch = bool(runs) and all(not _may_pass(call, "effective_batch") for call in runs)
    if len(trainers) == 1 and not runs:
        return ScriptUse(trainer=trainers.pop())
    if runs and not trainers:
        return ScriptUse(trainer="runtime", run_without_batch=without_batch)
    return ScriptUse()


def _imports(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """The names imports bind (name -> dotted path) and every module or member imported."""
    aliases: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for item in node.names:
                modules.add(item.name)
                if item.asname:
                    aliases[item.asname] = item.name
                else:
                    top = item.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            for item in node.names:
                full = f"{node.module}.{item.name}"
                modules.add(full)
                aliases[item.asname or item.name] = full
    return aliases, modules


def _resolve(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """The dotted path a called name stands for (`sg.Run` -> `skygreen.runtime.Run`); None if not a name."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name) or func.id not in aliases:
        return None
    return ".".join([aliases[func.id], *reversed(parts)])


def _may_pass(call: ast.Call, keyword: str) -> bool:
    """Whether the call passes `keyword=`, or `**mapping` that might hold it."""
    return any(kw.arg in (keyword, None) for kw in call.keywords)
