"""SkyPilot's own prices for a list of offers, computed by `sky.catalog` (run as a subprocess).

Run with HOME pointing at a private home whose `.sky/catalogs/v8/<cloud>/vms.csv` was seeded
without `.meta/*.md5` files, so SkyPilot treats the files as user-made and never downloads.
Reads a JSON list of offers on stdin; writes {"offers": [...], "listed": [...]} on stdout:
for each offer, SkyPilot's price at the region and at the offer's zone, and every
(cloud, region, instance type, GPU, count) row of `sky.catalog.list_accelerators`.
"""

from __future__ import annotations

import json
import math
import sys


def _price_or_none(fn, *args, **kwargs):
    try:
        value = fn(*args, **kwargs)
    except ValueError:  # SkyPilot: "No SpotPrice found for instance type ..."
        return None
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _sky_price(catalog, offer: dict, spot: bool, zone: str | None):
    cloud, region = offer["cloud"], offer["region"]
    if cloud == "gcp":
        host = _price_or_none(catalog.get_hourly_cost, offer["instance_type"], spot, region, zone, clouds="gcp")
        gpu = _price_or_none(
            catalog.get_accelerator_hourly_cost,
            offer["accelerator"],
            offer["accelerator_count"],
            spot,
            region,
            zone,
            clouds="gcp",
        )
        return None if host is None or gpu is None else host + gpu
    return _price_or_none(catalog.get_hourly_cost, offer["instance_type"], spot, region, zone, clouds=cloud)


def main() -> None:
    offers = json.load(sys.stdin)
    from sky import catalog

    out = []
    for offer in offers:
        row = {"key": offer["key"]}
        for spot, zone_key in ((False, "on_demand_zone"), (True, "spot_zone")):
            name = "spot" if spot else "on_demand"
            zone = offer[zone_key]
            if offer["cloud"] == "gcp":
                # GCP prices a VM as host + GPU of one zone; without a zone the two minimums
                # could come from different zones, which no launch would pay.
                row[f"{name}_region"] = None
            else:
                row[f"{name}_region"] = _sky_price(catalog, offer, spot, None)
            row[f"{name}_zone"] = _sky_price(catalog, offer, spot, zone) if zone is not None else None
        out.append(row)
    listed = []
    for items in catalog.list_accelerators(gpus_only=True, clouds=["aws", "gcp", "azure"], all_regions=True).values():
        for info in items:
            listed.append(
                {
                    "cloud": info.cloud.lower(),
                    "region": info.region,
                    "instance_type": info.instance_type,
                    "accelerator": info.accelerator_name,
                    "accelerator_count": float(info.accelerator_count),
                    "price": None if math.isnan(info.price) else float(info.price),
                    "spot_price": None if math.isnan(info.spot_price) else float(info.spot_price),
                }
            )
    json.dump({"offers": out, "listed": listed}, sys.stdout)


if __name__ == "__main__":
    main()
