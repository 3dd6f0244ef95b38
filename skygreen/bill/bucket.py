"""Where a checkpoint bucket is: its cloud (from the URL) and its region (stated, read, or assumed).

The region comes, in this order of trust, from the bucket itself (S3 `GetBucketLocation`, GCS
bucket metadata, read by `skygreen.checkpoint.bucket_region` when credentials allow), from the
task (`checkpoint: {bucket: ..., region: us-east-1}`), or, when neither says, from the cloud's
default region (`rates.DEFAULT_REGION`), which the plan then names in a note. A stated region
that contradicts the bucket (a region of another cloud, or not the one the bucket reports) is an
error: pricing the wrong place would mislead every figure after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from skygreen.bill.rates import CLOUDS, DEFAULT_REGION, Place, load_rates
from skygreen.errors import SpecError

SCHEME_CLOUD = {"s3": "aws", "gs": "gcp", "az": "azure"}
HOW = ("read", "stated", "assumed")
_REGION_FIELD = "skygreen.checkpoint.region"


@dataclass(frozen=True, kw_only=True, slots=True)
class BucketPlace:
    """A bucket's place and how it is known: "read" from the bucket, "stated" by the task, or
    "assumed" (the cloud's default region)."""

    place: Place
    how: str

    @property
    def note(self) -> str:
        """The plan's note when the region is assumed; "" otherwise."""
        if self.how != "assumed":
            return ""
        return (
            f"the checkpoint bucket's region is unknown: assumed {self.place.region}, {self.place.cloud}'s default; "
            f"set skygreen.checkpoint.region to price transfers from where it really is"
        )


def bucket_cloud(url: str | None) -> str | None:
    """The cloud a bucket URL names (`s3://` aws, `gs://` gcp, `az://` or `*.blob.core.windows.net`
    azure); None for a local bucket or none."""
    if not url:
        return None
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    if scheme == "https" and ".blob.core.windows.net" in rest.split("/", 1)[0]:
        return "azure"
    return SCHEME_CLOUD.get(scheme)


def normalise_region(cloud: str, region: str) -> str:
    """A region as the catalog spells it: lower case; S3's empty answer and legacy "EU" mapped."""
    region = region.strip().lower()
    if cloud == "aws" and region in ("", "none"):
        return "us-east-1"  # GetBucketLocation answers no constraint for us-east-1
    if cloud == "aws" and region == "eu":
        return "eu-west-1"
    return region


def check_region(url: str | None, region: str, *, source: str | None = None) -> str:
    """The task's `checkpoint.region`, normalised; a `SpecError` when the bucket is local (a
    region means nothing there) or the region belongs to another cloud only."""
    cloud = bucket_cloud(url)
    if cloud is None:
        raise SpecError(
            _REGION_FIELD,
            "only means something for a cloud bucket (s3://, gs://, az://)",
            value=region,
            hint="remove checkpoint.region, or set checkpoint.bucket to the cloud bucket it describes",
            source=source,
        )
    region = normalise_region(cloud, region)
    known = load_rates().continents
    owners = sorted(c for c in CLOUDS if (c, region) in known)
    if owners and cloud not in owners:
        mine = sorted(r for c, r in known if c == cloud)
        raise SpecError(
            _REGION_FIELD,
            f"is a region of {', '.join(owners)}, but the bucket {url} is in {cloud}",
            value=region,
            allowed=", ".join(mine[:12]) + ", ...",
            hint=f"state the {cloud} region the bucket was created in (e.g. {DEFAULT_REGION[cloud]})",
            source=source,
        )
    return region


def bucket_place(
    url: str | None, *, stated_region: str | None = None, read_region: str | None = None, source: str | None = None
) -> BucketPlace | None:
    """Where the bucket is; None for a local bucket (no cloud, no data bill).

    Raises:
        SpecError: the stated region is not the one the bucket reports.
    """
    cloud = bucket_cloud(url)
    if cloud is None:
        return None
    read = normalise_region(cloud, read_region) if read_region is not None else None
    stated = normalise_region(cloud, stated_region) if stated_region is not None else None
    if read is not None and stated is not None and read != stated:
        raise SpecError(
            _REGION_FIELD,
            f"says the bucket {url} is in {stated}, but the bucket reports {read}",
            value=stated,
            hint=f"set region: {read} (or remove it: skygreen reads it from the bucket)",
            source=source,
        )
    if read is not None:
        return BucketPlace(place=Place(cloud=cloud, region=read), how="read")
    if stated is not None:
        return BucketPlace(place=Place(cloud=cloud, region=stated), how="stated")
    return BucketPlace(place=Place(cloud=cloud, region=DEFAULT_REGION[cloud]), how="assumed")
