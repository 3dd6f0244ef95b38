"""skygreen as a library: the functions the `skygreen` command calls, usable from Python.

Composition happens here: load what a call needs (task, catalog), hand plain records to the
pure core, return plain records. Nothing here imports sky or torch at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from typing import TYPE_CHECKING

from skygreen.spec import TaskSpec

if TYPE_CHECKING:
    from skygreen.plan import Plan


def plan(spec: TaskSpec, *, catalog_dir: Path | None = None, measured_speed: Mapping[str, float] | None = None) -> Plan:
    """Rank the GPU offers for a task, best first (a `skygreen.plan.Plan`).

    `catalog_dir`: a SkyPilot v8 catalog folder (`<cloud>/vms.csv`); None means
    `$SKYGREEN_CATALOG_DIR`, else SkyPilot's own (`~/.sky/catalogs/v8`), else the embedded
    price table. `measured_speed`: relative speeds measured by earlier runs, which replace
    the built-in table. Raises `NoOfferError` (which constraint to relax), `SpecError`
    (unknown region) or `CatalogError`.
    """
    from skygreen.catalog import load_catalog
    from skygreen.plan import make_plan

    catalog = load_catalog(catalog_dir)
    return make_plan(spec, catalog, measured_speed=measured_speed)
