"""Per-GB rates for moving a checkpoint between places: the one entry point places use.

The figures are the providers' published list prices (US source regions, 2025-2026), as
collected in the project's research notes on egress:
- AWS, between regions: $0.02/GB, $0.01/GB for us-east-1 <-> us-east-2
  (https://aws.amazon.com/ec2/pricing/on-demand/, "Data Transfer"); between continents
  $0.02-0.147/GB by source region: $0.08/GB taken here for any pair with an Asia side
  (the AWS table SkyNomad ships gives $0.08/GB for Asia <-> Asia and most pairs to Asia).
- GCP, between regions of one continent: $0.02/GB (Cloud Storage to another region,
  https://cloud.google.com/storage/pricing#network-buckets); between continents $0.05-0.15/GB:
  $0.08/GB taken here (estimated: a mid value of that range).
- Azure, between regions of North America: $0.02/GB; between continents $0.05/GB
  (https://azure.microsoft.com/pricing/details/bandwidth/).
- Across clouds the sending side pays its internet egress (first tier): AWS $0.09/GB, GCP
  Premium $0.12/GB, Azure $0.087/GB.
- The same region (a bucket in the region of the VM): free. Zones of one region read the
  region's bucket: free.

The whole-bill rate table is the place these figures should live; until it does, every user
of a move rate calls `egress_usd_per_gb` here, so the switch is one import. A live move
(`skygreen.places.live`, `skygreen.places.journey`) is already priced with the whole bill's
rates, by `bill_egress_usd`.
"""

from __future__ import annotations

from skygreen.places.place import Place

SAME_CONTINENT_USD_PER_GB = {"aws": 0.02, "gcp": 0.02, "azure": 0.02}
CROSS_CONTINENT_USD_PER_GB = {"aws": 0.08, "gcp": 0.08, "azure": 0.05}
INTERNET_USD_PER_GB = {"aws": 0.09, "gcp": 0.12, "azure": 0.087}
_CHEAP_PAIRS = {frozenset({"us-east-1", "us-east-2"}): 0.01}
_CONTINENTS = (
    ("northamerica", "na"),
    ("southamerica", "sa"),
    ("us-", "na"),
    ("ca-", "na"),
    ("europe", "eu"),
    ("eu-", "eu"),
    ("uk", "eu"),
    ("asia", "asia"),
    ("ap-", "asia"),
    ("me-", "asia"),
    ("sa-", "sa"),
    ("australia", "oc"),
    ("af-", "af"),
    ("africa", "af"),
    ("il-", "asia"),
    ("mx-", "na"),
)


def continent(region: str) -> str:
    """The continent a region name belongs to ('na', 'eu', 'asia', ...; '?' when unknown)."""
    name = region.lower()
    for prefix, where in _CONTINENTS:
        if name.startswith(prefix):
            return where
    for word, where in (("east", "na"), ("west", "na"), ("central", "na")):  # Azure: eastus, westus2 ...
        if word in name and "europe" not in name and "asia" not in name:
            return where
    return "?"


def egress_usd_per_gb(src: Place, dst: Place) -> float:
    """USD per GB to bring a checkpoint saved in `src`'s region to `dst` (0 within one region)."""
    if src.cloud != dst.cloud:
        return INTERNET_USD_PER_GB.get(src.cloud, 0.12)
    if src.region == dst.region:
        return 0.0
    pair = frozenset({src.region, dst.region})
    if src.cloud == "aws" and pair in _CHEAP_PAIRS:
        return _CHEAP_PAIRS[pair]
    a, b = continent(src.region), continent(dst.region)
    if a == b and a != "?" and a != "asia":
        return SAME_CONTINENT_USD_PER_GB.get(src.cloud, 0.02)
    return CROSS_CONTINENT_USD_PER_GB.get(src.cloud, 0.08)


def bill_egress_usd(src: Place, dst: Place, gb: float) -> float:
    """Dollars to bring `gb` of checkpoint from `src`'s region to `dst`: the whole bill's transfer
    rate (`skygreen.bill.rates`), paid by the sender; 0 within one region."""
    from skygreen.bill.rates import CLOUDS, transfer_usd
    from skygreen.bill.rates import Place as BillPlace

    if src.cloud not in CLOUDS or dst.cloud not in CLOUDS:
        return gb * egress_usd_per_gb(src, dst)
    return transfer_usd(
        BillPlace(cloud=src.cloud, region=src.region), BillPlace(cloud=dst.cloud, region=dst.region), gb
    )
