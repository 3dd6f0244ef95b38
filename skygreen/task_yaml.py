"""Task files read as YAML strictly: no duplicate keys, and only true/false are booleans.

SkyPilot's `Task.from_yaml_str` rejects duplicate keys too; YAML 1.1's `on`, `off`, `yes` and
`no` booleans would turn `work: {on: A100}` into a key `True` and `cap: off` into False.
Every problem is a `SpecError` naming the line and column.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from skygreen.errors import SpecError


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (as SkyPilot's `Task.from_yaml_str` does) and reads
    booleans the YAML 1.2 way: only true/false. Under YAML 1.1 `on`, `off`, `yes` and `no` are
    booleans, which would turn `work: {on: A100}` into a key `True` and `cap: off` into False.
    """


_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; construct_mapping reports it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def read_yaml(text: str) -> Any:
    """The YAML document in `text`; a syntax problem is a `SpecError` naming where it is."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(where, f"invalid YAML: {problem}", hint="fix the YAML syntax at that place") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # SafeLoader can still fail on odd scalars (timestamps out of range, deep nesting).
        raise SpecError("(file)", f"invalid YAML: {e}", hint="fix the YAML syntax") from None
