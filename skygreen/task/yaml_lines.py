"""Task files read as YAML 1.2, and the line a field sits on, for error messages.

Why ruamel.yaml rather than PyYAML with its resolvers patched by hand: PyYAML implements YAML
1.1, whose implicit types differ from 1.2's in more places than booleans (`on`, `yes`, `off`
are booleans): a float needs a dot (`1e3` and `1e308` are strings), `012` is octal (10),
`1_000` and `190:20:30` are integers (sexagesimal!), and `<<` merges. Matching 1.2 by hand
means owning a regex table for int, float, bool and null and keeping it right; ruamel.yaml is
a maintained YAML 1.2 parser (1.2 is its default) that already rejects duplicate keys,
reads only true/false as booleans, and marks every node with its line. Its import costs about
what PyYAML's does (about 10 ms here; `python -X importtime`), and it is imported only when a
task file is read, never by `skygreen --help` or the training runtime (which reads settings
from the environment). SkyPilot and the renderer keep PyYAML: the YAML skygreen writes quotes
every string that YAML 1.1 would read as something else, so SkyPilot reads what we meant.

ruamel's "safe" loader gives plain dicts, lists, str, int, float and bool, as PyYAML's does;
the pure-Python parser is used so that what a file means never depends on whether ruamel's
optional C extension happens to be installed. Where ruamel goes beyond the 1.2 core schema (`1_000` is an integer, dates
are dates), the field readers reject or accept the value as they always did. Where it falls
short of the core schema, one resolver closes the gap: ruamel reads `.5e3` and `-.1e0` (a
float starting with the dot, with an unsigned exponent) as strings, so the core schema's float
pattern is added (a property test over number spellings found it).
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
