"""Public names a package loads on first use (PEP 562 module `__getattr__`).

`import skygreen` must cost neither torch nor sky (the CLI starts on it, each costs about
2.3 s), and the planner's `import skygreen.data` must load no numpy; yet each package exports
its public names at the top (`sg.Run`, `skygreen.SkygreenError`, `skygreen.data.prepare`). Each
package lists where its names live and takes its module `__getattr__` from here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_getattr(package: str, names: Mapping[str, str], *, subpackages: Sequence[str] = ()) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: a name in `names` is imported from the module it
    maps to, a name in `subpackages` is the subpackage itself, anything else is the usual
    AttributeError."""

    def __getattr__(name: str) -> Any:
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
