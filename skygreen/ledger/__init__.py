"""The run ledger: one record per VM lifetime of a run, kept in the run's bucket.

Public read API (for cost, plans, budgets and progress watchers):

    from skygreen.ledger import read_ledger, read_run_ledger, Segment
    segments = read_ledger(store, run_id)      # or read_run_ledger("s3://bucket/prefix/<run_id>")
    segments[-1].step, segments[-1].samples_per_s, segments[-1].end

The core (`records`, `place`, `pricing`) is pure; `io` speaks to a `skygreen.store.Store`;
`writer` is the runtime's side (rank 0 writes).
"""

from __future__ import annotations

from skygreen.ledger.io import read_ledger, read_run_ledger, write_segment
from skygreen.ledger.records import END_REASONS, LEDGER_DIR, Place, Segment

__all__ = ["END_REASONS", "LEDGER_DIR", "Place", "Segment", "read_ledger", "read_run_ledger", "write_segment"]
