"""The generated parts of the reference pages, filled in when the site builds (`hooks:` in mkdocs.yml).

A page asks for a generated part with a marker line, replaced by `on_page_markdown` before
the page is converted:

- `<!-- generated: task-fields -->`: every key of the task file, from `skygreen.task.reference`;
- `<!-- generated: owned-resources -->`: the `resources:` keys skygreen sets itself, from
  `skygreen.task.checks.OWNED_RESOURCE_KEYS`;
- `<!-- generated: exit-codes -->`: every exit code and its meaning, from `skygreen.exit_codes`;
- `<!-- generated: api MODULE -->`: one mkdocstrings block per name in `MODULE.__all__`, each
  pointing at the module that defines it, so names a package loads lazily (`skygreen.runtime`,
  `skygreen.power`) are documented as well as those it imports.

The code is the only source: a page cannot list a field, a code or a name the code does not
have, and a field without a description stops the build.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from typing import Any

MARKER = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([\w.]+))? -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs event: replace each marker line of a page with what it asks for."""
    return expand(markdown)


def expand(markdown: str) -> str:
    """`markdown` with every marker replaced.

    Raises:
        ValueError: a marker names no generator, or its generator found a gap in the code's own
            definitions (a field without a description, a public name that does not resolve).
    """

    def replace(match: re.Match[str]) -> str:
        kind, argument = match.group(1), match.group(2)
        generator = GENERATORS.get(kind)
        if generator is None:
            raise ValueError(f"unknown marker {match.group(0)!r}; known: {', '.join(GENERATORS)}")
        return generator(argument)

    return MARKER.sub(replace, markdown)


# ---------------------------------------------------------------- task file


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def task_fields_markdown(fields: Iterable[Any] | None = None) -> str:
    """One table per mapping of the task file: key, type, default, allowed values, meaning.

    Raises:
        ValueError: a field has no description, or no default to show.
    """
    from skygreen.task.records import SKYPILOT_TASK_KEYS
    from skygreen.task.reference import TASK_FIELDS, default_text

    fields = TASK_FIELDS if fields is None else tuple(fields)
    sections: dict[str, list[Any]] = {}
    for field in fields:
        if not str(field.doc).strip():
            raise ValueError(f"task file field {field.path} has no description")
        sections.setdefault(field.section, []).append(field)
    parts = []
    for section, members in sections.items():
        title = "Top-level keys" if not section else f"`{section}`"
        parts.append(f"## {title}\n")
        parts.append("| key | type | default | allowed | meaning |")
        parts.append("|---|---|---|---|---|")
        for field in members:
            row = (
                f"`{field.key}`",
                _cell(field.type),
                _cell(default_text(field)),
                _cell(field.allowed),
                _cell(field.doc),
            )
            parts.append("| " + " | ".join(row) + " |")
        parts.append("")
        if not section:
            listed = {field.key for field in members}
            others = [f"`{key}`" for key in SKYPILOT_TASK_KEYS if key not in listed]
            parts.append(f"SkyPilot's other task keys go to SkyPilot as written: {', '.join(others)}.\n")
    return "\n".join(parts)


def owned_resources_markdown(_: str | None = None) -> str:
    """The `resources:` keys skygreen chooses from the plan, and the field to set instead."""
    from skygreen.task.checks import OWNED_RESOURCE_KEYS

    rows = [f"| `resources.{key}` | {_cell(owner)} |" for key, owner in OWNED_RESOURCE_KEYS.items()]
    return "\n".join(["| refused key | set instead |", "|---|---|", *rows, ""])


# ---------------------------------------------------------------- exit codes


def exit_codes_markdown(_: str | None = None) -> str:
    """Every exit code constant of `skygreen.exit_codes` with its meaning, lowest first.

    Raises:
        ValueError: a code has no entry in `MEANINGS`, or `MEANINGS` has a code no constant names.
    """
    from skygreen import exit_codes

    constants = {
        name: value
        for name, value in vars(exit_codes).items()
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool)
    }
    codes = set(constants.values())
    missing = sorted(codes - set(exit_codes.MEANINGS))
    if missing:
        raise ValueError(f"exit codes without a meaning in skygreen.exit_codes.MEANINGS: {missing}")
    stray = sorted(set(exit_codes.MEANINGS) - codes)
    if stray:
        raise ValueError(f"skygreen.exit_codes.MEANINGS describes codes no constant names: {stray}")
    rows = []
    for code in sorted(codes):
        names = ", ".join(f"`{name}`" for name, value in constants.items() if value == code)
        rows.append(f"| {code} | {_cell(exit_codes.MEANINGS[code])} | {names} |")
    return "\n".join(["| code | meaning | constant |", "|---|---|---|", *rows, ""])


# ---------------------------------------------------------------- API


def public_targets(module_name: str) -> list[tuple[str, str]]:
    """(name, where mkdocstrings finds it) for each name in the module's `__all__`.

    A name the module loads lazily (its `_LAZY` table) points at the module that defines it,
    which griffe reads without running anything; any other name at the module itself, where
    griffe follows the import.

    Raises:
        ValueError: the module has no `__all__`, or a name in it does not resolve.
    """
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        raise ValueError(f"{module_name} has no __all__: say which names are public")
    lazy = getattr(module, "_LAZY", {})
    targets = []
    for name in names:
        if not hasattr(module, name):
            raise ValueError(f"{module_name}.__all__ names {name!r}, which the module does not have")
        targets.append((name, f"{lazy[name]}.{name}" if name in lazy else f"{module_name}.{name}"))
    return targets


def api_markdown(module_name: str | None) -> str:
    """The module's docstring, then each public name as its own mkdocstrings block."""
    if not module_name:
        raise ValueError("the api marker needs a module: <!-- generated: api skygreen.runtime -->")
    module = importlib.import_module(module_name)
    if getattr(module, "__all__", None) is None:  # no public list yet: the module and what griffe sees
        return f"::: {module_name}\n    options:\n      heading_level: 2\n"
    blocks = [f"::: {module_name}\n    options:\n      members: false\n      heading_level: 2\n"]
    for _, target in public_targets(module_name):
        blocks.append(f"::: {target}\n    options:\n      show_root_full_path: false\n      heading_level: 3\n")
    return "\n".join(blocks)


GENERATORS: dict[str, Callable[[str | None], str]] = {
    "task-fields": lambda _: task_fields_markdown(),
    "owned-resources": owned_resources_markdown,
    "exit-codes": exit_codes_markdown,
    "api": api_markdown,
}
