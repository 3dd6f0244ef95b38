"""The run ledger: one record per VM lifetime of a run, kept in the run's bucket.

Public read API (for cost, plans, budgets and progress watchers):

    from skygreen.ledger import read_ledger, Segment
    segments = read_ledger(store, run_id)      # store: skygreen.checkpoint.store_factory.open_store(url)
    segments[-1].step, segments[-1].samples_per_s, segments[-1].end

The core (`records`, `place`, `pricing`) is pure; `io` speaks to a `skygreen.checkpoint.store.Store`:
`read_ledger` for readers (`read_run_ledger` with the last segment at the run's newest
checkpoint, for what `cost` shows), `LedgerWriter` for the runtime's side (rank 0 writes).
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "read_ledger": "skygreen.ledger.io",
    "read_run_ledger": "skygreen.ledger.io",
    "write_segment": "skygreen.ledger.io",
    "END_REASONS": "skygreen.ledger.records",
    "LEDGER_DIR": "skygreen.ledger.records",
    "Place": "skygreen.ledger.records",
    "Segment": "skygreen.ledger.records",
}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use, so that the package's modules can import one
    another without running this file first (no import circle through the package)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'skygreen.ledger' has no attribute {name!r}")


__all__ = ["END_REASONS", "LEDGER_DIR", "Place", "Segment", "read_ledger", "read_run_ledger", "write_segment"]
