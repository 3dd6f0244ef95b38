"""Refresh SkyPilot's price catalog through SkyPilot itself (`skygreen catalog update`).

skygreen reads the catalog CSVs directly (`skygreen.catalog`), but only SkyPilot knows where
its hosted catalog lives and how to download it safely (locks, md5 metadata, the S3 mirror on
rate limits). This adapter asks SkyPilot to download each cloud's `vms.csv` now
(`read_catalog(..., pull_frequency_hours=0)`), then copies the files into the directory the
user named if that is not SkyPilot's own.

SkyPilot's errors are mapped to `CatalogError` with `raise ... from e`. `import sky` costs
about 2.3 s, so it happens inside `update_catalog`, never at import.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from skygreen.errors import CatalogError
from skygreen.plan.catalog import CLOUDS, SCHEMA_VERSION, skypilot_catalog_dir

_FIX_OFFLINE = (
    "  fix: connect this machine to the internet and run `skygreen catalog update` again, or copy a "
    f"SkyPilot {SCHEMA_VERSION} catalog (<cloud>/vms.csv) here from a machine that has one "
    "(it lives in ~/.sky/catalogs/v8) and point --catalog or SKYGREEN_CATALOG_DIR at it"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CloudUpdate:
    """What `update_catalog` did for one cloud: where its `vms.csv` is now (the copy in
    `catalog_dir`, when it made one) and whether SkyPilot downloaded, kept or could not refresh it."""

    cloud: str
    path: Path
    status: str
    """"downloaded", "kept" (SkyPilot keeps a hand-made file and never overwrites it), or
    "stale" (the download failed; the cached file stays)."""


def update_catalog(clouds: Iterable[str] = CLOUDS, *, catalog_dir: Path | None = None) -> list[CloudUpdate]:
    """Download the current `vms.csv` of each cloud through SkyPilot; copy into `catalog_dir`."""
    sky_dir = skypilot_catalog_dir()
    results = [_update_one(cloud, sky_dir) for cloud in clouds]
    if catalog_dir is not None and Path(catalog_dir).expanduser().resolve() != sky_dir.resolve():
        results = [_copy_into(r, Path(catalog_dir).expanduser()) for r in results]
    return results


def _update_one(cloud: str, sky_dir: Path) -> CloudUpdate:
    try:
        import requests
        from sky import sky_logging
        from sky.catalog import common as sky_catalog
    except ImportError as e:  # pragma: no cover - skypilot is a core dependency
        raise CatalogError(f"SkyPilot is not installed ({e})\n  fix: pip install skypilot") from e
    filename = f"{cloud}/vms.csv"
    path = sky_dir / cloud / "vms.csv"
    md5_path = sky_dir / ".meta" / f"{filename}.md5"
    md5_before = _mtime(md5_path)
    existed = path.is_file()
    try:
        with sky_logging.silent():  # no spinner payloads on stdout; SkyPilot still logs errors
            frame = sky_catalog.read_catalog(filename, pull_frequency_hours=0)
            frame._load_df()
    except requests.exceptions.RequestException as e:
        raise CatalogError(
            f"could not download SkyPilot's {cloud} price catalog ({type(e).__name__}): no catalog at {path}\n"
            + _FIX_OFFLINE
        ) from e
    except (OSError, ValueError) as e:
        raise CatalogError(
            f"SkyPilot could not read its {cloud} catalog {path}: {e}\n  fix: delete {path} and run `skygreen catalog update`"
        ) from e
    if _mtime(md5_path) not in (None, md5_before):
        status = "downloaded"
    elif existed and not md5_path.exists():
        status = "kept"
    else:
        status = "stale"
    return CloudUpdate(cloud=cloud, path=path, status=status)


def _copy_into(result: CloudUpdate, target_dir: Path) -> CloudUpdate:
    target = target_dir / result.cloud / "vms.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".csv.tmp")
    shutil.copyfile(result.path, tmp)
    os.replace(tmp, target)  # readers never see a half-written file
    return CloudUpdate(cloud=result.cloud, path=target, status=result.status)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
