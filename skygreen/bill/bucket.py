"""Where a checkpoint bucket is: its cloud (from the URL) and its region (stated, read, or assumed).

The region comes, in this order of trust, from the bucket itself (S3 `GetBucketLocation`, GCS
bucket metadata, read by `skygreen.checkpoint.bucket_region` when credentials allow), from the
task (`checkpoint: {bucket: ..., region: us-east-1}`), or, when neither says, from the cloud's
default region (`rates.DEFAULT_REGION`), which the plan then names in a note. A stated region
that contradicts the bucket (a region of another cloud, or not the one the bucket reports) is an
error: pricing the wrong place would mislead every figure after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


def check_buckets(raw: Mapping[str, Any], path: str, *, source: str | None = None) -> str:
    """The task's `checkpoint.buckets:` (one bucket per cloud or region) as the set's URL
    (`skygreen.checkpoint.bucket_set.set_url`), members in the order written.

    A key is a cloud (`aws`, `gcp`, `azure`) or a region of its bucket's cloud; each bucket is a
    cloud bucket of the key's cloud.

    Raises:
        SpecError: an empty set, a key that is no cloud or region, a key of another cloud than its
            bucket, a bucket that is not a cloud bucket, or a key given twice; naming the key.
    """
    from skygreen.checkpoint.bucket_set import Member, set_url
    from skygreen.checkpoint.bucket_url import canonical_url

    if not raw:
        raise SpecError(
            path, "names no bucket", value=dict(raw), hint="e.g. {aws: s3://team-ckpt, gcp: gs://team-ckpt}"
        )
    found: list[Member] = []
    for key, url in raw.items():
        field = f"{path}.{key}"
        name = str(key).strip().lower()
        if not isinstance(url, str):
            raise SpecError(field, "must be a bucket URL", value=url, hint="e.g. s3://team-ckpt/runs", source=source)
        url = canonical_url(url, field=field)
        cloud = bucket_cloud(url)
        if cloud is None:
            raise SpecError(
                field, "must be a cloud bucket (s3://, gs://, az://): a set moves checkpoints between places",
                value=url, hint="use checkpoint.bucket for a local directory", source=source,
            )  # fmt: skip
        name = _check_key(name, cloud, url, field, source)
        if any(m.key == name for m in found):
            raise SpecError(field, "names a place twice", value=key, hint="give each cloud or region one bucket")
        found.append(Member(key=name, url=url))
    return set_url(found)


def _check_key(key: str, cloud: str, url: str, field: str, source: str | None) -> str:
    """A set's key, normalised: the bucket's cloud or one of that cloud's regions."""
    if key in CLOUDS:
        if key != cloud:
            raise SpecError(
                field, f"is keyed {key}, but the bucket {url} is in {cloud}", value=key,
                hint=f"key it {cloud} (or by its {cloud} region)", source=source,
            )  # fmt: skip
        return key
    region = normalise_region(cloud, key)
    owners = sorted(c for c in CLOUDS if (c, region) in load_rates().continents)
    if cloud in owners:
        return region
    problem = (
        f"is a region of {', '.join(owners)}, but the bucket {url} is in {cloud}"
        if owners
        else "is neither a cloud nor a region skygreen knows"
    )
    raise SpecError(
        field, problem, value=key, allowed=f"{', '.join(CLOUDS)}, or a region of the bucket's cloud",
        hint=f"key the bucket by its cloud ({cloud}) or the {cloud} region it was created in", source=source,
    )  # fmt: skip
