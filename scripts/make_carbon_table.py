"""Regenerate skygreen/data/carbon_intensity.csv from the codecarbon package's data files.

    python scripts/make_carbon_table.py /path/to/site-packages/codecarbon/data > skygreen/data/carbon_intensity.csv

GCP regions use codecarbon's cloud/impact.csv (Google's own per-region grid figures). AWS and
Azure publish no per-region figure there, so their regions use the average of the country they
are in (codecarbon's private_infra/global_energy_mix.json, from Our World in Data / Ember).
codecarbon is only read here, once; it is not a dependency of skygreen.
"""

from __future__ import annotations

import csv
import datetime
import json
import sys
from pathlib import Path

# Cloud region -> ISO 3166 alpha-3 country, for regions without a per-region figure.
REGION_COUNTRY: dict[str, dict[str, str]] = {
    "aws": {
        "us-east-1": "USA", "us-east-2": "USA", "us-west-1": "USA", "us-west-2": "USA",
        "ca-central-1": "CAN", "ca-west-1": "CAN", "sa-east-1": "BRA", "mx-central-1": "MEX",
        "eu-west-1": "IRL", "eu-west-2": "GBR", "eu-west-3": "FRA", "eu-central-1": "DEU",
        "eu-central-2": "CHE", "eu-north-1": "SWE", "eu-south-1": "ITA", "eu-south-2": "ESP",
        "af-south-1": "ZAF", "me-south-1": "BHR", "me-central-1": "ARE", "il-central-1": "ISR",
        "ap-east-1": "HKG", "ap-south-1": "IND", "ap-south-2": "IND", "ap-northeast-1": "JPN",
        "ap-northeast-2": "KOR", "ap-northeast-3": "JPN", "ap-southeast-1": "SGP",
        "ap-southeast-2": "AUS", "ap-southeast-3": "IDN", "ap-southeast-4": "AUS",
        "ap-southeast-5": "MYS", "ap-southeast-7": "THA",
    },
    "azure": {
        "eastus": "USA", "eastus2": "USA", "centralus": "USA", "northcentralus": "USA",
        "southcentralus": "USA", "westcentralus": "USA", "westus": "USA", "westus2": "USA",
        "westus3": "USA", "canadacentral": "CAN", "canadaeast": "CAN", "brazilsouth": "BRA",
        "northeurope": "IRL", "westeurope": "NLD", "uksouth": "GBR", "ukwest": "GBR",
        "francecentral": "FRA", "germanywestcentral": "DEU", "swedencentral": "SWE",
        "switzerlandnorth": "CHE", "norwayeast": "NOR", "polandcentral": "POL",
        "italynorth": "ITA", "spaincentral": "ESP", "eastasia": "HKG", "southeastasia": "SGP",
        "japaneast": "JPN", "japanwest": "JPN", "koreacentral": "KOR", "centralindia": "IND",
        "southindia": "IND", "australiaeast": "AUS", "australiasoutheast": "AUS",
        "uaenorth": "ARE", "qatarcentral": "QAT", "southafricanorth": "ZAF",
        "israelcentral": "ISR", "mexicocentral": "MEX",
    },
}  # fmt: skip


def main(data_dir: Path) -> None:
    mix = json.loads((data_dir / "private_infra" / "global_energy_mix.json").read_text())
    out = csv.writer(sys.stdout, lineterminator="\n")
    today = datetime.date.today().isoformat()
    print("# Grid carbon intensity per cloud region, grams CO2e per kWh.")
    print(f"# Generated {today} by scripts/make_carbon_table.py from the codecarbon package (v3.3.2) data:")
    print("#   gcp: codecarbon data/cloud/impact.csv, Google's per-region figures")
    print("#        (https://cloud.google.com/sustainability/region-carbon#data), basis=region;")
    print("#   aws, azure: the country average from codecarbon data/private_infra/global_energy_mix.json")
    print("#        (Our World in Data / Ember, the year in column `year`), basis=country.")
    out.writerow(["cloud", "region", "g_co2e_per_kwh", "basis", "country", "year"])
    with (data_dir / "cloud" / "impact.csv").open(encoding="utf-8-sig") as f:
        for row in csv.DictReader(f):
            if row["provider"] == "gcp":
                out.writerow(["gcp", row["region"], f"{float(row['impact']):.0f}", "region", row["countryIsoCode"], ""])
    for cloud, regions in REGION_COUNTRY.items():
        for region, country in regions.items():
            entry = mix[country]
            out.writerow([cloud, region, f"{entry['carbon_intensity']:.0f}", "country", country, entry["year"]])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
