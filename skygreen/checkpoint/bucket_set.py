"""A bucket per place: `checkpoint.buckets:` names one bucket per cloud or region, and a run
commits to the one nearest its VM.

    buckets: {aws: s3://team-ckpt, gcp: gs://team-ckpt, azure: az://account/team-ckpt}
    buckets: {us-east-1: s3://ckpt-use1, eu-west-1: s3://ckpt-euw1, gcp: gs://team-ckpt}

A key is a cloud (`aws`, `gcp`, `azure`) or a region of the bucket's cloud. The nearest bucket
to a VM is, in this order: the one keyed by the VM's region, the one keyed by its cloud, the
first listed in the VM's cloud, and else the first listed of all (the *home* bucket).

**How a set travels.** A run's record, its `SKYGREEN_BUCKET` and every URL joined under it carry
the whole set as one URL, `buckets://{aws=s3://team-ckpt;gcp=gs://team-ckpt}/RUN/...`: the
path after the braces is added to every member. So the run id, the ledger folder and the
prepared data join under a set exactly as under one bucket (`join_url`), and every command
that opens a run's folder (`status`, `cost`, `cost --all`, `report`, `gc`, the runtime) opens
the set through `skygreen.checkpoint.store_factory.open_store` and reads all of its members
(`skygreen.checkpoint.set_store`).

Pure: no store is opened here and no outside library is imported, so the plan reads a set
without the store seam.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from skygreen.errors import SpecError

T = TypeVar("T")

SET_SCHEME = "buckets"
"""The scheme of a set's URL: `buckets://{KEY=URL;KEY=URL}/PATH`."""
CLOUD_KEYS: tuple[str, ...] = ("aws", "gcp", "azure")
_URL_CLOUD = {"s3": "aws", "gs": "gcp", "az": "azure"}
_CLUSTER_INFO_ENV = "SKYPILOT_CLUSTER_INFO"


@dataclass(frozen=True, kw_only=True, slots=True)
class Member:
    """One bucket of a set: its key (a cloud or a region) and its URL (the set's path added)."""

    key: str
    url: str

    @property
    def cloud(self) -> str:
        """The bucket's cloud, from its URL's scheme."""
        return _URL_CLOUD[self.url.partition("://")[0]]

    @property
    def region(self) -> str | None:
        """The region its key names; None for a cloud key."""
        return None if self.key in CLOUD_KEYS else self.key


def is_set_url(url: str | None) -> bool:
    """Whether `url` is a bucket set's URL (`buckets://{...}`)."""
    return bool(url) and str(url).startswith(f"{SET_SCHEME}://{{")


def set_url(members: Sequence[Member]) -> str:
    """The one URL that carries the set, members in their order (the first is the home bucket)."""
    return f"{SET_SCHEME}://{{" + ";".join(f"{m.key}={m.url}" for m in members) + "}"


def split_set_url(url: str, *, field: str = "checkpoint.buckets") -> tuple[str, str]:
    """`buckets://{BODY}/PATH` -> (BODY, PATH without its slashes).

    Raises:
        SpecError: not a set URL, or no closing brace.
    """
    head = f"{SET_SCHEME}://{{"
    body, sep, path = url[len(head) :].partition("}") if url.startswith(head) else ("", "", "")
    if not sep or not body:
        raise SpecError(field, "not a bucket set URL", value=url, hint=f"write {head}KEY=URL;KEY=URL}}/PREFIX")
    return body, path.strip("/")


def members(url: str) -> tuple[Member, ...]:
    """The set's buckets, each with the set URL's path added to its own.

    Raises:
        SpecError: a malformed set URL.
    """
    body, path = split_set_url(url)
    out = []
    for item in body.split(";"):
        key, sep, member_url = item.partition("=")
        if not sep or "://" not in member_url or member_url.partition("://")[0] not in _URL_CLOUD:
            raise SpecError("checkpoint.buckets", f"a set member is not KEY=URL of a cloud bucket: {item!r}", value=url,
                            hint="write checkpoint.buckets as a mapping, e.g. {aws: s3://team-ckpt, gcp: gs://team-ckpt}")  # fmt: skip
        out.append(Member(key=key, url=member_url.rstrip("/") + (f"/{path}" if path else "")))
    return tuple(out)


def nearest(found: Sequence[Member], *, cloud: str | None, region: str | None) -> Member:
    """The bucket a VM in (`cloud`, `region`) commits to: keyed by its region, else by its cloud,
    else the first of its cloud, else the home bucket (the first listed; also where `cloud` is
    unknown, as on a laptop)."""
    if not found:
        raise ValueError("a bucket set has at least one bucket")
    if region:
        for m in found:
            if m.region == region.lower() and (cloud is None or m.cloud == cloud):
                return m
    if cloud:
        for m in found:
            if m.key == cloud:
                return m
        for m in found:
            if m.cloud == cloud:
                return m
    return found[0]


def bucket_first(found: Sequence[Member], launches: Sequence[T], where: Callable[[T], tuple[str, str]]) -> list[T]:
    """The launch list of a run on a bucket set: the first entry (the pick), then the entries
    its own bucket is nearest to, then the rest, each group in the plan's order.

    SkyPilot's `EAGER_NEXT_REGION` relaunches a preempted job at the first entry outside the
    preempted cloud and region; listing the pick's bucket's places first keeps a recovery within
    that bucket's reach wherever the list allows, so a move copies no checkpoint.

    Args:
        found: the set's buckets (`members`).
        launches: the entries, best first.
        where: an entry's (cloud, region).
    """
    if not launches:
        return []
    home = nearest(found, cloud=where(launches[0])[0], region=where(launches[0])[1])
    same = [e for e in launches if nearest(found, cloud=where(e)[0], region=where(e)[1]) == home]
    return same + [e for e in launches if e not in same]


def place_from_env(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """Where this process runs, as SkyPilot tells a managed job (`SKYPILOT_CLUSTER_INFO`, JSON
    with `cloud` and `region`; the same variable the ledger reads in `skygreen.ledger.place`),
    else the place a nomad watcher pinned a local life to (`SKYGREEN_PLACE`,
    `cloud/region[/zone]`), else `SKYGREEN_CLOUD` (a run pinned to one cloud); (None, None) on
    a laptop."""
    try:
        info = json.loads(environ.get(_CLUSTER_INFO_ENV) or "{}")
    except ValueError:
        info = {}
    info = info if isinstance(info, dict) else {}
    pinned = (environ.get("SKYGREEN_PLACE") or "").lower().split("/")
    cloud = str(info.get("cloud") or pinned[0] or environ.get("SKYGREEN_CLOUD") or "").lower() or None
    region = str(info.get("region") or (pinned[1] if len(pinned) > 1 and not info else "")).lower() or None
    return cloud, region


def nearest_url(url: str, environ: Mapping[str, str]) -> str:
    """The member a process in `environ` commits to; `url` itself when it is a single bucket."""
    if not is_set_url(url):
        return url
    cloud, region = place_from_env(environ)
    return nearest(members(url), cloud=cloud, region=region).url


def home_url(url: str) -> str:
    """The home bucket's URL (the first listed) for a set, where the writer lease lives and whose
    prices stand for the set's storage; `url` itself for one bucket."""
    return members(url)[0].url if is_set_url(url) else url


def member_schemes(url: str) -> tuple[str, ...]:
    """The URL schemes a bucket (or every bucket of a set) needs a client for, each once."""
    urls = [m.url for m in members(url)] if is_set_url(url) else [url]
    return tuple(dict.fromkeys(u.partition("://")[0] if "://" in u else "file" for u in urls))


def stated_regions(url: str) -> dict[str, str | None]:
    """For a set, each bucket (`scheme://bucket`, as the ledger counts bytes under it) -> the region
    its key names (None for a cloud key); {} for one bucket."""
    if not is_set_url(url):
        return {}
    out: dict[str, str | None] = {}
    for m in members(url):
        scheme, _, rest = m.url.partition("://")
        bucket = "/".join(rest.split("/")[:2]) if scheme == "az" else rest.split("/", 1)[0]
        out.setdefault(f"{scheme}://{bucket}", m.region)
    return out
