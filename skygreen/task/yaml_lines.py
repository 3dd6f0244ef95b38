"""Task files read as YAML 1.2, and the line a field sits on, for error messages.

Why ruamel.yaml and not PyYAML: PyYAML speaks YAML 1.1, whose implicit types differ from 1.2's
in more than booleans (`on`, `yes`): `1e3` is a string, `012` is octal, `190:20:30` an integer
(sexagesimal) and `<<` merges. Matching 1.2 by hand means owning a regex table and keeping it
right; ruamel is a maintained 1.2 parser that rejects duplicate keys and marks every node with
its line, for about PyYAML's import time (10 ms), paid only when a task file is read. SkyPilot
and the renderer keep PyYAML: the YAML skygreen writes quotes every string 1.1 would misread.

The pure-Python loader is used, so a file's meaning never depends on ruamel's optional C
extension. One resolver closes a gap with the core schema: ruamel reads `.5e3` (a float starting
with the dot, unsigned exponent) as a string, so the core float pattern is added (a property
test over number spellings found it).
"""

from __future__ import annotations

import re
from typing import Any

from skygreen.errors import SpecError

# YAML 1.2.2, 10.3.2 (core schema): the float pattern, besides .inf and .nan.
_CORE_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_DUPLICATE = re.compile(r'found duplicate key "(.*)" with value')


def _yaml():
    from ruamel.yaml import YAML
    from ruamel.yaml.resolver import implicit_resolvers

    yaml = YAML(typ="safe", pure=True)
    # ruamel fills a version's table lazily, only when it is still empty: fill it first, as it
    # would, then append the core float pattern (tried after ruamel's own int and float).
    for versions, tag, regexp, first in implicit_resolvers:
        if (1, 2) in versions:
            yaml.resolver.add_version_implicit_resolver((1, 2), tag, regexp, first)
    yaml.resolver.add_version_implicit_resolver((1, 2), "tag:yaml.org,2002:float", _CORE_FLOAT, list("-+.0123456789"))
    return yaml


def read_yaml(text: str) -> Any:
    """Parse one YAML 1.2 document; any syntax problem is a `SpecError` with its line and column."""
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        return _yaml().load(text)
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        problem = e.problem or e.context or str(e)
        duplicate = _DUPLICATE.search(problem)
        if duplicate:
            problem = f"duplicate key {duplicate.group(1)!r}"
            hint = "remove one of them: a second value would silently replace the first"
        else:
            hint = "fix the YAML syntax at that place"
        raise SpecError(where, f"invalid YAML: {problem}", hint=hint) from None
    except (YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:
        # Odd scalars can still fail while being built (a timestamp out of range, deep nesting).
        raise SpecError("(file)", f"invalid YAML: {e}", hint="fix the YAML syntax") from None


def line_of(text: str, field: str) -> int | None:
    """The 1-based line of `field` (a path such as `skygreen.gpus[0]`) in `text`: the line of
    its value, or of the deepest part of the path that exists. None when nothing matches."""
    try:
        node = _yaml().compose(text)
    except Exception:
        return None
    line = None
    for key, index in _PATH_PART.findall(field):
        node = _child(node, key, index)
        if node is None:
            break
        line = node.start_mark.line + 1
    return line


def _child(node: Any, key: str, index: str) -> Any:
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    if index and isinstance(node, SequenceNode):
        items = node.value
        return items[int(index)] if int(index) < len(items) else None
    if key and isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            if str(key_node.value) == key or str(key_node.value).lower() == key.lower():
                return value_node
    return None
