"""The `skygreen` command: `commands` (the commands, thin over `skygreen.api`), `options` (the
flags they share), `costs` (cost, compare, report, power, simulate).

`main` and `app` load on first use (PEP 562), so importing `skygreen.cli.options` alone runs no
command module and no import circle passes through this file.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["app", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("skygreen.cli.commands"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
