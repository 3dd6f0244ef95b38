"""Reading SkyPilot's v8 catalog: every rule of SkyPilot's pricing, and every price cross-checked
against SkyPilot's own `sky.catalog` functions on the same files."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skygreen.errors import CatalogError, InputError
from skygreen.gpus import GPUS
from skygreen.plan.catalog import (
    ENV_CATALOG_DIR,
    Offer,
    embedded_catalog_date,
    load_catalog,
    load_embedded_catalog,
    read_vms_csv,
    resolve_catalog_dir,
    skypilot_catalog_dir,
)

TESTS = Path(__file__).resolve().parent
FIXTURE_CATALOG = TESTS / "data" / "catalog" / "v8"


def offer(catalog, cloud, region, instance_type) -> Offer:
    found = [o for o in catalog.offers if (o.cloud, o.region, o.instance_type) == (cloud, region, instance_type)]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def fixture_catalog():
    return load_catalog(FIXTURE_CATALOG, env={})


# ---------------------------------------------------------------- AWS and Azure rules


def test_aws_spot_is_the_cheapest_zone_and_blank_spot_prices_are_skipped(fixture_catalog):
    g6 = offer(fixture_catalog, "aws", "us-east-1", "g6.xlarge")
    assert g6.on_demand_price_usd_per_hour == 0.8048
    assert (g6.spot_price_usd_per_hour, g6.spot_zone) == (0.29, "use1-az2")


def test_aws_region_with_only_blank_spot_prices_has_no_spot_offer(fixture_catalog):
    p3 = offer(fixture_catalog, "aws", "us-west-2", "p3.2xlarge")
    assert p3.spot_price_usd_per_hour is None and p3.spot_zone is None
    assert p3.on_demand_price_usd_per_hour == 3.06


def test_spot_price_above_on_demand_is_kept_as_listed(fixture_catalog):
    g5 = offer(fixture_catalog, "aws", "us-east-1", "g5.xlarge")
    assert g5.spot_price_usd_per_hour == 1.2 > g5.on_demand_price_usd_per_hour


def test_cpu_rows_unknown_accelerators_and_fractional_gpus_make_no_offer(fixture_catalog):
    types = {o.instance_type for o in fixture_catalog.offers}
    assert "m6i.large" not in types and "inf2.xlarge" not in types
    assert "Standard_NV6ads_A10_v5" not in types and "Standard_D8s_v5" not in types
    assert all(o.accelerator in GPUS for o in fixture_catalog.offers)


def test_regions_include_rows_that_make_no_offer(fixture_catalog):
    assert "ap-south-1" in fixture_catalog.regions["aws"]  # a CPU-only region
    assert "asia-east1" in fixture_catalog.regions["gcp"]


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_regions_are_every_value_of_the_region_column(fixture_catalog, cloud):
    with (FIXTURE_CATALOG / cloud / "vms.csv").open() as f:
        expected = {row["Region"] for row in csv.DictReader(f)}
    assert set(fixture_catalog.regions[cloud]) == expected


def test_azure_has_no_zones_and_keeps_spot_equal_to_on_demand(fixture_catalog):
    h100 = offer(fixture_catalog, "azure", "eastus", "Standard_NC40ads_H100_v5")
    assert h100.spot_price_usd_per_hour == h100.on_demand_price_usd_per_hour == 6.98
    assert h100.spot_zone is None and h100.on_demand_zone is None


# ---------------------------------------------------------------- GCP host pairing


def test_gcp_price_is_host_plus_gpu_of_the_same_zone(fixture_catalog):
    a2 = offer(fixture_catalog, "gcp", "us-central1", "a2-highgpu-1g")
    assert a2.on_demand_price_usd_per_hour == pytest.approx(0.73948 + 2.93391, abs=1e-12)
    # Zone b: 0.30 + 1.5 = 1.80 beats zone a: 0.36975 + 1.4341 = 1.80385. Summing the two
    # cheapest rows across zones (0.30 + 1.4341) would be a price no launch pays.
    assert a2.spot_price_usd_per_hour == pytest.approx(1.80, abs=1e-12)
    assert a2.spot_zone == "us-central1-b"


def test_gcp_l4_takes_the_cheapest_g2_host(fixture_catalog):
    g2 = offer(fixture_catalog, "gcp", "us-central1", "g2-standard-4")
    assert g2.on_demand_price_usd_per_hour == pytest.approx(0.14 + 0.56, abs=1e-12)


def test_gcp_n1_host_needs_enough_vcpus_and_memory(fixture_catalog):
    # T4x1 needs 4 vCPUs and 16 GiB: n1-standard-4 has 15 GiB, so n1-standard-8.
    assert offer(fixture_catalog, "gcp", "us-central1", "n1-standard-8").accelerator == "T4"
    # V100x1 needs 8 vCPUs and 32 GiB: n1-standard-8 has 30 GiB, so n1-highmem-8.
    v100 = offer(fixture_catalog, "gcp", "us-central1", "n1-highmem-8")
    assert v100.accelerator == "V100"
    assert v100.on_demand_price_usd_per_hour == pytest.approx(0.47 + 2.48, abs=1e-12)


def test_gcp_gpu_without_a_host_in_its_zone_or_for_its_count_is_dropped(fixture_catalog):
    gcp = [o for o in fixture_catalog.offers if o.cloud == "gcp"]
    assert not [o for o in gcp if o.region == "europe-west4"]  # host only in another zone
    assert not [o for o in gcp if o.accelerator == "A100" and o.accelerator_count == 2]  # no a2-highgpu-2g row


# ---------------------------------------------------------------- where the catalog lives


def test_directory_resolution_order(tmp_path):
    env = {ENV_CATALOG_DIR: str(tmp_path / "env"), "HOME": str(tmp_path / "home")}
    assert resolve_catalog_dir(tmp_path / "flag", env) == (tmp_path / "flag", True)
    assert resolve_catalog_dir(None, env) == (tmp_path / "env", True)
    assert resolve_catalog_dir(None, {"HOME": str(tmp_path / "home")}) == (tmp_path / "home/.sky/catalogs/v8", False)


def test_sky_runtime_dir_wins_over_home_like_skypilot(tmp_path):
    env = {"HOME": str(tmp_path / "home"), "SKY_RUNTIME_DIR": str(tmp_path / "rt")}
    assert skypilot_catalog_dir(env) == tmp_path / "rt/.sky/catalogs/v8"


def test_default_location_is_read_when_present(tmp_path):
    target = tmp_path / "home" / ".sky" / "catalogs" / "v8"
    shutil.copytree(FIXTURE_CATALOG, target)
    catalog = load_catalog(None, env={"HOME": str(tmp_path / "home")})
    assert not catalog.embedded and catalog.source == str(target)
    assert len(catalog.offers) == len(load_catalog(FIXTURE_CATALOG, env={}).offers)


def test_no_catalog_anywhere_falls_back_to_the_embedded_table_with_a_notice(tmp_path):
    catalog = load_catalog(None, env={"HOME": str(tmp_path)})
    assert catalog.embedded and catalog.offers
    assert len(catalog.notices) == 1 and "embedded" in catalog.notices[0] and "catalog update" in catalog.notices[0]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_named_directory_that_is_missing_is_an_input_error_with_the_fix(tmp_path, how):
    missing = tmp_path / "nope"
    with pytest.raises(InputError) as info:
        if how == "flag":
            load_catalog(missing, env={})
        else:
            load_catalog(None, env={ENV_CATALOG_DIR: str(missing)})
    message = str(info.value)
    assert str(missing) in message and "does not exist" in message and "fix:" in message
    assert ("--catalog" if how == "flag" else ENV_CATALOG_DIR) in message


def test_directory_with_some_clouds_reads_them_and_names_the_rest(tmp_path):
    shutil.copytree(FIXTURE_CATALOG / "aws", tmp_path / "aws")
    catalog = load_catalog(tmp_path, env={})
    assert {o.cloud for o in catalog.offers} == {"aws"}
    assert "gcp, azure" in catalog.notices[0]


def test_a_file_that_is_not_a_catalog_is_a_catalog_error(tmp_path):
    (tmp_path / "aws").mkdir()
    (tmp_path / "aws" / "vms.csv").write_text("hello,world\n1,2\n")
    with pytest.raises(CatalogError, match="not a SkyPilot v8 catalog"):
        read_vms_csv(tmp_path / "aws" / "vms.csv", "aws")


def test_embedded_table_is_dated_and_valid():
    assert embedded_catalog_date() == "2026-11"
    catalog = load_embedded_catalog()
    assert {o.cloud for o in catalog.offers} == {"aws", "gcp", "azure"}
    assert all(o.accelerator in GPUS for o in catalog.offers)
    assert "2026-11" in catalog.source


def test_real_snapshot_reads_every_cloud(shared_catalog_dir):
    catalog = load_catalog(shared_catalog_dir, env={})
    clouds = {o.cloud for o in catalog.offers}
    assert clouds == {"aws", "gcp", "azure"}
    assert any(o.spot_price_usd_per_hour is None for o in catalog.offers if o.cloud == "aws")


# ---------------------------------------------------------------- SkyPilot cross-check


def sky_prices(catalog_dir: Path, offers: list[Offer], tmp_path: Path) -> dict:
    """SkyPilot's prices for `offers`, from `sky.catalog` over the same CSVs, in a subprocess
    with a private HOME seeded without .meta md5 files (so SkyPilot never downloads)."""
    home = tmp_path / "skyhome"
    for cloud in ("aws", "gcp", "azure"):
        target = home / ".sky" / "catalogs" / "v8" / cloud
        target.mkdir(parents=True)
        shutil.copyfile(catalog_dir / cloud / "vms.csv", target / "vms.csv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKY_", "SKYPILOT_"))}
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / ".local" / "share"))
    payload = [
        {
            "key": i,
            "cloud": o.cloud,
            "region": o.region,
            "instance_type": o.instance_type,
            "accelerator": o.accelerator,
            "accelerator_count": o.accelerator_count,
            "on_demand_zone": o.on_demand_zone,
            "spot_zone": o.spot_zone,
        }
        for i, o in enumerate(offers)
    ]
    out = subprocess.run(
        [sys.executable, str(TESTS / "sky_prices.py")],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (home / ".sky" / "catalogs" / "v8" / ".meta" / "aws" / "vms.csv.md5").exists(), "SkyPilot downloaded"
    return json.loads(out.stdout)


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


def check_against_skypilot(catalog_dir: Path, tmp_path: Path) -> int:
    catalog = load_catalog(catalog_dir, env={})
    result = sky_prices(catalog_dir, list(catalog.offers), tmp_path)
    mismatches = []
    for o, row in zip(catalog.offers, result["offers"], strict=True):
        checks = [
            ("on-demand at zone", o.on_demand_price_usd_per_hour, row["on_demand_zone"], o.on_demand_zone),
            ("spot at zone", o.spot_price_usd_per_hour, row["spot_zone"], o.spot_zone),
            ("on-demand in region", o.on_demand_price_usd_per_hour, row["on_demand_region"], o.cloud != "gcp"),
            ("spot in region", o.spot_price_usd_per_hour, row["spot_region"], o.cloud != "gcp"),
        ]
        for what, ours, theirs, applies in checks:
            if applies and not same(ours, theirs):
                mismatches.append((o, what, ours, theirs))
    assert not mismatches, mismatches[:5]
    # The offers are exactly SkyPilot's list (GPUs skygreen knows, whole GPU counts), same prices.
    listed = {
        (r["cloud"], r["region"], r["instance_type"], r["accelerator"], int(r["accelerator_count"])): r
        for r in result["listed"]
        if r["accelerator"] in GPUS and float(r["accelerator_count"]).is_integer()
    }
    by_key = {(o.cloud, o.region, o.instance_type, o.accelerator, o.accelerator_count): o for o in catalog.offers}
    assert set(by_key) == set(listed)
    for key, o in by_key.items():
        assert same(o.on_demand_price_usd_per_hour, listed[key]["price"]), key
        assert same(o.spot_price_usd_per_hour, listed[key]["spot_price"]), key
    return len(by_key)


def test_every_price_equals_skypilots_on_the_fixture_catalog(tmp_path):
    assert check_against_skypilot(FIXTURE_CATALOG, tmp_path) == 15


def test_every_price_equals_skypilots_on_the_real_snapshot(shared_catalog_dir, tmp_path):
    assert check_against_skypilot(shared_catalog_dir, tmp_path) > 300
